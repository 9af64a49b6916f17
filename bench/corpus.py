"""The grader benchmarks' corpora and the naive pipeline they are measured against
(bench_rewards, cold_pass, compare_compilers, bench_train's stand-in answers, sandbox_start).

- `variants`: a problem's correct answer and its broken kinds (type error, syntax error, failing
  tests, infinite loop), built from its reference solution;
- `no_loop_corpus` (issue #12's) and `build_corpus` (the mixed one, with loops);
- `naive_score`: `ocamlc -c`, `ocamlc -o`, run: sequential, unisolated;
- `machine_busy_s`: the machine's busy CPU seconds (/proc/stat).
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.completions import assemble_solution, extract_code
from ocaml_grpo.grading.toolcache import Toolchain
from ocaml_grpo.problems import Problem


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


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


def default_exercises() -> Path:
    """The ocaml.org exercises in BENCHMARKS_DIR (default: ../shared/benchmarks beside the repo)."""
    bench_dir = Path(os.environ.get("BENCHMARKS_DIR") or Path(__file__).resolve().parents[2] / "shared" / "benchmarks")
    return bench_dir / "ocamlorg_exercises.jsonl"


def no_loop_corpus(problems: list[Problem], seed: int = 0) -> list[tuple[Problem, str, str]]:
    """Every problem x {correct, stub, type error, syntax error}, plus 25% duplicates, shuffled."""
    rng = random.Random(seed)
    corpus = [(p, f"```ocaml\n{variants(p)[kind]}\n```\n(* END *)", kind) for p in problems
              for kind in ("correct", "failing_tests", "type_error", "syntax_error")]
    corpus += [rng.choice(corpus)[:2] + ("duplicate",) for _ in range(len(corpus) // 4)]
    rng.shuffle(corpus)
    return corpus


def naive_score(p: Problem, completion: str, wall_s: float, toolchain: Toolchain) -> bool:
    """ocamlc -c, ocamlc -o, run: sequential, unisolated, with the grader's toolchain (the system's,
    or the offline bundle's). Returns whether the tests passed."""
    solution, _ = assemble_solution(extract_code(completion), p.prompt)
    ocamlc, ocamlrun = toolchain.which("ocamlc", "ocaml-nox"), toolchain.which("ocamlrun", "ocaml-nox")
    d = tempfile.mkdtemp(prefix="naive-")
    try:
        with open(os.path.join(d, "main.ml"), "w") as f:
            f.write(solution + "\n;;\n" + p.tests + "\n")
        for args in (["-c", "main.ml"], ["-o", "main", "main.ml"]):
            if subprocess.run([ocamlc, "-w", "-a", *args], cwd=d, env=toolchain.host_env, capture_output=True).returncode:
                return False
        try:
            return subprocess.run([ocamlrun, "main"], cwd=d, env=toolchain.host_env, capture_output=True,
                                  timeout=wall_s).returncode == 0
        except subprocess.TimeoutExpired:
            return False
    finally:
        shutil.rmtree(d, ignore_errors=True)
