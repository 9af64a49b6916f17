"""What GRPO does to a real pretrained model on problems it never saw: base, SFT only and SFT + GRPO,
sampled and graded the same way, on a fixed held-out split of the bundled problems.

    make model && python -m bench.bench_real --json bench/results/real_model.json    # ~75 min on 2 quiet cores
    python -m bench.bench_real --grpo-steps 16 --grpo-lr 1e-3 --json real-2.json      # another GRPO recipe: ~40 min
                                                                                       # (base and SFT come from the cache)
    python -m bench.bench_real --sft-steps 36 --grpo-steps 24 --grpo-temperature 0.5 \
        --json bench/results/real_model_attempt6.json                                  # attempt 6: ~63 min

1. Split, once (--seed): HELDOUT problems stratified by difficulty that neither SFT nor GRPO sees;
   the rest is the training split. Problems whose reference solution does not fit the completion
   budget are left out of both (SFT could not train on them; the budget is the reference
   solutions' 95th percentile of tokens, rounded up to 32).
2. base: the model as installed, evaluated once; the result is cached by everything it depends on
   (model file, problems, sampling, reward), so a rerun skips it.
3. SFT only: `train.py sft` with LoRA on the training split's reference solutions.
4. The probe a user runs before GRPO (`evaluate.py --probe`) on a sample of the training split
   (--pool problems), sampled exactly as the evaluation samples: it is also the SFT model's
   training-split evaluation.
5. SFT + GRPO: `train.py` from the SFT adapter on the probed pool, with the probe's selection
   (GRPO_PROBLEM_STATS) and problem tracking (on by default).
6. Every model is sampled k times per problem with the training prompt, the same temperature
   (--temperature; GRPO samples its groups at --grpo-temperature, by default the same), top-k
   off and the same completion budget, every answer stopped at the END marker (GRPO_STOP_AT_END=1 in
   every stage), and graded by the training grader. The held-out gain of
   SFT + GRPO over SFT only is the mean over problems of the per-problem difference of mean rewards,
   with a 95% bootstrap interval over problems (paired: both models on the same problems).

All three use the prompt without worked examples (GRPO_PROMPT_EXAMPLES=0): the examples are ~430
of a ~730-token prompt, and on 2 cores the prompt's tokens are most of what sampling and training
cost; after SFT the model needs none of them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path

from bench import fresh_run_dir
from ocaml_grpo.training.models import quiet_library_warnings
from ocaml_grpo.config import RewardConfig
from ocaml_grpo.config.isolation import SandboxConfig
from ocaml_grpo.config.settings import cache_dir, from_env
from ocaml_grpo.jsonl import read_jsonl
from ocaml_grpo.problems import BUNDLED, Problem, load_problems
from ocaml_grpo.prompting import answer_text, chat_messages
from ocaml_grpo.training import demo
from ocaml_grpo.training.named_models import gguf_path, resolve_model
from ocaml_grpo.training.sampling import generate_hf, grade_completions

MARK = ".bench_real"
EXAMPLES = 0  # GRPO_PROMPT_EXAMPLES of every stage (the module's docstring says why)
RESULTS = ("train_pass", "heldout_pass", "train_reward", "heldout_reward", "heldout_compiled")


def stratified_split(problems: list[Problem], n: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held out): `n` problems held out, each difficulty in proportion to its share."""
    by_level: dict[str, list[Problem]] = defaultdict(list)
    for p in sorted(problems, key=lambda p: p.id):
        by_level[p.difficulty or "unknown"].append(p)
    rng = random.Random(seed)
    quota = {d: n * len(ps) / len(problems) for d, ps in by_level.items()}
    counts = {d: math.floor(q) for d, q in quota.items()}
    for d in sorted(quota, key=lambda d: quota[d] - counts[d], reverse=True)[: n - sum(counts.values())]:
        counts[d] += 1  # the largest remainders take the seats rounding left
    held = {p.id for d, ps in by_level.items() for p in rng.sample(ps, counts[d])}
    return [p for p in problems if p.id not in held], [p for p in problems if p.id in held]


def write(path: Path, problems: list[Problem]) -> Path:
    path.write_text("".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in problems), encoding="utf-8")
    return path


def prepare(a, tokenizer) -> tuple[list[Problem], list[Problem], list[Problem], list[Problem], dict]:
    """(problems with a solution, training split, held-out split, GRPO pool, what the cached
    stages depend on), and `a.budget` set from the reference solutions when it is 0."""
    problems = [p for p in load_problems(BUNDLED) if p.solution.strip()]
    # +1: the end of turn the model must emit too
    lengths = {p.id: len(tokenizer(answer_text(p.solution), add_special_tokens=False)["input_ids"]) + 1 for p in problems}
    ordered = sorted(lengths.values())
    a.budget = a.budget or 32 * math.ceil(ordered[int(0.95 * len(ordered))] / 32)
    train, held = stratified_split([p for p in problems if lengths[p.id] <= a.budget], a.heldout, a.seed)
    pool = random.Random(a.seed).sample(train, min(a.pool, len(train)))
    source = gguf_path(a.model)
    # a GGUF file by its path and size; a model folder by its weights' modification times
    model = ([str(source), source.stat().st_size] if source else
             [a.model, *(w.stat().st_mtime_ns for w in sorted(Path(a.model).glob("*.safetensors")))])
    inputs = {"model": model, "held": [p.id for p in held],
              "pool": [p.id for p in pool], "k": a.k, "budget": a.budget, "temperature": a.temperature,
              "seed": a.seed, "reward": asdict(RewardConfig()), "prompt": chat_messages("x", EXAMPLES),
              "stop_at_end": True}
    return problems, train, held, pool, inputs


def stage_folder(inputs: dict, name: str, **more) -> Path:
    """Where a stage's results are cached: named by a hash of everything they depend on."""
    key = hashlib.sha256(json.dumps({**inputs, **more}, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_dir(os.environ) / "bench_real" / f"{name}-{key}"


def evaluate(model: str, adapter: str | None, problems: list[Problem], a, make_scorer,
             completions: Path) -> tuple[dict, dict]:
    """(metrics, per-problem mean training reward) of `model` (+ `adapter`), sampled as GRPO samples;
    every graded completion goes to `completions` (evaluate.py's completions.jsonl rows)."""
    texts, lens = generate_hf(model, adapter, [chat_messages(p.prompt, EXAMPLES) for p in problems], a.k, a.budget,
                              a.temperature, a.batch_problems, a.seed, top_k=0, progress=False, stop_at_end=True)
    # the reward's defaults, as in the training runs (base_env drops the caller's reward settings); the
    # sandbox's from the environment, as train.py reads them (OCAML_TOOLCHAIN_DIR of the offline bundle)
    config = replace(RewardConfig(), sandbox=from_env(SandboxConfig, os.environ))
    scorer = make_scorer(replace(config, min_lines=0))
    try:
        core, rows = grade_completions(problems, texts, lens, 1, a.budget, scorer, config.min_lines)
    finally:
        scorer.close()
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    per_problem: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        per_problem[r["problem_id"]].append(r["train_reward"])
    return ({"pass": core["pass@1"], "reward": core["mean_reward"], "compiled": core["rates"]["compiled"],
             "end_marker": core["rates"]["has_end_marker"]},
            {pid: sum(v) / len(v) for pid, v in per_problem.items()})


def bootstrap_ci(diffs: list[float], seed: int, n: int = 10000) -> list[float]:
    """The 95% percentile interval of the mean of `diffs`, resampling problems."""
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(n))
    return [means[int(0.025 * n)], means[int(0.975 * n) - 1]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a named model, a .gguf file or a model folder")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--out", default="grpo_runs/bench-real", help="working directory (a rerun starts it over)")
    ap.add_argument("--seed", type=int, default=0, help="the split's, the sampling's and the runs' seed")
    ap.add_argument("--heldout", type=int, default=24, help="held-out problems (stratified by difficulty)")
    ap.add_argument("--pool", type=int, default=16, help="training problems probed, trained on by GRPO and evaluated")
    ap.add_argument("--k", type=int, default=4, help="samples per problem and model (pass@1 = solved share), and GRPO's group size")
    ap.add_argument("--temperature", type=float, default=0.8, help="every evaluation's (and the probe's) temperature")
    ap.add_argument("--grpo-temperature", type=float, default=None,
                    help="GRPO_TEMPERATURE of the GRPO run (default: --temperature); evaluations keep --temperature")
    ap.add_argument("--budget", type=int, default=0, help="completion tokens (0: from the reference solutions)")
    ap.add_argument("--batch-problems", type=int, default=4, help="problems per generate() call in evaluations")
    ap.add_argument("--sft-steps", default="12", help="SFT optimizer steps of 8 examples (SFT_MAX_STEPS)")
    ap.add_argument("--sft-lr", default="5e-4")
    ap.add_argument("--grpo-steps", type=int, default=12)
    ap.add_argument("--grpo-prompts", type=int, default=2,
                    help="prompts per GRPO step: one per backward pass (GRPO_GRAD_ACCUM_STEPS), to fit 24 GB")
    ap.add_argument("--grpo-lr", default="2e-4")
    ap.add_argument("--min-std", default="0.01", help="GRPO_LEARNABLE_MIN_STD for the probe's selection")
    a = ap.parse_args(argv)
    t_start = time.time()
    os.environ.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", TRL_EXPERIMENTAL_SILENCE="1")
    os.environ.setdefault("OMP_NUM_THREADS", str(min(4, os.cpu_count() or 1)))  # this benchmark has the machine
    quiet_library_warnings()
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    from rewards import RewardScorer
    from ocaml_grpo.training.models import load_tokenizer

    out = fresh_run_dir(a.out, MARK)
    model = resolve_model(a.model, cache_dir(os.environ))  # converted once (named_models.py)
    problems, train, held, pool, inputs = prepare(a, load_tokenizer(model))
    if len(held) < a.heldout or not pool:
        sys.exit(f"bench_real: {len(held)} held-out and {len(pool)} pool problems fit the budget of {a.budget} tokens: "
                 "raise --budget (0: from the reference solutions)")
    write(out / "train_problems.jsonl", train)
    pool_file = write(out / "pool_problems.jsonl", pool)
    print(f"bench_real: {a.model}; {len(train)} training problems ({len(pool)} in the GRPO pool), {len(held)} held out; "
          f"{len(problems) - len(train) - len(held)} longer than the budget of {a.budget} tokens left out; k={a.k}, "
          f"temperature {a.temperature}", flush=True)

    results: dict = {}
    per_problem: dict = {}

    def record(name: str, split: str, metrics: dict, rewards: dict | None = None) -> None:
        r = results.setdefault(name, {})
        r[f"{split}_pass"], r[f"{split}_reward"] = metrics["pass"], metrics["reward"]
        if split == "heldout":
            r["heldout_compiled"], r["heldout_end_marker"] = metrics["compiled"], metrics["end_marker"]
            per_problem[name] = rewards
        print(f"   {name} on {split}: pass@1 {metrics['pass']:.3f}  mean reward {metrics['reward']:.3f}"
              + (f"  compiled {metrics['compiled']:.1%}" if "compiled" in metrics else ""), flush=True)

    # ---------------------------------------------------------------- base, cached
    # Each stage before GRPO is cached under the cache directory by everything it depends on, so a
    # rerun that changes only the GRPO recipe starts at GRPO.
    def stage_dir(name: str, **more) -> tuple[Path, bool]:
        """(the stage's folder in the cache, whether it holds a finished run)."""
        folder = stage_folder(inputs, name, **more)
        if (folder / "done").is_file():
            print(f"\n== {name}: cached ({folder})", flush=True)
            return folder, True
        shutil.rmtree(folder, ignore_errors=True)  # an unfinished earlier try
        folder.mkdir(parents=True)
        return folder, False

    t0 = time.time()
    folder, done = stage_dir("base")
    if not done:
        print("\n== base: sampling", flush=True)
        base = {split: dict(zip(("metrics", "rewards"), evaluate(model, None, ps, a, RewardScorer,
                                                                      folder / f"{split}_completions.jsonl")))
                for split, ps in (("heldout", held), ("train", pool))}
        (folder / "base.json").write_text(json.dumps(base) + "\n")
        (folder / "done").touch()
    base = json.loads((folder / "base.json").read_text())
    for split in ("train", "heldout"):
        record("base", split, base[split]["metrics"], base[split]["rewards"])
    minutes = {"base": (time.time() - t0) / 60}

    # ---------------------------------------------------------------- SFT only, its probe and evaluation, cached
    env = {**demo.base_env(), "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"], "GRPO_PROMPT_EXAMPLES": str(EXAMPLES),
           "BASE_MODEL_ID": a.model, "GRPO_SEED": str(a.seed), "GRPO_MAX_COMPLETION": str(a.budget),
           "GRPO_MAX_PROMPT": "1024", "GRPO_TEMPERATURE": str(a.temperature), "GRPO_STOP_AT_END": "1"}
    t0 = time.time()
    folder, done = stage_dir("sft", steps=a.sft_steps, lr=a.sft_lr)
    sft, stats_file = folder / "sft", folder / "probe.jsonl"
    adapter = str(sft / "final_adapter")
    env.update(GRPO_INIT_ADAPTER=adapter, TRAINING_DATASET=str(pool_file), GRPO_NUM_GENERATIONS=str(a.k))
    if not done:
        demo.run_stage("SFT (LoRA) on the training split", [str(demo.TRAIN), "sft"],
                       {**env, "GRPO_INIT_ADAPTER": "", "TRAINING_DATASET": str(out / "train_problems.jsonl"),
                        "SFT_OUTPUT_DIR": str(sft), "SFT_LORA": "1", "SFT_HOLDOUT": "0", "SFT_MAX_STEPS": a.sft_steps,
                        "SFT_BATCH_SIZE": "4", "SFT_GRAD_ACCUM_STEPS": "2", "SFT_LEARNING_RATE": a.sft_lr},
                       out, out / "sft.out", echo=lambda l: l.startswith(("[SFT", "sft data", "sft done")))
        minutes["sft"] = (time.time() - t0) / 60
        t0 = time.time()
        # The probe a user runs before GRPO, sampled as the evaluation samples: SFT's pool evaluation too.
        demo.run_stage("probe (evaluate.py --probe) on the GRPO pool", ["evaluate.py", "--probe", str(stats_file),
                       "--k", str(a.k), "--batch-size", str(a.batch_problems), "--seed", str(a.seed)],
                       env, demo.ROOT, out / "probe.out", echo=lambda l: l.startswith(("probe", "wrote")))
        print("\n== SFT only: sampling the held-out problems", flush=True)
        (folder / "heldout.json").write_text(json.dumps(evaluate(model, adapter, held, a, RewardScorer,
                                                                        folder / "heldout_completions.jsonl")) + "\n")
        (folder / "done").touch()
        minutes["sft_eval"] = (time.time() - t0) / 60
    stats = read_jsonl(stats_file)[0]
    record("sft", "train", {"pass": sum(s["solved"] for s in stats) / len(stats),
                            "reward": sum(s["reward_mean"] for s in stats) / len(stats)})
    record("sft", "heldout", *json.loads((folder / "heldout.json").read_text()))

    # ---------------------------------------------------------------- SFT + GRPO
    grpo = out / "grpo"
    grpo_temperature = a.temperature if a.grpo_temperature is None else a.grpo_temperature
    t0 = time.time()
    demo.run_stage("GRPO from the SFT adapter", [str(demo.TRAIN)],
                   {**env, "GRPO_OUTPUT_DIR": str(grpo), "GRPO_RESUME": "never", "GRPO_PROBLEM_STATS": str(stats_file),
                    "GRPO_BATCH_SIZE": "1", "GRPO_GRAD_ACCUM_STEPS": str(a.grpo_prompts), "GRPO_MAX_STEPS": str(a.grpo_steps),
                    "GRPO_LEARNING_RATE": a.grpo_lr, "GRPO_LR_SCHEDULER": "constant", "GRPO_SAVE_STEPS": "1000",
                    "GRPO_AUTO_STOP": "0", "GRPO_LOGGING_STEPS": "1", "GRPO_TEMPERATURE": str(grpo_temperature),
                    # a 135M model's rewards are crumbs (structure, type checks): any spread teaches
                    "GRPO_LEARNABLE_MIN_STD": a.min_std},
                   out, out / "grpo.out", echo=lambda l: l.startswith(("reward grader:", "done in", "warning", "selection")),
                   tail=grpo / "learning.log")
    minutes["grpo"] = (time.time() - t0) / 60
    t0 = time.time()
    print("\n== SFT + GRPO: sampling the pool and the held-out problems", flush=True)
    record("sft_grpo", "train", evaluate(model, str(grpo / "final_adapter"), pool, a, RewardScorer,
                                         out / "sft_grpo_train_completions.jsonl")[0])
    record("sft_grpo", "heldout", *evaluate(model, str(grpo / "final_adapter"), held, a, RewardScorer,
                                            out / "sft_grpo_heldout_completions.jsonl"))
    minutes["grpo_eval"] = (time.time() - t0) / 60

    # ---------------------------------------------------------------- the gain, and the record
    ids = [p.id for p in held]
    diffs = [per_problem["sft_grpo"][i] - per_problem["sft"][i] for i in ids]
    report = {**{name: {key: results[name][key] for key in (*RESULTS, "heldout_end_marker")} for name in ("base", "sft", "sft_grpo")},
              "heldout_problems": len(held), "heldout_ids": ids, "pool_ids": [p.id for p in pool],
              "heldout_gain": sum(diffs) / len(diffs), "heldout_gain_ci95": bootstrap_ci(diffs, a.seed),
              "heldout_compiled_gain": results["sft_grpo"]["heldout_compiled"] - results["sft"]["heldout_compiled"],
              "k": a.k, "budget": a.budget, "temperature": a.temperature, "model": a.model,
              "recipe": {"sft": {"lora": True, "steps": a.sft_steps, "batch": 8, "lr": a.sft_lr, "train_problems": len(train)},
                         "grpo": {"steps": a.grpo_steps, "prompts": a.grpo_prompts, "generations": a.k, "lr": a.grpo_lr,
                                  "temperature": grpo_temperature,
                                  "pool": len(pool), "learnable_min_std": a.min_std}, "prompt_examples": EXAMPLES},
              "minutes": round((time.time() - t_start) / 60, 1), "stage_minutes": {k: round(v, 1) for k, v in minutes.items()},
              "seed": a.seed}
    print("\n| model | train pass@1 | train reward | held-out pass@1 | held-out reward | held-out compiled |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ("base", "sft", "sft_grpo"):
        r = report[name]
        print(f"| {name} | {r['train_pass']:.3f} | {r['train_reward']:.3f} | {r['heldout_pass']:.3f} | "
              f"{r['heldout_reward']:.3f} | {r['heldout_compiled']:.1%} |")
    lo, hi = report["heldout_gain_ci95"]
    print(f"\nheld-out gain of SFT + GRPO over SFT only: {report['heldout_gain']:+.4f} mean reward, 95% CI [{lo:+.4f}, {hi:+.4f}] "
          f"over {len(held)} problems; compiled {report['heldout_compiled_gain']:+.1%}; {report['minutes']} min")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
