"""One pass of a new grader process over the no-loop corpus, start-up included (trusted programs
read from disk when there): the figure issue #36's speed goal is about, as one JSON line, so that
checkouts and settings can be alternated in one shell loop on a quiet machine.

    python bench/cold_pass.py --naive                  # the naive pipeline, same corpus
    python bench/cold_pass.py                          # this checkout's grader
    (cd ../old-checkout && python /path/to/bench/cold_pass.py)   # another checkout's grader
    python bench/cold_pass.py --run-slots 3 --compile-slots 4

Run from a checkout's root: it grades with that checkout's code (bench.bench_rewards' corpus and
naive pipeline). BENCHMARKS_DIR names ../shared/benchmarks when the checkout is elsewhere.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.getcwd())

from bench.bench_rewards import default_exercises, naive_score, no_loop_corpus
from ocaml_grpo.grading import grader as grader_module
from ocaml_grpo.problems import load_problems
from rewards import RewardConfig, RewardScorer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--naive", action="store_true", help="time the naive pipeline instead")
    ap.add_argument("--run-slots", type=int, default=0, help="test-run slots (default: the grader's, the cores)")
    ap.add_argument("--compile-slots", type=int, default=0, help="compile servers (default: the grader's, cores + 1)")
    a = ap.parse_args()
    corpus = no_loop_corpus([p for p in load_problems(str(default_exercises())) if p.solution and not p.requires])
    cfg = RewardConfig(min_lines=0)
    if a.naive:
        scorer = RewardScorer(cfg)
        toolchain, wall = scorer.grader.sandbox.toolchain, scorer.grader.sandbox.limits.cpu_s
        scorer.close()
        t0 = time.perf_counter()
        solved = sum(naive_score(p, c, wall, toolchain) for p, c, _ in corpus)
        print(json.dumps({"naive_s": round(time.perf_counter() - t0, 3), "solved": solved}))
        return
    if a.compile_slots:
        make = grader_module.Compilers
        grader_module.Compilers = lambda sandbox, root, _n, kind: make(sandbox, root, a.compile_slots, kind)
    t0 = time.perf_counter()
    scorer = RewardScorer(cfg)
    if a.run_slots:
        scorer.grader._run_slots = threading.BoundedSemaphore(a.run_slots)
    grades = scorer.score_batch([c[0] for c in corpus], [c[1] for c in corpus])
    seconds = time.perf_counter() - t0
    scorer.close()
    print(json.dumps({"grader_s": round(seconds, 3), "solved": sum(b.solved for b in grades)}))


if __name__ == "__main__":
    main()
