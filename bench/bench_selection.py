"""Uniform sampling against learnable-problem selection, side by side, on CPU with the demo's learner.

    python -m bench.bench_selection --json OUT.json              # ~3 min on 2 cores
    python -m bench.bench_selection --seed 1 --out grpo_runs/sel-1 --json sel-1.json

1. The learner model (ocaml_grpo/models/tiny.py) gets a two-stage SFT (`python train.py sft`, full
   fine-tune) so the problem set holds a mix: stage 1 on MASTERED until it is memorised, stage 2
   on MASTERED + PARTIAL stopped at partial memorisation; NEVER_SEEN is never trained on.
2. uniform: `python train.py` on all the problems, TRL's uniform order (GRPO_TRACK_PROBLEMS=0);
   tracked: the same with the problem tracker on and no stats file (the default);
3. selected: `python evaluate.py --probe` (k = the group size), then `python train.py` with
   GRPO_PROBLEM_STATS on that file and the tracker on, for fewer steps: the probe's completions
   are counted, so both runs generate the same number of completions.
4. The SFT model and each run's model are sampled as GRPO samples on the learnable problems
   (PARTIAL; same sampling seed for the three) and graded by the training grader (demo.compare).

Reported per run: mean frac_zero_std over its learning.log lines (groups with identical rewards),
the share of its groups that teach nothing by the selection's and tracker's rule
(group_kinds.learnable at the default thresholds: std < 0.05 or 90% solved; a never-seen
problem's group whose rewards differ by a stray END marker counts here, not in frac_zero_std),
the learnable problems' mean reward before (SFT model) and after, and the completions generated
(probe included).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench import arguments, fresh_run_dir, print_table, write_json
from bench.toy import BATCH, MASTERED, NEVER_SEEN, PARTIAL, RECIPE, sft_start, write_problems
from ocaml_grpo.models.loading import quiet_library_warnings
from ocaml_grpo.commands import demo
from ocaml_grpo.models.tiny import ensure_learner_model, learner_model_dir
from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.reward.group_kinds import group_stat, learnable
from ocaml_grpo.training.learning_log import parse_learning_log, series
from ocaml_grpo.problems import load_problems
from ocaml_grpo.training.selection import read_stats

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20  # the uniform run's; the selected run's are fewer by the probe's completions
MARK = ".bench_selection"


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def not_learnable(run: Path, min_std: float = 0.05, max_solved: float = 0.9) -> float:
    """Share of a run's groups (breakdown log) that `learnable` says teach nothing."""
    groups: dict[tuple, list[dict]] = {}
    for line in (run / "reward_logs" / "syntax_aware_breakdown.jsonl").read_text().splitlines():
        r = json.loads(line)
        groups.setdefault((r["step"], r["problem_id"]), []).append(r)
    verdicts = []
    for (_, pid), rs in groups.items():
        g = group_stat(pid, [r["reward"] for r in rs], [r["tests_total"] > 0 and r["tests_passed"] == r["tests_total"]
                                                        for r in rs], [r["tests_passed"] > 0 for r in rs])
        verdicts.append(learnable(g.reward_std, g.solved, g.passed_any, min_std, max_solved) != "mixed")
    return mean(verdicts)


def main(argv: list[str] | None = None) -> int:
    ap = arguments(__doc__, out="grpo_runs/bench-selection")
    ap.add_argument("--seed", default=RECIPE.seed, help="GRPO_SEED of both runs (the SFT stages keep 42)")
    ap.add_argument("--steps", type=int, default=STEPS, help="the uniform run's GRPO steps")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from transformers.utils import logging as hf_logging
    quiet_library_warnings()
    out = fresh_run_dir(args.out, MARK)
    t0 = time.time()
    group = int(RECIPE.generations)
    model = ensure_learner_model(learner_model_dir(cache_dir(os.environ)))
    echo = lambda l: l.startswith(("[SFT]", "selection", "probed", "problem states", "done in", "warning"))  # noqa: E731

    sft2 = sft_start(RECIPE, model, out, echo)
    problems = write_problems(out / "problems.jsonl", RECIPE.train_ids)

    def grpo_env(run: str, steps: int, **extra) -> dict:
        env = {**demo.grpo_env(RECIPE, sft2, out / run), "TRAINING_DATASET": str(problems), "GRPO_BATCH_SIZE": str(BATCH),
               "GRPO_MAX_STEPS": str(steps), "GRPO_SEED": str(args.seed)}
        return {**env, **extra}

    per_step = BATCH * group
    runs = {"uniform": {"steps": args.steps, "probe": 0}, "tracked": {"steps": args.steps, "probe": 0}, "selected": {}}
    demo.run_stage("GRPO, uniform sampling", [str(demo.TRAIN)], grpo_env("uniform", args.steps, GRPO_TRACK_PROBLEMS="0"),
                   out, out / "uniform.out", echo)
    demo.run_stage("GRPO, tracking only (the default)", [str(demo.TRAIN)],
                   grpo_env("tracked", args.steps, GRPO_TRACK_PROBLEMS="1"), out, out / "tracked.out", echo)

    stats = out / "probe.jsonl"
    probe_env = {**grpo_env("selected", 0), "GRPO_NUM_GENERATIONS": str(group)}
    demo.run_stage("probe", [str(ROOT / "evaluate.py"), "--probe", str(stats), "--batch-size", "4"], probe_env, out,
                   out / "probe.out", echo)
    probed = sum(s.k for s in read_stats(stats))
    steps = args.steps - probed // per_step  # the same completions in all: the probe's count against the run
    runs["selected"] = {"steps": steps, "probe": probed}
    demo.run_stage("GRPO, probe + selection + tracking", [str(demo.TRAIN)],
                   grpo_env("selected", steps, GRPO_PROBLEM_STATS=str(stats), GRPO_TRACK_PROBLEMS="1"),
                   out, out / "selected.out", echo)
    choices = [json.loads(l) for l in (out / "selected" / "problem_selection.jsonl").read_text().splitlines()]
    kept = [c["id"] for c in choices if c["ok"]]

    print("\n== before/after on the learnable problems, sampled as GRPO samples (same seed), training grader")
    split = {"learnable": [p for p in load_problems(str(problems)) if p.id in PARTIAL]}
    hf_logging.disable_progress_bar()
    models = {"SFT": str(sft2 / "final_model"), **{name: demo.merge_adapter(out / name) for name in runs}}
    table = demo.compare(models, split, RECIPE)
    results = {}
    for name, run in runs.items():
        zs = series(parse_learning_log(out / name / "learning.log")[1], "frac_zero_std")
        results[name] = {"frac_zero_std": mean(zs), "not_learnable": not_learnable(out / name),
                         "reward_before": table["SFT"]["learnable"]["mean_reward"],
                         "reward_after": table[name]["learnable"]["mean_reward"],
                         "completions": run["probe"] + run["steps"] * per_step, "grpo_steps": run["steps"],
                         "probe_completions": run["probe"], "frac_zero_std_per_step": zs}
        results[name]["gain"] = results[name]["reward_after"] - results[name]["reward_before"]
    results["problems"] = {"mastered": MASTERED, "partial": PARTIAL, "never_seen": NEVER_SEEN, "kept": kept}
    results["seconds"] = round(time.time() - t0)
    print_table(["run", "GRPO steps", "completions", "mean frac_zero_std", "groups teaching nothing",
                 "learnable reward before", "after", "gain"],
                [[name, str(r["grpo_steps"]), str(r["completions"]), f"{r['frac_zero_std']:.3f}", f"{r['not_learnable']:.2f}",
                  f"{r['reward_before']:.3f}", f"{r['reward_after']:.3f}", f"{r['gain']:+.3f}"]
                 for name, r in ((n, results[n]) for n in runs)])
    gains = results["selected"]["gain"], results["uniform"]["gain"]
    ratio = f"{gains[0] / gains[1]:.2f}" if gains[1] > 0 else "n/a (the uniform run gained nothing)"
    print(f"\nselection kept {kept}; gain ratio selected/uniform {ratio}; {results['seconds']} s")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
