"""What GRPO does to a real pretrained model on problems it never saw: the base model, base + GRPO
(the instruct model straight into GRPO), SFT only and SFT + GRPO, sampled and graded the same way
on a fixed held-out split of the bundled problems and on MultiPL-E's HumanEval-OCaml rows.

    make model-qwen05 && python -m bench.bench_real --model qwen2.5-coder-0.5b-instruct \\
        --json bench/results/real_qwen05.json                   # hours on 2 cores: run it in stages (below)
    python -m bench.bench_real --model qwen2.5-coder-0.5b-instruct --arms base   # the base rows only
    python -m bench.bench_real --model smollm2-135m-instruct --sft-steps 36 --grpo-steps 24 --grpo-temperature 0.5

1. Split, once (--seed): --heldout problems stratified by difficulty that neither SFT nor GRPO
   sees; the rest is the training split, and --pool of them are what GRPO trains on. Problems
   whose reference solution does not fit the completion budget are left out of both (the budget
   is the reference solutions' 95th percentile of tokens, rounded up to 32).
2. Arms (--arms): `base`, the model as installed; `base_grpo`, GRPO from it; `sft`, `train.py sft`
   with LoRA on the training split's reference solutions; `sft_grpo`, GRPO from that adapter.
   Each GRPO run starts with the probe a user runs (`evaluate.py --probe`) on the pool, and trains
   on the problems it finds learnable (GRPO_PROBLEM_STATS), with problem tracking on.
3. Every model is sampled --k times per problem with the training prompt, the same temperature
   (GRPO's groups may use --grpo-temperature), top-k off, the same completion budget, every answer
   stopped at the END marker, and graded by the training grader. `pass` is the share of answers
   passing every test (the line gate plays no part in it); `reward` is the training reward with the
   line gate. On MultiPL-E (evaluation only, never training; --multiple rows, a fixed sample) the
   same. Gains are means over problems of the per-problem difference, with a 95% bootstrap
   interval over problems (paired: both models on the same problems).

Every stage is cached under the cache directory by everything it depends on (model, problems,
sampling, recipe): the probe and each evaluation (per model and problem set), SFT, and GRPO, whose
run checkpoints every step and resumes where it stopped. A killed run, rerun with the same
arguments, starts where it stopped; a rerun with another GRPO recipe costs only that recipe.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path

from bench import arguments, bootstrap_ci
from ocaml_grpo.config import RewardConfig
from ocaml_grpo.config.isolation import SandboxConfig
from ocaml_grpo.config.settings import cache_dir, from_env
from ocaml_grpo.jsonl import read_jsonl
from ocaml_grpo.models.loading import export_adapter, load_tokenizer, quiet_library_warnings
from ocaml_grpo.models.named import model_key, resolve_model
from ocaml_grpo.problems import BUNDLED, Problem, load_problems
from ocaml_grpo.prompting import answer_text, chat_messages
from ocaml_grpo.commands import demo
from ocaml_grpo.training.sampling import generate_hf, generate_llamacpp, grade_completions

ARMS = ("base", "base_grpo", "sft", "sft_grpo")
START = {"base_grpo": "base", "sft_grpo": "sft"}  # where each GRPO arm starts
MULTIPLE = "multipl_e_ml.jsonl"  # in BENCHMARKS_DIR (default: the external sets beside the clone)


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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in problems), encoding="utf-8")
    return path


class Stages:
    """The benchmark's cached stages: a folder per stage under `root`, named by a hash of what it
    depends on (nothing of the machine's: a stage's results can travel with the repository); a
    stage is done when its folder holds `done`."""

    def __init__(self, root: Path, inputs: dict):
        self.root, self.inputs = root, inputs

    def folder(self, name: str, **more) -> Path:
        key = hashlib.sha256(json.dumps({**self.inputs, **more}, sort_keys=True, default=str).encode()).hexdigest()[:16]
        folder = self.root / f"{name}-{key}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def _owner_alive(folder: Path) -> bool:
    """Whether the process that made one of the grader's folders still lives: a grader folder's
    owner lock is held for its owner's life (grader.hold_owner_lock); a probe folder names its
    owner's pid. Another process's live folder (a neighbour's grader) is not this run's leftover."""
    if folder.name.startswith("ocaml-probe-"):
        try:
            os.kill(int(folder.name.split("-")[2]), 0)
            return True
        except (ValueError, IndexError, ProcessLookupError):
            return False
        except PermissionError:  # alive, another user's
            return True
    from ocaml_grpo.grading.grader import owner_alive
    return owner_alive(folder)


def _descendants(pid: int) -> set[int]:
    """The live processes below `pid` (zombies left out): with this process a child subreaper
    (main), a run's orphans stay below it, and a neighbour's processes never are."""
    parent = {}
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                fields = dict(line.split(":", 1) for line in open(f"/proc/{n}/status") if ":" in line)
            except OSError:
                continue
            if fields.get("State", "").strip().startswith("Z"):
                continue
            parent[int(n)] = int(fields.get("PPid", "0"))
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def snapshot() -> tuple[set[str], dict[int, str]]:
    """What a GRPO run must leave behind as it found it: the grader's folders (in /dev/shm and the
    temp dir) whose owner is gone, and the processes below this one."""
    import tempfile
    folders = {str(d / n) for d in (Path("/dev/shm"), Path(tempfile.gettempdir())) if d.is_dir()
               for n in os.listdir(d) if n.startswith(("ocaml-grader-", "ocaml-probe-")) and not _owner_alive(d / n)}
    procs = {}
    for pid in _descendants(os.getpid()):
        try:
            procs[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            continue
    return folders, procs


def stress(run: Path, before: tuple[set[str], dict[int, str]]) -> dict:
    """The long run as a stress test: the training process's resident memory at step 10 and at the
    last step (metrics.jsonl), and what it left behind when it ended (against `before`)."""
    records = [r for r in read_jsonl(run / "metrics.jsonl")[0] if r.get("rss_gb") is not None]
    at = {r["step"]: r for r in records}
    folders, procs = snapshot()
    stray = {pid: cmd for pid, cmd in procs.items() if pid not in before[1] and pid != os.getpid()}
    out = {"left_folders": sorted(folders - before[0]), "stray_processes": [f"{pid} {cmd}" for pid, cmd in stray.items()]}
    if 10 in at and records:
        last = records[-1]
        out.update({"rss_gb_step10": at[10]["rss_gb"], "rss_gb_last": last["rss_gb"], "last_step": last["step"],
                    "peak_rss_gb_step10": at[10]["peak_rss_gb"], "peak_rss_gb_last": last["peak_rss_gb"],
                    "rss_growth": last["rss_gb"] / at[10]["rss_gb"] - 1,
                    "peak_rss_growth": last["peak_rss_gb"] / at[10]["peak_rss_gb"] - 1})
    return out


def evaluate(model: str, adapter: str | None, problems: list[Problem], a, completions: Path, k: int) -> dict:
    """Sample `model` (+ `adapter`) as GRPO samples and grade every answer: the metrics, and each
    problem's solved share, compiled share and mean training reward. The answers go to `completions`."""
    from rewards import RewardScorer
    generated = completions.with_name("generations.json")  # kept apart: a grading that fails costs no sampling
    if generated.is_file():
        texts, lens = json.loads(generated.read_text())
    elif a.engine == "llamacpp":  # the GGUF file by name, with the adapter set on it
        texts, lens = generate_llamacpp(a.model, adapter, [chat_messages(p.prompt, a.examples) for p in problems], k,
                                        a.budget, a.temperature, a.batch_problems, a.seed, cache_dir(os.environ),
                                        stop_at_end=True, progress=False,
                                        partial=completions.with_name("generations.partial.json"))
        generated.write_text(json.dumps([texts, lens]) + "\n")
    else:
        texts, lens = generate_hf(model, adapter, [chat_messages(p.prompt, a.examples) for p in problems], k, a.budget,
                                  a.temperature, a.batch_problems, a.seed, top_k=0, progress=False, stop_at_end=True,
                                  partial=completions.with_name("generations.partial.json"))
        generated.write_text(json.dumps([texts, lens]) + "\n")
    # the reward's defaults, as in the training runs (base_env drops the caller's reward settings); the
    # sandbox's from the environment, as train.py reads them (OCAML_TOOLCHAIN_DIR of the offline bundle)
    config = replace(RewardConfig(), sandbox=from_env(SandboxConfig, os.environ))
    scorer = RewardScorer(replace(config, min_lines=0))
    try:
        core, rows = grade_completions(problems, texts, lens, 1, a.budget, scorer, config.min_lines)
    finally:
        scorer.close()
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    per: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for key, value in (("pass", r["solved"]), ("compiled", r["compiled"]), ("reward", r["train_reward"])):
            per[key][r["problem_id"]].append(float(value))
    return {"pass": core["pass@1"], "reward": core["mean_reward"], "compiled": core["rates"]["compiled"],
            "end_marker": core["rates"]["has_end_marker"], "constant": core["rates"]["constant"], "code_lines": sum(r["code_lines"] for r in rows) / len(rows),
            "per_problem": {key: {pid: sum(v) / len(v) for pid, v in d.items()} for key, d in per.items()}}


def kept_adapters(folder: Path, steps: int) -> list[Path]:
    """The adapters a GRPO run kept along the way (adapters/step-N, or step-N beside an exported
    one), short of its last step (that one is the arm's own)."""
    return [d for d in folder.glob("step-*") if d.name[5:].isdigit() and int(d.name[5:]) < steps
            and (d / "adapter_config.json").is_file()] if folder.is_dir() else []


def export(a, arm: str, adapter: Path, recipe: dict, root: Path, held: list[str], run: Path | None) -> Path:
    """`arm`'s adapter in bf16 under `root`, with its recipe (--adapter reads it back), the adapters
    its run kept (step-N/), its stress record, and a README that says what made it and how to
    measure it again."""
    name = f"{Path(a.model).name.removesuffix('.gguf').lower()}-{arm}"
    out = export_adapter(adapter, root / name, a.model)
    recipe = {**recipe, "weights": "bf16"}
    (out / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    if run is not None:
        for kept in kept_adapters(run / "adapters", recipe["steps"]):
            export_adapter(kept, out / kept.name, a.model)
            (out / kept.name / "recipe.json").write_text(
                json.dumps({**recipe, "at_step": int(kept.name[5:])}, indent=2) + "\n")
        if (run.parent / "stress.json").is_file():
            (out / "stress.json").write_text((run.parent / "stress.json").read_text())
    (out / "heldout_ids.txt").write_text("\n".join(held) + "\n")
    made = (f"SFT (LoRA) for {recipe['sft_steps']} steps of 8 at lr {recipe['sft_lr']} on the bundled training split"
            if arm == "sft" else f"GRPO for {recipe['steps']} steps at lr {recipe['lr']} from {START[arm]}")
    where = os.path.relpath(out, Path(__file__).resolve().parents[1])  # as the README's commands run: from the clone
    (out / "README.md").write_text(
        f"{a.model} + this LoRA adapter (bf16): {made}, by `python -m bench.bench_real` (recipe.json).\n"
        f"Measure it again on the held-out problems: `python evaluate.py --model {a.model} --adapter {where} "
        f"--engine llamacpp --ids {where}/heldout_ids.txt --k {a.k} --temperature {a.temperature} "
        f"--max-new-tokens {a.budget} --prompt-examples {a.examples} --stop-at-end 1`\n"
        "The figures it was measured at: bench/results/real_qwen05_grpo.json and BENCHMARKS.md.\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = arguments(__doc__)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="a named model, a .gguf file or a model folder")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--stages", default=None, help="where the stages are cached (default: the cache directory's "
                                                   "bench_real/); evaluations and probes are small enough to commit")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"which models to build and evaluate, of {','.join(ARMS)}")
    ap.add_argument("--seed", type=int, default=0, help="the split's, the sampling's and the runs' seed")
    ap.add_argument("--heldout", type=int, default=24, help="held-out problems (stratified by difficulty)")
    ap.add_argument("--pool", type=int, default=16, help="training problems probed, trained on by GRPO and evaluated")
    ap.add_argument("--multiple", type=int, default=48, help="MultiPL-E rows evaluated (a fixed sample; 0: none)")
    ap.add_argument("--k", type=int, default=4, help="samples per problem and model, and GRPO's group size")
    ap.add_argument("--temperature", type=float, default=0.8, help="every evaluation's (and the probe's) temperature")
    ap.add_argument("--grpo-temperature", type=float, default=None,
                    help="GRPO_TEMPERATURE of the GRPO runs (default: --temperature); evaluations keep --temperature")
    ap.add_argument("--grpo-generations", type=int, default=0, help="GRPO's group size (0: --k)")
    ap.add_argument("--budget", type=int, default=0, help="completion tokens (0: from the reference solutions)")
    ap.add_argument("--examples", type=int, default=0, help="worked examples in every prompt (GRPO_PROMPT_EXAMPLES)")
    ap.add_argument("--batch-problems", type=int, default=4, help="problems per generate() call in evaluations")
    ap.add_argument("--engine", default="default", choices=["default", "llamacpp"],
                    help="what samples every evaluation, the probe and GRPO (GRPO_ENGINE): llamacpp runs the model's "
                         "GGUF file (`make engine`)")
    ap.add_argument("--sft-steps", default="12", help="SFT optimizer steps of 8 examples (SFT_MAX_STEPS)")
    ap.add_argument("--sft-lr", default="5e-4")
    ap.add_argument("--grpo-steps", type=int, default=12)
    ap.add_argument("--grpo-prompts", type=int, default=2,
                    help="prompts per GRPO step: one per backward pass (GRPO_GRAD_ACCUM_STEPS), to fit 24 GB")
    ap.add_argument("--grpo-lr", default="2e-4")
    ap.add_argument("--curriculum", action="store_true", help="REWARD_CURRICULUM=1 in the GRPO runs")
    ap.add_argument("--grpo-min-lines", default="8", help="MIN_NON_EMPTY_LINES of the GRPO runs (the default's 8 gives "
                                                           "a right 5-line answer 0); evaluations keep the default")
    ap.add_argument("--min-std", default="0.01", help="GRPO_LEARNABLE_MIN_STD for the probe's selection")
    ap.add_argument("--no-selection", action="store_true",
                    help="GRPO trains on the whole pool, not the probe's selection (no probe is run)")
    ap.add_argument("--dynamic", action="store_true", help="GRPO_DYNAMIC_SAMPLING=1 in the GRPO runs: every step "
                                                           "trains on groups with spread")
    ap.add_argument("--no-pool-eval", action="store_true", help="no evaluation on the pool (a large pool costs more "
                                                                "than the held-out set)")
    ap.add_argument("--multiple-k", type=int, default=0, help="samples per MultiPL-E row (0: --k)")
    ap.add_argument("--adapter", action="append", default=[], metavar="ARM=DIR",
                    help="the arm (sft, base_grpo, sft_grpo) is this adapter exported by an earlier run (--export; "
                         "committed under bench/results/adapters/), with the recipe and curve saved beside it, "
                         "instead of training it; repeatable")
    ap.add_argument("--grpo-keep", type=int, default=0,
                    help="keep the GRPO runs' adapter every this many steps (GRPO_KEEP_ADAPTERS) and evaluate each "
                         "on the held-out problems: the curve")
    ap.add_argument("--export", default=None, help="write each trained arm's adapter here in bf16, with its recipe, "
                                                   "the adapters kept along the run and a README "
                                                   "(bench/results/adapters/), and evaluate what was written")
    a = ap.parse_args(argv)
    # a child subreaper: what a GRPO run leaves running stays below this process, where stress() finds it
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    arms = [arm for arm in a.arms.split(",") if arm]
    given = {arm: Path(d).resolve() for arm, _, d in (x.partition("=") for x in a.adapter)}
    for arm, d in given.items():
        if arm not in START and arm != "sft" or not (d / "recipe.json").is_file():
            ap.error(f"--adapter {arm}={d}: an arm of sft,base_grpo,sft_grpo and a folder --export wrote (recipe.json)")
    if unknown := set(arms) - set(ARMS):
        ap.error(f"--arms: unknown {sorted(unknown)}; choose from {','.join(ARMS)}")
    t_start = time.time()
    os.environ.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", TRL_EXPERIMENTAL_SILENCE="1")
    os.environ.setdefault("OMP_NUM_THREADS", str(min(4, os.cpu_count() or 1)))  # this benchmark has the machine
    quiet_library_warnings()
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    # ---------------------------------------------------------------- the split, and what every stage depends on
    model = resolve_model(a.model, cache_dir(os.environ))  # verified, converted once (models/named.py)
    tokenizer = load_tokenizer(model)
    problems = [p for p in load_problems(BUNDLED) if p.solution.strip()]
    # +1: the end of turn the model must emit too
    lengths = {p.id: len(tokenizer(answer_text(p.solution), add_special_tokens=False)["input_ids"]) + 1 for p in problems}
    ordered = sorted(lengths.values())
    a.budget = a.budget or 32 * math.ceil(ordered[int(0.95 * len(ordered))] / 32)
    train, held = stratified_split([p for p in problems if lengths[p.id] <= a.budget], a.heldout, a.seed)
    pool = random.Random(a.seed).sample(train, min(a.pool, len(train)))
    multiple: list[Problem] = []
    if a.multiple:
        multiple_file = Path(os.environ.get("BENCHMARKS_DIR") or Path(__file__).resolve().parents[2] / "shared" /
                             "benchmarks") / MULTIPLE
        if not multiple_file.is_file():
            sys.exit(f"bench_real: --multiple {a.multiple} needs {multiple_file} (the external sets; BENCHMARKS_DIR "
                     "says where they are); --multiple 0 skips MultiPL-E")
        rows = load_problems(multiple_file)
        multiple = sorted(random.Random(a.seed).sample(rows, min(a.multiple, len(rows))), key=lambda p: p.id)
    if len(held) < a.heldout or (not pool and a.pool):
        sys.exit(f"bench_real: {len(held)} held-out and {len(pool)} pool problems fit the budget of {a.budget} tokens: "
                 "raise --budget (0: from the reference solutions)")
    if not pool and set(arms) & set(START):
        sys.exit("bench_real: --pool 0 leaves GRPO nothing to train on: evaluate base or sft alone (--arms base,sft)")
    if a.k < 2 and pool:
        sys.exit("bench_real: the probe of the pool needs --k 2 or more (--pool 0 evaluates the held-out problems alone)")
    reward = RewardConfig()
    stages = Stages((Path(a.stages) if a.stages else cache_dir(os.environ) / "bench_real").resolve(),
                    # how every model is sampled and graded; what a model was trained on is in its recipe
                    {"model": model_key(a.model), "k": a.k,
                     "budget": a.budget, "temperature": a.temperature, "seed": a.seed,
                     "reward": [reward.min_lines, reward.runaway_multiplier, asdict(reward.weights),
                                asdict(reward.sandbox.limits)],
                     "prompt": chat_messages("x", a.examples), "stop_at_end": True,
                     **({"engine": a.engine} if a.engine != "default" else {})})
    work = stages.folder("split", held=[p.id for p in held], pool=[p.id for p in pool])
    train_file, pool_file = write(work / "train_problems.jsonl", train), write(work / "pool_problems.jsonl", pool)
    print(f"bench_real: {a.model}; {len(train)} training problems ({len(pool)} in the GRPO pool), {len(held)} held out, "
          f"{len(multiple)} MultiPL-E rows; {len(problems) - len(train) - len(held)} longer than the budget of {a.budget} "
          f"tokens left out; k={a.k}, temperature {a.temperature}, {a.examples} worked examples", flush=True)

    env = {**demo.base_env(), "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"], "GRPO_PROMPT_EXAMPLES": str(a.examples),
           "BASE_MODEL_ID": a.model, "GRPO_SEED": str(a.seed), "GRPO_MAX_COMPLETION": str(a.budget),
           "GRPO_MAX_PROMPT": "2048", "GRPO_TEMPERATURE": str(a.temperature), "GRPO_STOP_AT_END": "1",
           "TRAINING_DATASET": str(pool_file), "GRPO_NUM_GENERATIONS": str(a.k), "GRPO_ENGINE": a.engine}
    minutes: dict[str, float] = {}
    adapters: dict[str, str | None] = {"base": None}
    recipes: dict[str, dict] = {"base": {}}
    results: dict[str, dict] = {}
    runs: dict[str, Path] = {}  # GRPO arm -> its run folder
    curves: dict[str, dict] = {}  # GRPO arm -> step -> held-out metrics of the adapter kept there

    def timed(name: str, t0: float) -> None:
        minutes[name] = round(minutes.get(name, 0) + (time.time() - t0) / 60, 1)

    def probe(arm: str) -> Path:
        """The probe a user runs before GRPO, on the pool, from `arm`'s model (resumable: evaluate.py)."""
        # graded as the GRPO run it selects for will grade (its line gate)
        folder = stages.folder(f"probe-{arm}", recipe=recipes[arm], ids=[p.id for p in pool],
                               **({"min_lines": a.grpo_min_lines} if a.grpo_min_lines != "8" else {}))
        stats = folder / "probe.jsonl"
        if not (folder / "done").is_file():
            t0 = time.time()
            demo.run_stage(f"probe (evaluate.py --probe) of {arm} on the GRPO pool",
                           ["evaluate.py", "--probe", str(stats), "--k", str(a.k), "--batch-size", str(a.batch_problems),
                            "--seed", str(a.seed)], {**env, "GRPO_INIT_ADAPTER": adapters[arm] or "",
                                                     "MIN_NON_EMPTY_LINES": a.grpo_min_lines}, demo.ROOT,
                           folder / "probe.out", echo=lambda l: l.startswith(("probe", "wrote")))
            (folder / "done").touch()
            timed(f"probe_{arm}", t0)
        return stats

    def evaluation(arm: str, split: str, chosen: list[Problem]) -> dict:
        k = a.multiple_k if split == "multiple" and a.multiple_k else a.k
        folder = stages.folder(f"eval-{arm}-{split}", recipe=recipes[arm], ids=[p.id for p in chosen],
                               **({"k": k} if k != a.k else {}))
        if not (folder / "done").is_file():
            print(f"\n== {arm}: sampling {len(chosen)} {split} problems x {k}", flush=True)
            t0 = time.time()
            (folder / "metrics.json").write_text(json.dumps(evaluate(model, adapters[arm], chosen, a,
                                                                     folder / "completions.jsonl", k)) + "\n")
            (folder / "done").touch()
            timed(f"eval_{arm}", t0)
        m = json.loads((folder / "metrics.json").read_text())
        print(f"   {arm} on {split}: pass@1 {m['pass']:.3f}  compiled {m['compiled']:.1%}  mean reward {m['reward']:.3f}  "
              f"END marker {m['end_marker']:.0%}  ({folder})", flush=True)
        return m

    for arm in [x for x in ARMS if x in arms or x in (START.get(y) for y in arms)]:
        # ------------------------------------------------------------ build the arm's model
        if arm in given:  # exported by an earlier run (--export): its recipe travels with it
            recipes[arm] = json.loads((given[arm] / "recipe.json").read_text())
            adapters[arm] = str(given[arm])
        elif arm == "sft":
            recipes[arm] = {"sft_steps": a.sft_steps, "sft_lr": a.sft_lr, "lora": True, "batch": 8,
                            "held_out": [p.id for p in held]}  # SFT trains on every other problem that fits
            folder = stages.folder("sft", recipe=recipes[arm])
            adapters[arm] = str(folder / "sft" / "final_adapter")
            if not (folder / "done").is_file():
                t0 = time.time()
                demo.run_stage("SFT (LoRA) on the training split", [str(demo.TRAIN), "sft"],
                               {**env, "TRAINING_DATASET": str(train_file), "SFT_OUTPUT_DIR": str(folder / "sft"),
                                "SFT_LORA": "1", "SFT_HOLDOUT": "0", "SFT_MAX_STEPS": a.sft_steps, "SFT_BATCH_SIZE": "4",
                                "SFT_GRAD_ACCUM_STEPS": "2", "SFT_LEARNING_RATE": a.sft_lr},
                               folder, folder / "sft.out", echo=lambda l: l.startswith(("[SFT", "sft data", "sft done")))
                (folder / "done").touch()
                timed("sft", t0)
        elif arm in START:
            start = START[arm]
            stats = None if a.no_selection else probe(start)
            grpo_t = a.temperature if a.grpo_temperature is None else a.grpo_temperature
            recipes[arm] = {"from": recipes[start], "pool": [p.id for p in pool], "steps": a.grpo_steps, "prompts": a.grpo_prompts, "lr": a.grpo_lr,
                            "temperature": grpo_t, "generations": a.grpo_generations or a.k,
                            "learnable_min_std": None if a.no_selection else a.min_std, "curriculum": a.curriculum,
                            **({"min_lines": a.grpo_min_lines} if a.grpo_min_lines != "8" else {}),
                            **({"dynamic_sampling": True} if a.dynamic else {})}
            folder = stages.folder(f"grpo-{arm}", recipe=recipes[arm])
            adapters[arm] = str(folder / "run" / "final_adapter")
            if not (folder / "done").is_file():
                t0 = time.time()
                before = snapshot()
                # GRPO_RESUME=auto and a checkpoint every step: a killed run resumes where it stopped
                demo.run_stage(f"GRPO from {start}", [str(demo.TRAIN)],
                               {**env, "GRPO_INIT_ADAPTER": adapters[start] or "", "GRPO_OUTPUT_DIR": str(folder / "run"),
                                "GRPO_RESUME": "auto", "GRPO_PROBLEM_STATS": "" if a.no_selection else str(stats),
                                "GRPO_BATCH_SIZE": "1",
                                "GRPO_NUM_GENERATIONS": str(a.grpo_generations or a.k),
                                "GRPO_GRAD_ACCUM_STEPS": str(a.grpo_prompts), "GRPO_MAX_STEPS": str(a.grpo_steps),
                                "GRPO_LEARNING_RATE": a.grpo_lr, "GRPO_LR_SCHEDULER": "constant", "GRPO_SAVE_STEPS": "1",
                                "GRPO_SAVE_TOTAL_LIMIT": "2", "GRPO_AUTO_STOP": "0", "GRPO_LOGGING_STEPS": "1",
                                "GRPO_TEMPERATURE": str(grpo_t), "REWARD_CURRICULUM": "1" if a.curriculum else "0",
                                "MIN_NON_EMPTY_LINES": a.grpo_min_lines,
                                # a weak model's rewards are crumbs (structure, type checks): any spread teaches
                                "GRPO_LEARNABLE_MIN_STD": a.min_std,
                                "GRPO_DYNAMIC_SAMPLING": "1" if a.dynamic else "0",
                                "GRPO_KEEP_ADAPTERS": str(a.grpo_keep)},
                               folder, folder / "grpo.out",
                               echo=lambda l: l.startswith(("reward grader:", "done in", "warning", "selection")),
                               tail=folder / "run" / "learning.log")
                (folder / "stress.json").write_text(json.dumps(stress(folder / "run", before)) + "\n")
                (folder / "done").touch()
                timed(f"grpo_{arm}", t0)
            runs[arm] = folder / "run"
        if a.export and arm != "base" and arm not in given:  # from here on the arm is what was exported (bf16)
            given[arm] = export(a, arm, Path(adapters[arm]), recipes[arm], Path(a.export).resolve(), [p.id for p in held],
                                runs.get(arm))
            adapters[arm], recipes[arm] = str(given[arm]), json.loads((given[arm] / "recipe.json").read_text())
            print(f"exported {arm} to {given[arm]}", flush=True)
        # the curve: the adapters kept along the run (GRPO_KEEP_ADAPTERS), each on the held-out problems
        for kept in sorted(kept_adapters(given[arm] if arm in given else runs.get(arm, Path("-")) / "adapters",
                                         recipes[arm]["steps"]) if arm in START else [], key=lambda d: int(d.name[5:])):
            step = int(kept.name[5:])
            point = f"{arm}@{step}"
            adapters[point] = str(kept)
            recipes[point] = json.loads((kept / "recipe.json").read_text()) if arm in given else \
                {**recipes[arm], "at_step": step}
            m = evaluation(point, "heldout", held)
            curves.setdefault(arm, {})[step] = {k: m[k] for k in ("pass", "compiled", "reward", "end_marker")} | {
                "per_problem": m["per_problem"]}
        if arm not in arms:
            continue
        # ------------------------------------------------------------ evaluate it
        r: dict = {}
        held_m = evaluation(arm, "heldout", held)
        r.update({f"heldout_{k}": held_m[k] for k in ("pass", "compiled", "reward", "end_marker", "code_lines")})
        r["per_problem"] = {"heldout": held_m["per_problem"]}
        if multiple:
            mult_m = evaluation(arm, "multiple", multiple)
            r.update({f"multiple_{k}": mult_m[k] for k in ("pass", "compiled", "reward")})
            r["per_problem"]["multiple"] = mult_m["per_problem"]
        if not pool or a.no_pool_eval:
            pass
        elif arm in ("base", "sft"):  # the probe is the pool's evaluation
            stats = read_jsonl(probe(arm))[0]
            r["train_pass"] = sum(s["solved"] for s in stats) / len(stats)
            r["train_reward"] = sum(s["reward_mean"] for s in stats) / len(stats)
        else:
            pool_m = evaluation(arm, "pool", pool)
            r["train_pass"], r["train_reward"] = pool_m["pass"], pool_m["reward"]
        results[arm] = r

    # ---------------------------------------------------------------- gains and the record
    gains = {}
    for new, old in (("base_grpo", "base"), ("sft", "base"), ("sft_grpo", "base"), ("sft_grpo", "sft")):
        if new not in results or old not in results:
            continue
        g = {}
        for split, metric in (("heldout", "pass"), ("heldout", "compiled"), ("heldout", "reward"), ("multiple", "pass")):
            if split not in results[new]["per_problem"]:
                continue
            n, o = results[new]["per_problem"][split][metric], results[old]["per_problem"][split][metric]
            diffs = [n[i] - o[i] for i in sorted(o)]
            g[f"{split}_{metric}_gain"] = sum(diffs) / len(diffs)
            g[f"{split}_{metric}_gain_ci95"] = bootstrap_ci(diffs, a.seed)
        gains[f"{new}-{old}"] = g
    for arm, points in curves.items():  # each kept adapter against the arm's start, paired as the gains are
        for step, m in points.items():
            per = m.pop("per_problem")
            if START[arm] in results:
                o = results[START[arm]]["per_problem"]["heldout"]
                for metric in ("pass", "compiled"):
                    diffs = [per[metric][i] - o[metric][i] for i in sorted(o[metric])]
                    m[f"{metric}_gain"], m[f"{metric}_gain_ci95"] = sum(diffs) / len(diffs), bootstrap_ci(diffs, a.seed)
    report = {name: {k: v for k, v in r.items() if k != "per_problem"} for name, r in results.items()}
    report.update({"heldout_ids": [p.id for p in held], "pool_ids": [p.id for p in pool],
                   "multiple_ids": [p.id for p in multiple], "gains": gains,
                   # the seed's path (an instruct model straight into GRPO) against the base model
                   **{k: v for k, v in gains.get("base_grpo-base", {}).items() if k.endswith("_ci95")},
                   **({"curves": {arm: {str(s): m for s, m in sorted(p.items())} for arm, p in curves.items()}}
                      if curves else {}),
                   "stress": {arm: json.loads(f.read_text()) for arm in START if arm in results
                              for f in [given[arm] / "stress.json" if arm in given else runs[arm].parent / "stress.json"]
                              if f.is_file()},
                   "k": a.k, **({"multiple_k": a.multiple_k} if a.multiple_k else {}), "budget": a.budget, "temperature": a.temperature, "model": a.model, "examples": a.examples,
                   "recipe": {arm: recipes[arm] for arm in results if recipes.get(arm)},
                   "minutes": round((time.time() - t_start) / 60, 1), "stage_minutes": minutes, "seed": a.seed,
                   "omp_threads": os.environ["OMP_NUM_THREADS"]})
    print("\n| model | held-out pass@1 | held-out compiled | held-out reward | END marker | MultiPL-E pass@1 | pool pass@1 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in report.items():
        if name in ARMS:
            print(f"| {name} | {r['heldout_pass']:.3f} | {r['heldout_compiled']:.1%} | {r['heldout_reward']:.3f} | "
                  f"{r['heldout_end_marker']:.0%} | {r.get('multiple_pass', float('nan')):.3f} | "
                  f"{r.get('train_pass', float('nan')):.3f} |")
    for name, g in gains.items():
        print(f"{name}: " + "; ".join(f"{k.removesuffix('_gain')} {g[k]:+.4f} [{g[k + '_ci95'][0]:+.4f}, "
                                      f"{g[k + '_ci95'][1]:+.4f}]" for k in g if k.endswith("_gain")))
    print(f"{report['minutes']} min")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
