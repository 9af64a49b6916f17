"""Grader throughput: this grader (isolation on) against a naive reference pipeline, side by side.

    python -m bench.bench_rewards [--problems bundled] [--n 48] [--exercises PATH]

Two fixed corpora, each timed with both pipelines in the same run (the no-loop corpus in three
rounds, naive then grader, every grader pass with its caches emptied; the median round is shown):
- no loops (issue #12's): the 55 ocaml.org exercises (`ocamlorg_exercises.jsonl` from
  BENCHMARKS_DIR, default ../shared/benchmarks) x {correct, stub, type error, syntax error},
  plus 25% duplicates: 275 completions. Without that file: the bundled problems, the same way.
- mixed: built from the bundled problems' reference solutions: correct answers, type errors,
  syntax errors, failing tests, infinite loops and duplicates.
The naive pipeline is what a first version would do: `ocamlc -c`, `ocamlc -o`, run, one
completion after another, no isolation, the CPU limit as its wall-clock limit per run.
Then a GRPO-sized batch of 24 completions with 6 infinite loops is timed on its own. Last, the
no-loop corpus as a new grader process sees it, start-up included: once with no trusted program on
disk (each problem's is built), once with them there (OCAML_CACHE_DIR/trusted/).
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

from bench.corpus import build_corpus, default_exercises, machine_busy_s, naive_score, no_loop_corpus
from ocaml_grpo.grading import harness
from ocaml_grpo.grading import source as src
from ocaml_grpo.problems import Problem, load_problems
from ocaml_grpo.config.settings import from_env
from rewards import RewardConfig, RewardScorer


def forget(scorer: RewardScorer) -> None:
    """Empty every cache a grading fills (results, test plans, lexed text): each pass is a first."""
    scorer._cache.clear()
    harness._parsed_plan.cache_clear()
    src._cached_tokens.cache_clear()
    src._cached_phrases.cache_clear()


def side_by_side(name: str, corpus: list[tuple[Problem, str, str]], scorer: RewardScorer, wall: float,
                 rounds: int = 1) -> dict:
    """Both pipelines on one corpus, one after the other, `rounds` times (the grader's caches
    emptied before each of its passes); the verdicts compared; the median round reported."""
    counts = {k: sum(1 for c in corpus if c[2] == k) for k in sorted({c[2] for c in corpus})}
    print(f"{name} corpus: {len(corpus)} completions {counts}")
    runs = []
    for r in range(rounds):
        t0 = time.perf_counter()
        naive = [naive_score(p, c, wall, scorer.grader.sandbox.toolchain) for p, c, _ in corpus]
        t_naive = time.perf_counter() - t0
        forget(scorer)
        t0 = time.perf_counter()
        ours = scorer.score_batch([c[0] for c in corpus], [c[1] for c in corpus])
        t_ours = time.perf_counter() - t0
        agree = 0
        for (p, _, kind), b, ok in zip(corpus, ours, naive):
            if b.solved == ok:
                agree += 1
            else:
                print(f"  verdicts differ: {p.id} ({kind}): naive {ok}, grader {b.tests_passed}/{b.tests_total} "
                      f"timed_out={b.timed_out} {b.elapsed_ms:.0f} ms {b.first_error or ''}")
        runs.append({"name": name, "n": len(corpus), "naive": t_naive, "ours": t_ours, "agree": agree})
        if rounds > 1:
            print(f"  round {r + 1}: naive {t_naive:.2f}s, grader {t_ours:.2f}s: {t_naive / t_ours:.1f}x")
    return sorted(runs, key=lambda x: x["naive"] / x["ours"])[len(runs) // 2]


def cold_starts(corpus: list[tuple[Problem, str, str]], cfg: RewardConfig, naive_s: float) -> None:
    """A new grader process's view, start-up included (a fresh scorer, its in-memory caches empty):
    with the on-disk trusted programs removed first, then with them kept from that pass."""
    trusted = Path(cfg.sandbox.cache) / "trusted"
    for label, empty in (("cold start, no trusted programs on disk", True), ("cold start, trusted programs on disk", False)):
        if empty:
            shutil.rmtree(trusted, ignore_errors=True)
        harness._parsed_plan.cache_clear()
        src._cached_tokens.cache_clear()
        src._cached_phrases.cache_clear()
        t0 = time.perf_counter()
        scorer = RewardScorer(replace(cfg, min_lines=0))
        scorer.score_batch([c[0] for c in corpus], [c[1] for c in corpus])
        t = time.perf_counter() - t0
        scorer.close()
        print(f"{label}: {len(corpus)} completions in {t:.2f}s, {naive_s / t:.2f}x the naive pipeline's {naive_s:.2f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default="bundled")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--loops", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="side-by-side rounds on the no-loop corpus (median shown)")
    ap.add_argument("--exercises", default=str(default_exercises()))
    args = ap.parse_args()
    problems = [p for p in load_problems(args.problems) if p.solution and not p.requires]
    exercises = problems
    if Path(args.exercises).is_file():
        exercises = [p for p in load_problems(args.exercises) if p.solution and not p.requires]
    else:
        print(f"note: {args.exercises} not found: the no-loop corpus is built from {args.problems}")
    cfg = from_env(RewardConfig, os.environ)
    scorer = RewardScorer(replace(cfg, min_lines=0))
    wall = scorer.grader.sandbox.limits.cpu_s  # the naive pipeline's per-run limit
    print(f"cores={os.cpu_count()} workers={cfg.workers} cpu_limit={wall}s compiler={scorer.grader.compiler}  "
          f"{scorer.grader.sandbox.describe()}")
    scorer.score_batch([exercises[0]], [f"```ocaml\n{exercises[0].solution}\n```"])  # start the compile servers
    rows = [side_by_side("no-loop", no_loop_corpus(exercises), scorer, wall, args.rounds),
            side_by_side("mixed", build_corpus(problems, args.n, args.loops), scorer, wall)]
    print(f"{'corpus':<10}{'completions':>12}{'naive s':>9}{'naive /s':>10}{'grader s':>10}{'grader /s':>11}"
          f"{'speed-up':>10}{'verdicts agree':>16}")
    for r in rows:
        print(f"{r['name']:<10}{r['n']:>12}{r['naive']:>9.2f}{r['n'] / r['naive']:>10.1f}{r['ours']:>10.2f}"
              f"{r['n'] / r['ours']:>11.1f}{r['naive'] / r['ours']:>9.1f}x{r['agree']:>11}/{r['n']}")
    limit, slots = scorer.grader.sandbox.limits.cpu_s, cfg.workers
    # Each loop is owed its whole CPU budget: on these run slots no CPU-fair grader spends less
    # than the loops' CPU over the slots on the mixed corpus, whatever it does with the rest.
    fair = -(-args.loops // slots) * limit
    print(f"mixed corpus: its {args.loops} loops cost any CPU-fair grader >= {fair}s on {slots} run slots, "
          f"so its speed-up here is at most {rows[1]['naive'] / fair:.1f}x")

    batch = build_corpus(problems, 24, 6, seed=1)
    forget(scorer)
    c0, t0 = machine_busy_s(), time.perf_counter()
    res = scorer.score_batch([c[0] for c in batch], [c[1] for c in batch])
    t_batch = time.perf_counter() - t0
    # What the batch got of the machine while it ran (the test runs are not our children: the
    # prepared sandboxes start them), from the kernel's count of busy time on every core.
    busy = machine_busy_s() - c0
    # Each loop is owed its whole CPU budget (a slow correct answer must not be cut short by its
    # neighbours), so the fair floor is the loops' CPU shared over the run slots.
    floor = -(-6 // slots) * limit
    print(f"GRPO batch of 24 with 6 infinite loops: {t_batch:.2f}s (bound: 6 loops x CPU limit {limit}s over "
          f"{slots} run slots = {floor}s, + 0.5s: {'met' if t_batch <= floor + 0.5 else 'MISSED'}); "
          f"timed out: {sum(b.timed_out for b in res)}; the machine was busy {busy:.1f}s, "
          f"{100 * busy / (t_batch * (os.cpu_count() or 1)):.0f}% of the {os.cpu_count()} cores over that time")
    scorer.close()
    cold_starts(no_loop_corpus(exercises), cfg, rows[0]["naive"])


if __name__ == "__main__":
    main()
