"""One pass of a new grader process over the no-loop corpus, start-up included (trusted programs
read from disk when there): the figure issue #36's speed goal is about, as one JSON line, so that
checkouts and settings can be alternated in one shell loop on a quiet machine.

    python bench/cold_pass.py --naive                  # the naive pipeline, same corpus
    python bench/cold_pass.py                          # this checkout's grader
    (cd ../old-checkout && python /path/to/bench/cold_pass.py)   # another checkout's grader
    python bench/cold_pass.py --run-slots 3 --compile-slots 4
    python bench/cold_pass.py --cpu                    # and where the CPU went (this checkout only)

Run from a checkout's root: it grades with that checkout's code (bench.bench_rewards' corpus and
naive pipeline). BENCHMARKS_DIR names ../shared/benchmarks when the checkout is elsewhere.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time

sys.path.insert(0, os.getcwd())

from bench.corpus import default_exercises, machine_busy_s, naive_score, no_loop_corpus
from ocaml_grpo.grading import grader as grader_module
from ocaml_grpo.problems import load_problems
from rewards import RewardConfig, RewardScorer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--naive", action="store_true", help="time the naive pipeline instead")
    ap.add_argument("--run-slots", type=int, default=0, help="test-run slots (default: the grader's, the cores)")
    ap.add_argument("--compile-slots", type=int, default=0, help="compile servers (default: the grader's, cores + 1)")
    ap.add_argument("--cpu", action="store_true", help="also where the CPU went: the machine (/proc/stat), the "
                    "grader process, its reaped children (compile servers), the test runs")
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
    runs = count_test_runs() if a.cpu else None
    busy0, self0 = machine_busy_s(), resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    scorer = RewardScorer(cfg)
    if a.run_slots:
        scorer.grader._run_slots = threading.BoundedSemaphore(a.run_slots)
    grades = scorer.score_batch([c[0] for c in corpus], [c[1] for c in corpus])
    seconds = time.perf_counter() - t0
    busy, self1 = machine_busy_s() - busy0, resource.getrusage(resource.RUSAGE_SELF)
    scorer.close()
    out = {"grader_s": round(seconds, 3), "solved": sum(b.solved for b in grades)}
    if a.cpu:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # reaped at close: compile servers
        out |= {"machine_busy_s": round(busy, 2),
                "grader_process_cpu_s": round(self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime, 2),
                "children_cpu_s": round(children.ru_utime + children.ru_stime, 2),
                "test_runs": runs["n"], "test_runs_cpu_s": round(runs["cpu_s"], 2)}
    print(json.dumps(out))


def count_test_runs() -> dict:
    """Count the sandboxed test runs and the CPU each reports (prepared runs are not this
    process's children: their CPU is only in their RunResult)."""
    from ocaml_grpo.grading import sandbox
    totals, lock, run = {"n": 0, "cpu_s": 0.0}, threading.Lock(), sandbox.Sandbox.run

    def counted(self, *args, **kw):
        res = run(self, *args, **kw)
        if kw.get("program") is not None:
            with lock:
                totals["n"] += 1
                totals["cpu_s"] += res.cpu_s
        return res
    sandbox.Sandbox.run = counted
    return totals


if __name__ == "__main__":
    main()
