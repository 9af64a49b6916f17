"""`python train.py demo` (what `make demo` runs): an offline demo on 2 CPU cores in which GRPO,
with the real grader, visibly raises the reward.

    python train.py demo [OUT_DIR]      # default grpo_runs/demo-learn; a rerun starts over
    python train.py demo OUT_DIR --set grpo_steps=30 --set temperature=0.6   # try another recipe

1. the learner model (ocaml_grpo/models/tiny.py, 441k parameters) is built once and cached;
2. `python train.py sft` full-fine-tunes it on the reference solutions of a few easy bundled
   problems (RECIPE.train_ids), holding RECIPE.heldout_ids out, and stops at partial memorisation
   (SFT_STOP_LOSS): some samples right, some wrong, so GRPO's groups have reward variance;
3. `python train.py` runs GRPO (LoRA, the real reward and sandbox) on the same problems;
4. the SFT-only model and the SFT+GRPO model are sampled the same way as GRPO samples (same
   temperature, completion budget, top-k off) on the training and the held-out problems, graded
   by the training grader, and compared side by side;
5. analyze.py writes its report and plots on the GRPO run.

The recipe below was tuned on a shared 2-core VM; every number it prints is measured in the run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ocaml_grpo.scoring import RewardScorer

from ocaml_grpo.models.loading import quiet_library_warnings
from ocaml_grpo.models import loading as models
from ocaml_grpo.models.tiny import ensure_learner_model, learner_model_dir
from ocaml_grpo.training.sampling import generate_hf, grade_completions
from ocaml_grpo.training.learning_log import parse_learning_log, series
from ocaml_grpo.problems import BUNDLED, load_problems, read_rows
from ocaml_grpo.prompting import chat_messages
from ocaml_grpo.config import RewardConfig
from ocaml_grpo.config.settings import cache_dir

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "train.py"


@dataclass(frozen=True)
class Recipe:
    """Everything the demo (and tests/test_learning.py, with fewer steps) runs with."""
    train_ids: tuple = ("p001_count_evens", "p003_first_nonempty")
    heldout_ids: tuple = ("p002_last_element", "p072_bst_inorder", "p014_list_max", "p021_sum_abs")
    # SFT: full fine-tune of the random model, stopped once the training loss says "partly memorised".
    sft_learning_rate: str = "3e-3"
    sft_stop_loss: str = "0.5"
    sft_max_steps: str = "120"
    # GRPO: every problem in every step with a large group, so each step's mean is over the same problems.
    grpo_steps: str = "20"
    generations: str = "12"
    temperature: str = "0.5"
    max_completion: str = "64"
    learning_rate: str = "2e-3"
    lora_r: str = "8"
    lora_alpha: str = "16"
    seed: str = "42"
    eval_samples: int = 48  # per training problem and model in the before/after table
    heldout_samples: int = 16  # per held-out problem and model

    @property
    def batch_size(self) -> str:
        return str(len(self.train_ids))


RECIPE = Recipe()
# Variables the demo sets itself; the caller's values (or an .envrc) must not change the recipe.
OWNED_PREFIXES = ("GRPO_", "SFT_", "LORA_", "REWARD_WEIGHT_", "REWARD_CURRICULUM")
OWNED_NAMES = ("BASE_MODEL_ID", "TRAINING_DATASET", "MIN_NON_EMPTY_LINES", "RUNAWAY_PENALTY_MULTIPLIER",
               "AUDIT_DATASET", "REWARD_END_MARKER")


def base_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWNED_PREFIXES) and k not in OWNED_NAMES}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", GRPO_REPORT_TO="none")
    # One torch thread unless the caller exports OMP_NUM_THREADS. Measured on the 2-core VM: with the cores
    # free, 2 threads ran the whole demo in 84 s against 93 s (same results); with two other jobs on the
    # cores, 2 threads made a training step of a model this size ~6x slower than 1 (threads spin-wait).
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def sft_env(recipe: Recipe, model_dir: Path, problems: Path, out: Path) -> dict:
    return {**base_env(), "GRPO_SEED": recipe.seed, "BASE_MODEL_ID": str(model_dir), "TRAINING_DATASET": str(problems),
            "SFT_OUTPUT_DIR": str(out), "SFT_LORA": "0", "SFT_HOLDOUT": ",".join(recipe.heldout_ids),
            "SFT_BATCH_SIZE": str(len(recipe.train_ids)), "SFT_LEARNING_RATE": recipe.sft_learning_rate,
            "SFT_LR_SCHEDULER": "constant", "SFT_MAX_STEPS": recipe.sft_max_steps, "SFT_STOP_LOSS": recipe.sft_stop_loss,
            "GRPO_MAX_COMPLETION": recipe.max_completion, "GRPO_MAX_PROMPT": "1024"}


def grpo_env(recipe: Recipe, sft_out: Path, out: Path) -> dict:
    return {**base_env(), "GRPO_SEED": recipe.seed, "BASE_MODEL_ID": str(sft_out / "final_model"),
            "TRAINING_DATASET": str(sft_out / "train_problems.jsonl"), "GRPO_OUTPUT_DIR": str(out),
            "GRPO_RESUME": "never", "GRPO_BATCH_SIZE": recipe.batch_size, "GRPO_NUM_GENERATIONS": recipe.generations,
            "GRPO_MAX_COMPLETION": recipe.max_completion, "GRPO_MAX_PROMPT": "1024",
            "GRPO_MAX_STEPS": recipe.grpo_steps, "GRPO_SAVE_STEPS": "1000", "GRPO_LEARNING_RATE": recipe.learning_rate,
            "GRPO_LR_SCHEDULER": "constant", "GRPO_TEMPERATURE": recipe.temperature, "LORA_R": recipe.lora_r,
            "LORA_ALPHA": recipe.lora_alpha, "GRPO_AUTO_STOP": "0"}


def write_problems(recipe: Recipe, path: Path) -> Path:
    wanted = set(recipe.train_ids) | set(recipe.heldout_ids)
    rows = [r for r in read_rows(BUNDLED) if r["id"] in wanted]
    missing = wanted - {r["id"] for r in rows}
    if missing:
        raise SystemExit(f"demo recipe names problems not in the bundled set: {sorted(missing)}")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_stage(name: str, args: list[str], env: dict, cwd: Path, log: Path, echo, tail: Path | None = None) -> float:
    """Run one command, its whole output in `log`; echo the lines `echo` picks, and new lines of `tail`."""
    print(f"\n== {name}: python {' '.join(args)}  (full output: {log})", flush=True)
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        stop = threading.Event()
        if tail is not None:
            threading.Thread(target=_tail, args=(tail, stop), daemon=True).start()
        later = []  # the command's closing line waits until the tail has shown the last log lines
        for line in proc.stdout:
            f.write(line)
            if echo(line):
                (later.append if tail is not None and line.startswith("done") else print)("   " + line.rstrip())
        rc = proc.wait()
        stop.set()
    if tail is not None:
        time.sleep(0.6)  # the tail thread's last poll
        if later:
            print("\n".join(later))
    if rc != 0:
        print("".join(log.read_text().splitlines(keepends=True)[-40:]), file=sys.stderr)
        raise SystemExit(f"demo: {name} failed (exit {rc}); see {log}")
    return time.time() - t0


def _tail(path: Path, stop: threading.Event) -> None:
    offset = 0
    while True:
        done = stop.is_set()
        if path.exists():
            with open(path) as f:
                f.seek(offset)
                chunk = f.read()
            whole = chunk[: chunk.rfind("\n") + 1]
            offset += len(whole.encode())
            for line in whole.splitlines():
                if not line.startswith("#"):
                    print("   " + line, flush=True)
        if done:
            return
        time.sleep(0.5)


def compare(models: dict[str, str], splits: dict[str, list], recipe: Recipe, seed: int = 0) -> dict:
    """{model: {split: metrics}}: every model sampled identically and graded like training."""
    config = RewardConfig()  # the defaults, as in the training runs (base_env drops the caller's reward settings)
    scorer = RewardScorer(replace(config, min_lines=0))
    results: dict = {}
    try:
        for name, model_dir in models.items():
            for split, problems in splits.items():
                n = recipe.eval_samples if split == "training" else recipe.heldout_samples
                # sampled as TRL's GRPO samples: the training temperature, top-k off, top-p 1
                texts, lens = generate_hf(model_dir, None, [chat_messages(p.prompt) for p in problems], n,
                                          int(recipe.max_completion), float(recipe.temperature), len(problems), seed,
                                          top_k=0, progress=False)
                core, rows = grade_completions(problems, texts, lens, 1, int(recipe.max_completion), scorer,
                                               config.min_lines)
                results.setdefault(name, {})[split] = {
                    "mean_reward": core["mean_reward"], **core["rates"],
                    "assertions": sum(r["tests_passed"] for r in rows) / max(1, sum(r["tests_total"] for r in rows)),
                    "completions": len(rows)}
    finally:
        scorer.close()
    return results


def table(results: dict, splits: dict[str, list]) -> str:
    names = list(results)
    lines = ["| problems | model | mean reward | END marker | type-checks | all tests pass | assertions passed |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for split, problems in splits.items():
        for name in names:
            m = results[name][split]
            lines.append(f"| {split} ({len(problems)} problems, {m['completions']} samples) | {name} | {m['mean_reward']:.3f} | "
                         f"{m['has_end_marker']:.0%} | {m['compiled']:.0%} | {m['solved']:.0%} | {m['assertions']:.0%} |")
    return "\n".join(lines)


def learning_log_rewards(run: Path) -> list[float]:
    return series(parse_learning_log(run / "learning.log")[1], "reward")


def main(argv: list[str]) -> int:
    """`python train.py demo`."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    recipe, positional = RECIPE, []
    while argv:
        arg, argv = argv[0], argv[1:]
        if arg == "--set" and argv and "=" in argv[0] and argv[0].split("=")[0] in Recipe.__dataclass_fields__:
            key, value = argv[0].split("=", 1)
            kind = Recipe.__dataclass_fields__[key].type
            recipe = replace(recipe, **{key: tuple(value.split(",")) if kind == "tuple" else
                                        int(value) if kind == "int" else value})
            argv = argv[1:]
        elif not arg.startswith("-") and not positional:
            positional.append(arg)
        else:
            print("usage: python train.py demo [OUT_DIR] [--set FIELD=VALUE ...]  (fields: "
                  + ", ".join(Recipe.__dataclass_fields__) + ")", file=sys.stderr)
            return 2
    t_start = time.time()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing comes from the hub: every model here is local
    out = Path(positional[0] if positional else "grpo_runs/demo-learn").resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # this process samples too (before/after table)
    print(f"demo: SFT warm start then GRPO on {len(recipe.train_ids)} bundled problems "
          f"({', '.join(recipe.train_ids)}); held out: {', '.join(recipe.heldout_ids)}; output in {out}")
    model_dir = ensure_learner_model(learner_model_dir(cache_dir(os.environ)))
    problems = write_problems(recipe, out / "problems.jsonl")
    sft_out, grpo_out = out / "sft", out / "grpo"
    t_sft = run_stage("SFT warm start", [str(TRAIN), "sft"], sft_env(recipe, model_dir, problems, sft_out), out,
                      out / "sft.out", echo=lambda l: l.startswith(("[SFT", "sft data", "sft done", "held-out")))
    t_grpo = run_stage("GRPO with the real grader", [str(TRAIN)], grpo_env(recipe, sft_out, grpo_out), out,
                       out / "grpo.out", echo=lambda l: l.startswith(("reward grader:", "done in", "warning")),
                       tail=grpo_out / "learning.log")

    rewards = learning_log_rewards(grpo_out)
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"\nlearning.log: mean reward of the first 5 steps {first:.3f}, of the last 5 {last:.3f} "
          f"({last - first:+.3f})")

    print("\n== before/after: the SFT-only and the SFT+GRPO model, sampled as GRPO samples, graded by the training grader")
    t0 = time.time()
    splits = {"training": load_problems(str(sft_out / "train_problems.jsonl")),
              "held-out": load_problems(str(sft_out / "heldout_problems.jsonl"))}
    quiet_library_warnings()
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    results = compare({"SFT only": str(sft_out / "final_model"), "SFT + GRPO": merge_adapter(grpo_out)}, splits, recipe)
    t_eval = time.time() - t0
    text = table(results, splits)
    print(text)
    summary = {"learning_log": {"first5": first, "last5": last, "rewards": rewards}, "table": results,
               "seconds": {"sft": t_sft, "grpo": t_grpo, "eval": t_eval}}
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "before_after.md").write_text(text + "\n")

    print(f"\n== analyze.py {grpo_out}", flush=True)
    subprocess.run([sys.executable, str(TRAIN.parent / "analyze.py"), str(grpo_out)], check=True)
    total = time.time() - t_start
    print(f"\ndemo done in {total:.0f}s (SFT {t_sft:.0f}s, GRPO {t_grpo:.0f}s, before/after {t_eval:.0f}s); "
          f"table: {out / 'before_after.md'}; curves: {grpo_out / 'plots' / 'training_curves.png'}")
    return 0


def merge_adapter(grpo_out: Path) -> str:
    """The GRPO adapter folded into its base (fp32, as the SFT model was saved), so both models
    load the same way."""
    return str(models.merge_adapter(grpo_out / "final_adapter", grpo_out / "merged", fp32=True))
