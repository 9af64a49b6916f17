"""Same grades from both compile paths: the compile server and one `ocamlc` per step.

    python -m bench.compare_compilers [--exercises PATH] [--loops]

Grades, with OCAML_COMPILER=server and with OCAML_COMPILER=ocamlc, every bundled problem's
reference solution, stub, type error and syntax error, the bench's no-loop corpus (the ocaml.org
exercises, when BENCHMARKS_DIR has them) and its mixed corpus (its infinite loops only with
--loops: 5 s of CPU each), and compares every Grade field. Exit status 1 on any difference.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

from bench.corpus import build_corpus, default_exercises, no_loop_corpus, variants
from ocaml_grpo.grading.completions import assemble_solution, extract_code
from ocaml_grpo.grading.grader import OcamlGrader
from ocaml_grpo.problems import Problem, load_problems
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.config import SandboxConfig
from ocaml_grpo.config.settings import from_env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exercises", default=str(default_exercises()))
    ap.add_argument("--loops", action="store_true", help="include the mixed corpus's infinite loops")
    args = ap.parse_args()
    bundled = load_problems("bundled")
    jobs: list[tuple[Problem, str, str]] = []
    for p in bundled:
        for kind, code in variants(p).items() if p.solution else ():
            if kind != "infinite_loop":
                jobs.append((p, f"```ocaml\n{code}\n```", f"bundled {kind}"))
    runnable = [p for p in bundled if p.solution and not p.requires]
    if Path(args.exercises).is_file():
        exercises = [p for p in load_problems(args.exercises) if p.solution and not p.requires]
        jobs += [(p, c, f"no-loop {k}") for p, c, k in no_loop_corpus(exercises)]
    jobs += [(p, c, f"mixed {k}") for p, c, k in build_corpus(runnable, 48, 4)
             if args.loops or k != "infinite_loop"]
    sandbox = Sandbox(from_env(SandboxConfig, os.environ))
    graders = {name: OcamlGrader(sandbox, compiler=name) for name in ("server", "ocamlc")}
    differ = 0
    try:
        for p, completion, label in jobs:
            solution, entries = assemble_solution(extract_code(completion), p.prompt, p.entry_point)
            a, b = (asdict(g.grade(solution, p.tests, p.requires, entries, p.prompt)) for g in graders.values())
            if a != b:
                differ += 1
                fields = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
                print(f"DIFFERENT {p.id} ({label}): {fields}")
    finally:
        for g in graders.values():
            g.close()
    print(f"{len(jobs)} completions graded by both paths: {len(jobs) - differ} identical, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
