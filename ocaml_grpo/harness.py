"""The test program: the trusted harness, the tests rendered around a solution, and what a run
reported. ocaml_grpo/grader.py compiles, runs and judges it."""
from __future__ import annotations

import functools
import secrets
import threading
from dataclasses import dataclass, field

from ocaml_grpo import ocaml_source as src

HARNESS_ML = r"""
(* Trusted: linked before the solution, so it reads the nonce before any model code runs. *)
external fd_out : int -> out_channel = "caml_ml_open_descriptor_out"
(* The runtime has loaded the program; its file (holding the tests' constants) goes now. *)
let () = try Sys.remove Sys.executable_name with Sys_error _ -> ()
external fd_in : int -> in_channel = "caml_ml_open_descriptor_in"
let nonce, start =
  let ic = fd_in (int_of_string Sys.argv.(2)) in
  let n = input_line ic in
  let s = int_of_string (input_line ic) in
  close_in ic;
  n, s
let oc = fd_out (int_of_string Sys.argv.(1))
(* Straight into the channel's buffer (outside the OCaml heap): no garbage string holding the
   nonce is left for an uninitialised `Bytes.create` to find. *)
let emit tag i =
  output_string oc nonce; output_char oc ' '; output_string oc tag; output_char oc ' ';
  output_string oc (string_of_int i); output_char oc '\n';
  flush oc
let check i f =
  if i >= start then begin
    emit "S" i;
    match f () with
    | () -> emit "P" i
    | exception _ -> emit "F" i
  end
let finish () = emit "D" 0
"""


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
    done: set[int] = field(default_factory=set)
    passed: set[int] = field(default_factory=set)
    finished: bool = False


def tally_run(text: str, nonce: str, start: int, total: int) -> RunTally:
    """What one run of the test program reported. Only lines carrying the run's nonce count, and
    only for assertions this run was asked to run (start <= i < total), each once: whatever a
    program writes, it cannot pass more assertions than the tests hold."""
    t = RunTally()
    for tag, i in parse_events(text, nonce):
        if tag == "D":
            t.finished = True
        elif start <= i < total:
            if tag == "S":
                t.began.add(i)
            elif tag in ("P", "F"):
                t.done.add(i)
                if tag == "P":
                    t.passed.add(i)
    return t


def parse_events(text: str, nonce: str) -> list[tuple[str, int]]:
    events = []
    for ln in text.splitlines():
        parts = ln.split(" ")
        if len(parts) == 3 and parts[0] == nonce and parts[1] in ("S", "P", "F", "D") and parts[2].isdigit():
            events.append((parts[1], int(parts[2])))
    return events


def render_tests(solution: str, tests: str, plan: src.TestPlan | None, harness: str, entries: list[str]) -> str:
    """One program: the solution as module `Solution`, the harness alias, then the tests.

    Stdlib is opened after the solution, so a solution that redefines `=`, `List` or `exit`
    cannot change what the tests mean. Each assertion runs inside the harness's `check`. The
    solution sees nothing the program defines: it is typed there as it is alone (the compile
    server types it only there when the program compiles)."""
    tag = secrets.token_hex(6)
    alias, stdlib = f"H_{tag}", f"Stdlib_{tag}"  # names taken before `open Solution` can shadow them
    head = ["module Solution = struct", '# 1 "solution.ml"', solution, '# 1 "tests.ml"', "end",
            f"module {alias} = {harness}", f"module {stdlib} = Stdlib", "open Solution", f"open! {stdlib}"]
    head += [f"let {e} = Solution.{e}" for e in entries]
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
                    lines.append(f"  {alias}.check {k} (fun () -> {stmt});")
                    k += 1
                else:
                    lines.append(f"  {stmt};")
            lines += ["  ()", ";;"]
            body.append("\n".join(lines))
    return "\n".join(head) + "\n;;\n" + "\n".join(body) + f"\n;;\nlet () = {alias}.finish ()\n"
