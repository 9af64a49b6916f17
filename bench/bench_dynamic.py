"""Tracking alone against tracking + dynamic sampling, side by side, at the same generated tokens,
on CPU with the demo's learner.

    python -m bench.bench_dynamic --json OUT.json               # ~4 min on 2 cores
    python -m bench.bench_dynamic --seed 1 --json OUT.json      # adds seed 1's results to the same file
    python -m bench.bench_dynamic --model qwen2.5-coder-0.5b-instruct --steps 4 --json OUT.json   # the real row

1. The problems and SFT start of bench_selection: the learner model (models/tiny.py) gets a
   two-stage SFT so 8 bundled problems are mastered (2), partly learned (2) or never seen (4).
2. dynamic: `python train.py` from that start with the tracker (the default) and
   GRPO_DYNAMIC_SAMPLING=1, for --steps steps; dynamic_any_spread: the same with
   GRPO_LEARNABLE_MIN_STD=0, so that any difference in a group's rewards counts as teaching (for
   the tracker too).
3. tracked: the same without dynamic sampling, checkpointed every step, for as many steps as the
   dynamic run took generation rounds, and 4 more; judged at the checkpoint where the completion
   tokens it generated first reach the dynamic run's (every generated completion counts, dropped
   groups included).
4. The SFT model and both runs' models are sampled as GRPO samples (same seed) on the partly
   learned problems and on all 8, and graded by the training grader (demo.compare).

The real model's row (--model qwen2.5-coder-0.5b-instruct) compares against the base + GRPO run
of bench_real (--tracked: its `run` folder; by default the one under
bench/results/real_qwen05_stages): the same run, replayed from its config.json (model, problems,
probe selection, budgets, seed), with dynamic sampling on for --steps steps, and the tracked run's
training curve up to the step where its generated tokens reach the dynamic run's. The dynamic run
checkpoints every step and resumes where a kill stopped it (--out keeps it).

Reported per run: steps, generated completion tokens, mean training reward (every generated
completion's) over the whole run and over its last quarter of tokens, frac_zero_std of the
generated groups and of the trained batches, and the before/after rewards. For the dynamic run also:
rounds per step, steps that reached the cap, steps that did not but trained a group without
spread (must be 0), and the generated tokens per kept group.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench import arguments, fresh_run_dir, matched_model, matched_step, print_table
from bench.toy import BATCH, MASTERED, NEVER_SEEN, PARTIAL, RECIPE, sft_start, write_problems
from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.jsonl import read_jsonl
from ocaml_grpo.problems import load_problems
from ocaml_grpo.commands import demo
from ocaml_grpo.training.dynamic_sampling import teaching_groups
from ocaml_grpo.training.metrics import METRICS_FILE, StepRecord
from ocaml_grpo.models.loading import quiet_library_warnings
from ocaml_grpo.models.tiny import ensure_learner_model, learner_model_dir

STEPS = 12  # the dynamic run's
GENERATIONS = 6  # GRPO_NUM_GENERATIONS' default: groups small enough to tie, as a weak model's do
CAP = 3  # GRPO_DYNAMIC_SAMPLING_ROUNDS' default
MIN_STD = 0.05  # GRPO_LEARNABLE_MIN_STD's default: a group teaches when its rewards' std reaches it
MARK = ".bench_dynamic"
REAL_MODEL = "qwen2.5-coder-0.5b-instruct"
DEFAULT_OUT = "grpo_runs/bench-dynamic"
REAL_STAGES = Path(__file__).resolve().parent / "results" / "real_qwen05_stages"  # bench_real's, for the 0.5B


def records(run: Path) -> list[StepRecord]:
    return [StepRecord.from_json(r) for r in read_jsonl(run / METRICS_FILE)[0]]


def tokens_per_step(run: Path, per_round: int) -> list[float]:
    """Completion tokens generated at each step, every round's: TRL's mean length is over every
    generated completion, and every round is as large as the first."""
    return [(r.completion_length or 0.0) * per_round * ((r.dynamic or {}).get("generation_rounds") or 1.0)
            for r in records(run)]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def curve(run: Path, per_round: int, steps: int) -> dict:
    """The training reward against cumulative generated tokens, over the first `steps` steps."""
    recs, toks = records(run)[:steps], tokens_per_step(run, per_round)[:steps]
    total, spent, points = sum(toks), 0.0, []
    for r, t in zip(recs, toks):
        spent += t
        points.append((round(spent), r.reward))
    last = [rw for (cum, rw) in points if cum > 0.75 * total]
    return {"tokens": round(total), "steps": len(recs), "reward_mean": mean([rw for _, rw in points]),
            "reward_last_quarter": mean(last), "reward_by_tokens": points,
            "frac_zero_std": mean([r.frac_zero_std for r in recs if r.frac_zero_std is not None])}


def dynamic_summary(run: Path, per_round: int, rounds: int) -> dict:
    """What a dynamic run's steps did: rounds, the cap, kept and dropped groups, tokens trained."""
    dyn = [r.dynamic for r in records(run)]
    kept = sum(d["groups_kept"] for d in dyn)
    tokens = sum(tokens_per_step(run, per_round))
    return {
        "frac_zero_std_trained": mean([d["frac_zero_std_trained"] for d in dyn]),
        "frac_zero_std_trained_per_step": [d["frac_zero_std_trained"] for d in dyn],
        "rounds_per_step": [d["generation_rounds"] for d in dyn],
        "steps_at_cap": sum(d["frac_zero_std_trained"] > 0 for d in dyn),
        # the goal: a step that was not at the cap trained no group that teaches nothing
        "steps_below_cap_with_zero_std": sum(d["frac_zero_std_trained"] > 0
                                             and d["generation_rounds"] < rounds + 1 for d in dyn),
        "groups_generated": sum(d["groups_generated"] for d in dyn), "groups_kept": kept,
        "dropped": {k: sum(d[f"dropped_{k}"] or 0 for d in dyn) for k in ("too_hard", "too_easy", "identical", "surplus")},
        "tokens_trained": mean([d["tokens_trained"] for d in dyn]),
        "tokens_per_kept_group": round(tokens / kept) if kept else None}


def tracked_teaching_groups(run: Path, steps: int, generations: int, min_std: float) -> int:
    """The tracked run's groups that teach, by dynamic sampling's rule, in its first `steps` steps
    (a completion's `step` counts from 0)."""
    rows = [r for r in read_jsonl(run / "reward_logs" / "completions.jsonl")[0] if r["step"] < steps]
    return sum(teaching_groups([float("nan") if r["reward"] is None else r["reward"] for r in rows], generations, min_std))


def replay_env(config: dict) -> dict:
    """A run's recorded settings (config.json) as the environment that makes the run again."""
    as_text = {True: "1", False: "0"}
    return {k: as_text.get(v, str(v)) if isinstance(v, bool) else str(v) for k, v in config.items() if v is not None}


def real_model_row(args) -> dict:
    """The tracked base + GRPO run of bench_real against the same run with dynamic sampling."""
    if args.tracked:
        tracked = Path(args.tracked).resolve()
    else:
        found = sorted(REAL_STAGES.glob("grpo-base_grpo-*/run/finished.json"))
        if len(found) != 1:
            sys.exit(f"--model {args.model}: this row replays bench_real's base + GRPO run, and {REAL_STAGES} holds "
                     f"{len(found)} finished ones; run `python -m bench.bench_real --model {args.model} --stages "
                     f"{REAL_STAGES} --arms base,base_grpo` first, or name the run folder with --tracked")
        tracked = found[0].parent
    if not (tracked / "finished.json").is_file() or not (tracked / "config.json").is_file():
        sys.exit(f"--tracked {tracked}: not a finished GRPO run folder (no finished.json or config.json there)")
    config = json.loads((tracked / "config.json").read_text())
    if config.get("BASE_MODEL_ID") != args.model:
        sys.exit(f"--tracked {tracked}: a run of {config.get('BASE_MODEL_ID')}, not of {args.model}")
    out = Path(args.out if args.out != DEFAULT_OUT else f"{DEFAULT_OUT}-{Path(args.model).name}").resolve()
    dynamic = out / "dynamic"
    generations, min_std = int(config["GRPO_NUM_GENERATIONS"]), float(config["GRPO_LEARNABLE_MIN_STD"])
    per_round = int(config["GRPO_BATCH_SIZE"]) * int(config["GRPO_GRAD_ACCUM_STEPS"]) * generations
    if not (dynamic / "finished.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        env = {**demo.base_env(), **replay_env(config), "GRPO_OUTPUT_DIR": str(dynamic), "GRPO_RESUME": "auto",
               "GRPO_MAX_STEPS": str(args.steps), "GRPO_SAVE_STEPS": "1", "GRPO_SAVE_TOTAL_LIMIT": "2",
               "GRPO_DYNAMIC_SAMPLING": "1", "GRPO_DYNAMIC_SAMPLING_ROUNDS": str(args.rounds),
               # the threads the tracked run had (base_env would give one)
               "OMP_NUM_THREADS": str(config.get("GRPO_TORCH_THREADS") or os.environ.get("OMP_NUM_THREADS", "1"))}
        demo.run_stage("GRPO with dynamic sampling (the tracked run's settings)", [str(demo.TRAIN)], env, out,
                       out / "dynamic.out", lambda l: l.startswith(("dynamic sampling", "done in", "warning")),
                       tail=dynamic / "learning.log")
    budget = sum(tokens_per_step(dynamic, per_round))
    tracked_tokens = tokens_per_step(tracked, per_round)
    matched = matched_step(tracked_tokens, budget)
    spent = sum(tracked_tokens[:matched])
    row = {"tracked": curve(tracked, per_round, matched), "dynamic": curve(dynamic, per_round, args.steps)}
    row["tracked"]["frac_zero_std_trained"] = row["tracked"]["frac_zero_std"]  # it trains on every group
    teaching = tracked_teaching_groups(tracked, matched, generations, min_std)
    row["tracked"]["tokens_per_kept_group"] = round(spent / teaching) if teaching else None
    row["dynamic"] |= dynamic_summary(dynamic, per_round, args.rounds)
    row["setup"] = {"model": args.model, "tracked_run": str(tracked), "dynamic_run": str(dynamic),
                    "prompts_per_step": per_round // generations, "generations": generations, "rounds_cap": args.rounds,
                    "min_std": min_std, "dynamic_steps": args.steps, "tracked_steps_matched": matched,
                    "tracked_reached_the_budget": spent >= budget, "seed": config.get("GRPO_SEED")}
    print_table(["run", "GRPO steps", "generated tokens", "tokens per group that teaches", "frac_zero_std generated", "trained",
                 "training reward (mean / last quarter)"],
                [[name, str(r["steps"]), str(r["tokens"]), str(r["tokens_per_kept_group"]), f"{r['frac_zero_std']:.3f}",
                  f"{r['frac_zero_std_trained']:.3f}", f"{r['reward_mean']:.3f} / {r['reward_last_quarter']:.3f}"] for name, r in ((n, row[n]) for n in ("tracked", "dynamic"))])
    d = row["dynamic"]
    print(f"\ndynamic: rounds per step {d['rounds_per_step']}; {d['steps_at_cap']} step(s) at the cap; "
          f"{d['steps_below_cap_with_zero_std']} step(s) below the cap trained a group that teaches nothing; "
          f"dropped {d['dropped']}; {d['tokens_trained']:.0%} of generated tokens trained")
    if not row["setup"]["tracked_reached_the_budget"]:
        print(f"note: the tracked run's {matched} steps generated {spent:.0f} tokens, short of the dynamic run's "
              f"{budget:.0f}: the two are compared at unequal tokens", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = arguments(__doc__)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--out", default=DEFAULT_OUT, help="working directory (a rerun starts it over; the real "
                                                      "model's dynamic run resumes there)")
    ap.add_argument("--seed", default=RECIPE.seed, help="GRPO_SEED of both runs (the SFT stages keep 42)")
    ap.add_argument("--steps", type=int, default=STEPS, help="the dynamic runs' GRPO steps")
    ap.add_argument("--generations", type=int, default=GENERATIONS, help="GRPO_NUM_GENERATIONS of both runs")
    ap.add_argument("--rounds", type=int, default=CAP, help="GRPO_DYNAMIC_SAMPLING_ROUNDS of the dynamic run")
    ap.add_argument("--model", default="", help=f"the demo's learner (default), or {REAL_MODEL}")
    ap.add_argument("--tracked", default=None, help="with --model: the tracked GRPO run folder to replay (default for "
                                                    f"{REAL_MODEL}: bench_real's base + GRPO run)")
    args = ap.parse_args(argv)
    if args.model and args.model != REAL_MODEL and not args.tracked:
        sys.exit(f"--model {args.model}: not a model this benchmark knows (the tiny learner by default, {REAL_MODEL}, "
                 "or any model whose GRPO run --tracked names)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from transformers.utils import logging as hf_logging
    quiet_library_warnings()
    if args.model:
        t0 = time.time()
        row = real_model_row(args)
        row["seconds"] = round(time.time() - t0)
        if args.json:
            path = Path(args.json)
            held = json.loads(path.read_text()) if path.is_file() else {}
            path.write_text(json.dumps({**held, args.model: row}, indent=2) + "\n")
        return 0
    out = fresh_run_dir(args.out, MARK)
    t0 = time.time()
    recipe = replace(RECIPE, generations=str(args.generations))
    model = ensure_learner_model(learner_model_dir(cache_dir(os.environ)))
    echo = lambda l: l.startswith(("[SFT]", "dynamic sampling", "problem states", "done in", "warning"))  # noqa: E731

    sft2 = sft_start(recipe, model, out, echo)  # bench_selection's: 2 mastered, 2 partly learned problems
    problems = write_problems(out / "problems.jsonl", recipe.train_ids)

    def grpo(name: str, steps: int, **extra) -> Path:
        env = {**demo.grpo_env(recipe, sft2, out / name), "TRAINING_DATASET": str(problems),
               "GRPO_BATCH_SIZE": str(BATCH), "GRPO_MAX_STEPS": str(steps), "GRPO_SEED": str(args.seed),
               **{k: str(v) for k, v in extra.items()}}
        demo.run_stage(f"GRPO {name}", [str(demo.TRAIN)], env, out, out / f"{name}.out", echo)
        return out / name

    per_round = BATCH * args.generations
    dynamic = grpo("dynamic", args.steps, GRPO_DYNAMIC_SAMPLING=1, GRPO_DYNAMIC_SAMPLING_ROUNDS=args.rounds)
    # the rule without its threshold: every group whose rewards differ at all teaches (the tracker's too)
    any_spread = grpo("dynamic_any_spread", args.steps, GRPO_DYNAMIC_SAMPLING=1,
                      GRPO_DYNAMIC_SAMPLING_ROUNDS=args.rounds, GRPO_LEARNABLE_MIN_STD=0)
    budget = sum(tokens_per_step(dynamic, per_round))
    # a dynamic round generates what a tracked step does: about as many steps as rounds, and a margin
    longest = int(sum((r.dynamic or {}).get("generation_rounds") or 1 for r in records(dynamic))) + 4
    tracked = grpo("tracked", longest, GRPO_SAVE_STEPS=1, GRPO_SAVE_TOTAL_LIMIT=longest)
    tracked_tokens = tokens_per_step(tracked, per_round)
    matched, spent, tracked_model = matched_model(tracked, tracked_tokens, budget)

    print("\n== before/after, sampled as GRPO samples (same seed), training grader", flush=True)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    all_problems = load_problems(str(problems))
    splits = {"learnable": [p for p in all_problems if p.id in PARTIAL], "all": all_problems}
    table = demo.compare({"SFT": str(sft2 / "final_model"), "tracked": tracked_model,
                          "dynamic": demo.merge_adapter(dynamic), "dynamic_any_spread": demo.merge_adapter(any_spread)},
                         splits, recipe)

    runs = {"tracked": tracked, "dynamic": dynamic, "dynamic_any_spread": any_spread}
    results = {"tracked": curve(tracked, per_round, matched), "dynamic": curve(dynamic, per_round, args.steps),
               "dynamic_any_spread": curve(any_spread, per_round, args.steps)}
    results["tracked"]["frac_zero_std_trained"] = results["tracked"]["frac_zero_std"]  # it trains on every group
    for name in ("dynamic", "dynamic_any_spread"):
        results[name] |= dynamic_summary(runs[name], per_round, args.rounds)
    # the tracked run's groups that teach, by dynamic sampling's rule, up to the matched step
    tracked_teaching = tracked_teaching_groups(tracked, matched, args.generations, MIN_STD)
    results["tracked"]["tokens_per_kept_group"] = round(spent / tracked_teaching) if tracked_teaching else None
    for name in runs:
        for split in splits:
            results[name][f"{split}_before"] = table["SFT"][split]["mean_reward"]
            results[name][f"{split}_after"] = table[name][split]["mean_reward"]
    results["setup"] = {"problems": {"mastered": MASTERED, "partial": PARTIAL, "never_seen": NEVER_SEEN},
                        "batch": BATCH, "generations": args.generations, "rounds_cap": args.rounds, "seed": args.seed,
                        "model": "the demo's learner (441k parameters)", "dynamic_steps": args.steps,
                        "tracked_steps_matched": matched}
    results["seconds"] = round(time.time() - t0)

    print_table(["run", "GRPO steps", "generated tokens", "tokens per group that teaches", "frac_zero_std generated", "trained",
                 "training reward (mean / last quarter)", "learnable before", "after", "all 8 before", "after"],
                [[name, str(r["steps"]), str(r["tokens"]), str(r["tokens_per_kept_group"]), f"{r['frac_zero_std']:.3f}",
                  f"{r['frac_zero_std_trained']:.3f}", f"{r['reward_mean']:.3f} / {r['reward_last_quarter']:.3f}", f"{r['learnable_before']:.3f}", f"{r['learnable_after']:.3f}", f"{r['all_before']:.3f}",
                  f"{r['all_after']:.3f}"] for name, r in ((n, results[n]) for n in runs)])
    for name in ("dynamic", "dynamic_any_spread"):
        d = results[name]
        print(f"\n{name}: rounds per step {d['rounds_per_step']}; {d['steps_at_cap']} step(s) at the cap; "
              f"{d['steps_below_cap_with_zero_std']} step(s) below the cap trained a group that teaches nothing; "
              f"dropped {d['dropped']}; {d['tokens_trained']:.0%} of generated tokens trained")
    print(f"{results['seconds']} s")
    if args.json:  # one file for every seed: a run adds its seed's results to what the file holds
        path = Path(args.json)
        held = json.loads(path.read_text()) if path.is_file() else {}
        seeds = {**held.get("seeds", {}), str(args.seed): results}
        path.write_text(json.dumps({**held, "seeds": seeds}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
