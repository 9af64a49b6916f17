"""The two programs of a grading, rendered as text, and what the trusted one reported.

- `render_trusted`: the prompt's definitions, a stub per entry point (ocaml_grpo/grading/oracle.py), the
  tests with each assertion wrapped by the wire's `check`. Built once per problem; it holds every
  expected value and never runs model code.
- `render_oracle`: the answer as module `Solution`, its entry points bound at the prompt's types
  (in `entry.ml`: a mismatch there is the answer's error), then the loop serving the trusted
  program's calls. The tests' text never enters it.
ocaml_grpo/grading/grader.py compiles, runs and judges them.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.interface import Interface
from ocaml_grpo.grading.oracle import entry_aliases, entry_check, oracle_server, trusted_stubs
from ocaml_grpo.grading.shipped import Lambda

WIRE_ML = (Path(__file__).resolve().parent / "ocaml" / "wire.ml").read_text()
HANDLES_C = (Path(__file__).resolve().parent / "ocaml" / "handles.c").read_text()  # the trusted program's, for abstract types
ENTRY_FILE = "entry.ml"  # where the oracle binds the entry points: an error there is the answer's

_plan_lock = threading.Lock()


def plan_of(tests: str) -> src.TestPlan | None:
    """The tests' per-assertion plan, parsed once per problem (every completion of a GRPO group
    shares its tests; the Python lexer takes ~1-10 ms on a test file). Read-only. One parse at a
    time: the graders of a group start together, and would each parse the same tests (measured:
    5 parses per problem on the no-loop benchmark, 0.3 s of CPU), which holds the GIL anyway."""
    with _plan_lock:
        return _parsed_plan(tests)


@functools.lru_cache(maxsize=1024)
def _parsed_plan(tests: str) -> src.TestPlan | None:
    return src.parse_assert_tests(tests)


@dataclass
class RunTally:
    began: set[int] = field(default_factory=set)
    passed: set[int] = field(default_factory=set)
    finished: bool = False
    oracle_lost_in: int | None = None  # the assertion during which the oracle died or broke the wire
    oracle_never_ready: bool = False  # it died before serving anything (the answer's top level)
    returned: bool = False  # a call of the answer's returned a value (else it only raised, or never returned)
    varied: bool = False  # two calls of one entry point gave back different values or changes (wire.ml, `noted`)
    args_varied: bool = False  # two calls of one entry point were given different arguments


def tally_run(text: str, start: int, total: int) -> RunTally:
    """What one run of the trusted program reported (it alone writes there). Only assertions this
    run was asked to run count (start <= i < total), each once."""
    t = RunTally()
    for ln in text.splitlines():
        parts = ln.split(" ")
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            continue
        tag, i = parts[0], int(parts[1])
        if tag == "D":
            t.finished = True
        elif tag == "I":
            t.oracle_never_ready = True
        elif tag == "R":
            t.returned = True
        elif tag == "V":
            t.varied = True
        elif tag == "A":
            t.args_varied = True
        elif start <= i < total:
            if tag == "S":
                t.began.add(i)
            elif tag == "P":
                t.passed.add(i)
            elif tag == "K":
                t.oracle_lost_in = i
    return t


def render_trusted(iface: Interface, tests: str, plan: src.TestPlan | None, wire: str) -> str:
    head = [f"let () = {wire}.start_trusted ()", iface.preamble, trusted_stubs(iface, wire)]
    body: list[str] = []
    if plan is None:
        body.append(tests)
    else:
        k = 0
        for item in plan.items:
            if isinstance(item, str):
                body.append(item)
                continue
            lines = ["let () ="] + [f"  {b}" for b in item.bindings]
            for is_assert, stmt in item.statements:
                if is_assert:
                    lines.append(f"  {wire}.check {k} (fun () -> {stmt});")
                    k += 1
                else:
                    lines.append(f"  {stmt};")
            lines += ["  ()", ";;"]
            body.append("\n".join(lines))
    return "\n;;\n".join(head) + "\n;;\n" + "\n".join(body) + f"\n;;\nlet () = {wire}.finish ()\n"


def render_oracle(solution: str, iface: Interface, wire: str, lambdas: tuple[Lambda, ...] = (),
                  lambda_unit: str = "", strict: bool = False) -> str:
    """The answer is typed here exactly as alone (nothing precedes it); the code after it never
    opens it, so nothing the answer defines changes what the wire means. `strict`: each entry
    point is first bound directly at the prompt's type, its type variables quantified
    (oracle.entry_check): an entry point that is weak, or whose labels the prompt lacks, fails
    it, and the grader then decides by the tests appended to the answer (grader._compile)."""
    check = entry_check(iface, eta=False) if strict and not iface.functor else ""
    return "\n".join(_solution_module(solution, iface) + [check + oracle_server(iface, wire, lambdas, lambda_unit,
                                                                                  direct=bool(check))])


def render_entry_check(solution: str, iface: Interface, eta: bool = True) -> str:
    """The answer's module, then each entry point bound at the prompt's type as the prompt wrote
    it (oracle.entry_check): compiles exactly when the answer defines every entry point as asked."""
    return "\n".join(_solution_module(solution, iface) + [entry_check(iface, eta)])


def _solution_module(solution: str, iface: Interface) -> list[str]:
    # `;;` first: whatever the answer's last phrase leaves open (a trailing `;`, as `end` allowed)
    # ends there, and the aliases cannot continue it.
    return ["module Solution = struct", '# 1 "solution.ml"', solution, f'# 1 "{ENTRY_FILE}"', ";;",
            entry_aliases(iface), "end"]
