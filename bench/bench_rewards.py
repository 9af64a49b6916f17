"""Grader throughput: this grader (isolation on) against a naive reference pipeline, side by side.

    python -m bench.bench_rewards [--problems data/ocaml_problems.jsonl] [--n 48]

The corpus is fixed and mixed, built from the bundled problems' reference solutions:
correct answers, type errors, syntax errors, failing tests, infinite loops and duplicates.
The naive pipeline is what a first version would do: `ocamlc -c`, `ocamlc -o`, run, one
completion after another, no isolation, the CPU limit as its wall-clock limit per run.
Then a GRPO-sized batch of 24 completions with 6 infinite loops is timed on its own.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace

from ocaml_grpo.problems import Problem, load_problems
from ocaml_grpo.completions import assemble_solution, extract_code
from rewards import RewardConfig, RewardScorer
from ocaml_grpo import ocaml_source as src


def variants(p: Problem) -> dict[str, str]:
    sig = src.parse_signature(p.prompt).signature
    return {
        "correct": p.solution,
        "type_error": f"{sig}\n  let x = 1 +. 2.0 in\n  ignore x;\n  failwith \"unreachable\"",
        "syntax_error": p.solution.rstrip() + "\nlet broken = (1 +\n",
        "failing_tests": f"{sig}\n  failwith \"todo\"",
        "infinite_loop": f"{sig}\n  let rec spin n = if n < 0 then failwith \"never\" else spin (n + 1) in\n  spin 0",
    }


def build_corpus(problems: list[Problem], n: int, loops: int, seed: int = 0) -> list[tuple[Problem, str, str]]:
    rng = random.Random(seed)
    kinds = ["correct"] * 4 + ["type_error"] * 2 + ["syntax_error"] * 2 + ["failing_tests"] * 2
    corpus = []
    for i in range(n - loops):
        p = problems[i % len(problems)]
        kind = "duplicate" if i % 8 == 7 and corpus else rng.choice(kinds)
        if kind == "duplicate":
            corpus.append(rng.choice(corpus)[:2] + ("duplicate",))
        else:
            corpus.append((p, f"```ocaml\n{variants(p)[kind]}\n```\n(* END *)", kind))
    for i in range(loops):
        p = problems[(n + i) % len(problems)]
        corpus.append((p, f"```ocaml\n{variants(p)['infinite_loop']}\n```\n(* END *)", "infinite_loop"))
    rng.shuffle(corpus)
    return corpus


def naive_score(p: Problem, completion: str, wall_s: float) -> bool:
    """ocamlc -c, ocamlc -o, run: sequential, unisolated. Returns whether the tests passed."""
    solution, _ = assemble_solution(extract_code(completion), p.prompt)
    d = tempfile.mkdtemp(prefix="naive-")
    try:
        with open(os.path.join(d, "main.ml"), "w") as f:
            f.write(solution + "\n;;\n" + p.tests + "\n")
        if subprocess.run(["ocamlc", "-w", "-a", "-c", "main.ml"], cwd=d, capture_output=True).returncode:
            return False
        if subprocess.run(["ocamlc", "-w", "-a", "-o", "main", "main.ml"], cwd=d, capture_output=True).returncode:
            return False
        try:
            return subprocess.run(["./main"], cwd=d, capture_output=True, timeout=wall_s).returncode == 0
        except subprocess.TimeoutExpired:
            return False
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default="bundled")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--loops", type=int, default=4)
    args = ap.parse_args()
    problems = [p for p in load_problems(args.problems) if p.solution and not p.requires]
    corpus = build_corpus(problems, args.n, args.loops)
    cfg = RewardConfig.from_env()
    scorer = RewardScorer(replace(cfg, min_lines=0))
    wall = scorer.grader.sandbox.limits.cpu_s  # the naive pipeline's per-run limit
    print(f"cores={os.cpu_count()} workers={cfg.workers} cpu_limit={wall}s  {scorer.grader.sandbox.describe()}")
    counts = {k: sum(1 for c in corpus if c[2] == k) for k in sorted({c[2] for c in corpus})}
    print(f"corpus: {len(corpus)} completions {counts}")

    t0 = time.perf_counter()
    naive = [naive_score(p, c, wall) for p, c, _ in corpus]
    t_naive = time.perf_counter() - t0

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

    no_loops = [c for c in corpus if c[2] != "infinite_loop"]
    scorer._cache.clear()
    t0 = time.perf_counter()
    for p, c, _ in no_loops:
        naive_score(p, c, wall)
    t_naive_nl = time.perf_counter() - t0
    t0 = time.perf_counter()
    scorer.score_batch([c[0] for c in no_loops], [c[1] for c in no_loops])
    t_ours_nl = time.perf_counter() - t0

    print(f"{'pipeline':<34}{'seconds':>9}{'completions/s':>15}")
    print(f"{'naive (sequential, no isolation)':<34}{t_naive:>9.2f}{len(corpus) / t_naive:>15.1f}")
    print(f"{'this grader (bwrap, parallel)':<34}{t_ours:>9.2f}{len(corpus) / t_ours:>15.1f}")
    print(f"speed-up on the mixed corpus: {t_naive / t_ours:.1f}x   (all-tests-pass verdicts agree: {agree}/{len(corpus)})")
    print(f"without the infinite loops ({len(no_loops)} completions): naive {t_naive_nl:.2f}s, "
          f"grader {t_ours_nl:.2f}s, speed-up {t_naive_nl / t_ours_nl:.1f}x")

    batch = build_corpus(problems, 24, 6, seed=1)
    scorer._cache.clear()
    t0 = time.perf_counter()
    res = scorer.score_batch([c[0] for c in batch], [c[1] for c in batch])
    t_batch = time.perf_counter() - t0
    limit, slots = scorer.grader.sandbox.limits.cpu_s, cfg.workers
    # Each loop is owed its whole CPU budget (a slow correct answer must not be cut short by its
    # neighbours), so the fair floor is the loops' CPU shared over the run slots.
    floor = -(-6 // slots) * limit
    print(f"GRPO batch of 24 with 6 infinite loops: {t_batch:.2f}s (bound: 6 loops x CPU limit {limit}s over "
          f"{slots} run slots = {floor}s, + 0.5s: {'met' if t_batch <= floor + 0.5 else 'MISSED'}); "
          f"timed out: {sum(b.timed_out for b in res)}")
    scorer.close()


if __name__ == "__main__":
    main()
