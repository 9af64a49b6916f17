"""Dataset audit speed: 1,000 problems audited cold (empty cache), then again (cached).

    python -m bench.bench_audit [--n 1000]

The problems are the bundled ones repeated with distinct ids and a distinct comment in the
tests, so no two share a cache entry. Target: < 30 s cold, < 2 s cached, on 2 cores.
"""
import argparse
import os
import tempfile
import time
from dataclasses import replace

from ocaml_grpo.grading.audit import audit_problems, summary
from ocaml_grpo.problems import load_problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    base = load_problems("bundled")
    problems = [replace(base[i % len(base)], id=f"{base[i % len(base)].id}#{i}",
                        tests=base[i % len(base)].tests + f"\n(* copy {i} *)\n") for i in range(args.n)]
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        cold = audit_problems(problems, cache_dir=cache, verbose=False)
        t_cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        audit_problems(problems, cache_dir=cache, verbose=False)
        t_warm = time.perf_counter() - t0
    print(f"cores={os.cpu_count()}  {summary(cold)}")
    print(f"cold: {t_cold:.1f}s ({args.n / t_cold:.0f} problems/s; target < 30 s)   "
          f"cached: {t_warm:.2f}s (target < 2 s)")


if __name__ == "__main__":
    main()
