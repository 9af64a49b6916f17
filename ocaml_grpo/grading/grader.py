"""Grading one solution against its tests with the real compiler, inside ocaml_sandbox's sandbox.

1. type check the solution alone; the compiler's typed tree decides which library code it
   reaches, against an allowlist (ocaml_grpo/grading/ocaml/allowlist.txt): anything else earns no test
   credit (the compile server gives the same answer typing the solution once, inside the test
   program of step 2). If it fails, count independent errors phrase by phrase (the compiler's
   structure items), within one compile limit for the whole completion;
2. link it into the oracle (harness.render_oracle): the answer as module `Solution`, each entry
   point bound at the prompt's type, serving calls with values and nothing else;
3. run the oracle beside the trusted program (built once per problem: the prompt's definitions,
   a stub per entry point that asks the oracle, the tests). The trusted program decides every
   assertion and reports on a descriptor the oracle never holds; the oracle never holds an
   expected value. One run per answer (an oracle that dies fails the rest: no restart resets
   the answer's state); runs are bounded by the cores and judged by the CPU time the oracle used.
Compile steps return values (`Reply`) from either path of ocaml_grpo/grading/compilers.py.
"""
from __future__ import annotations

import fcntl
import functools
import math
import os
import secrets
import signal
import shutil
import subprocess
import tempfile
import threading
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path

from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.diagnostics import TIMED_OUT, CompileError, error_of
from ocaml_grpo.grading.compilers import WARNINGS_OFF, CompileBudget, Compilers, Steps
from ocaml_grpo.grading.harness import (ENTRY_FILE, WIRE_ML, plan_of, render_entry_check, render_oracle,
                                        render_trusted, RunTally, tally_run)
from ocaml_grpo.grading.interface import Interface, interface_of
from ocaml_grpo.grading.oracle import ENTRY_ALIAS, ENTRY_MODULE
from ocaml_grpo.grading.trusted import TrustedPrograms
from ocaml_grpo.grading.sandbox import Sandbox, blocked
from ocaml_grpo.grading.toolcache import ToolchainError

# Only a trigger for a second, `-i`, type check that decides (the message itself is text a
# solution can print with [%%ocaml.error "..."]).
NONGENERALIZABLE = "contains type variables that cannot be generalized"
RUN_NICE = 15  # model code yields the CPU to compiles and to the trainer
RESULTS_READ_CAP = 4 << 20  # bytes of result lines read back; the trusted program writes ~20 per assertion
CPU_TIMEOUT_SLACK_S = 0.05  # a run that used its CPU budget less this much was stopped by the CPU limit
IDLE_LIMIT_S = 2.0  # an oracle blocked this long (using no CPU, e.g. reading a device) is stopped
# The trusted program's CPU seconds beyond the oracle's: it builds the tests' inputs and reads replies.
TRUSTED_CPU_EXTRA_S = 10


@dataclass
class Grade:
    """Facts about one solution; rewards.py turns them into a score."""
    compile_errors: list[CompileError] = field(default_factory=list)  # independent errors, syntax ones included
    phrases_total: int = 0
    phrases_ok: int = 0
    compiled: bool = False  # the solution alone compiles to bytecode
    tests_compiled: bool = False  # the solution links with the tests
    tests_passed: int = 0
    tests_total: int = 0
    passed_ids: list[int] = field(default_factory=list)  # which assertions passed (0-based, in test order)
    timed_out: bool = False  # the test runs used their CPU budget
    compile_timed_out: bool = False  # a check was stopped by the compile budget (before a program was built)
    forbidden: str | None = None  # first library path off the allowlist (or `external`): no test credit
    test_error: str | None = None  # first error compiling the tests against the solution
    unverifiable: str | None = None  # why the tests cannot be run outside the answer's process: no test credit
    returned: bool = False  # in the test run, a call of the answer's returned a value
    varied: bool = False  # ... two calls of one entry point gave back different values or changes
    args_varied: bool = False  # ... two calls of one entry point were given different arguments
    # a phrase was left out for a name of a broken phrase that no stand-in can declare (a failed
    # type's constructor or label), or was never checked again: its own errors are unknown
    unchecked: bool = False

    @property
    def stub(self) -> bool:
        """The tests ran, and no call of the answer's returned a value: its entry points only raise
        or never return (`failwith "todo"`, `assert false`, a loop), however they are written."""
        return self.tests_compiled and self.tests_total > 0 and not self.returned

    @property
    def constant(self) -> bool:
        """Its calls were given different arguments and all gave back the same, and an assertion
        failed: an answer that returns an example's output whatever it is asked (`let power b e =
        1024`), which earns the assertions expecting that value. Judged by the trusted program
        (wire.ml, `noted`) on marshalled values: a call with a closure or a handle among them
        reads as varied (never counted, not the other way round)."""
        return (self.tests_compiled and self.returned and self.args_varied and not self.varied
                and self.tests_passed < self.tests_total)

    @property
    def syntax_errors(self) -> int:
        return sum(1 for e in self.compile_errors if e.kind == "syntax")

    @property
    def compiled_as_asked(self) -> bool:
        """The one verdict on "it compiles" that the score, the feedback and the compile part share:
        it compiled, defining the entry points at the prompt's types. A forbidden library value does
        not change it (that costs the test credit, not this)."""
        return self.compiled and not self.compile_errors and not self.compile_timed_out


ENTRY_MISMATCH = "an entry point does not have the prompt's type: "
NOT_AS_ASKED = "it cannot be called with the prompt's argument and result types"
# The names the grader appends around an answer; a compiler message that holds one is never shown.
GRADER_NAMES = (ENTRY_ALIAS, ENTRY_MODULE, "_entry_", "Solution", "Wire_", "wire_")
# The grader's own work on an answer (lexing, phrases, error counting) is linear in its size; this
# bounds it (0.65 s of Python at the limit, measured). A completion of 8k tokens is ~40 KB: a longer one is not
# typed, like a check stopped by the compile limit (no type-check, compile or test credit).
MAX_SOLUTION_CHARS = 512 << 10
TOO_LARGE = CompileError("other", 0, f"the answer is over {MAX_SOLUTION_CHARS} characters: it was not compiled")



def _undefined_entry(name: str) -> str:
    return f"the answer does not define `{name.split('.')[-1]}`, an entry point of the prompt"


GRADER_DIR_PREFIX = "ocaml-grader-"
OWNER_LOCK = ".owner"  # in each grader directory, locked by the process that uses it


def hold_owner_lock(directory: Path) -> int:
    """Lock `directory`'s owner file for as long as this process lives; returns the descriptor.
    The file is locked before it takes its name, so a sweep never sees it unlocked while alive."""
    fd = os.open(directory / (OWNER_LOCK + ".new"), os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(directory / (OWNER_LOCK + ".new"), directory / OWNER_LOCK)
    return fd


def owner_alive(directory: Path) -> bool:
    """Whether the process that made a grader directory still lives: its owner lock is held. A
    directory without an owner file counts as dead (nothing will ever remove it)."""
    try:
        fd = os.open(directory / OWNER_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def sweep_dead_graders(parent: Path) -> list[Path]:
    """Remove the grader directories in `parent` whose process died without cleaning up (SIGKILL,
    OOM): the ones whose owner lock can be taken. A directory without an owner file (still being
    made, or older than the lock) or whose lock is held is left alone. Returns what was removed."""
    removed = []
    for d in parent.glob(GRADER_DIR_PREFIX + "*"):
        try:
            fd = os.open(d / OWNER_LOCK, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no owner file, or not ours to read
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process is alive
            os.close(fd)
            continue
        shutil.rmtree(d, ignore_errors=True)
        os.close(fd)
        removed.append(d)
    return removed


class OcamlGrader:
    """Grades one solution against its tests; every file a step reads or writes lives in a job
    directory of its own, removed after the grading."""
    MAX_CHECKS = 10  # bound on compiler calls spent counting errors in one solution

    def __init__(self, sandbox: Sandbox | None = None, tmp_root: str | None = None,
                 cores: int | None = None, compiler: str | None = None, check_library: bool = True):
        self.sandbox = sandbox or Sandbox()
        # False only in the sandbox's own tests: code the allowlist stops must still be contained.
        self.check_library = check_library
        self.compiler = compiler or self.sandbox.config.compiler
        cores = cores or os.cpu_count() or 1  # the cores this grader may use (REWARD_WORKERS)
        # Test runs are CPU-bound: bounded by the cores, so a test run gets a core to itself and
        # a correct but slow answer never loses its verdict to neighbours that loop (a loop is
        # stopped by its CPU limit, not by the wall clock).
        self._run_slots = threading.BoundedSemaphore(cores)
        tmp_parent = Path(tmp_root or self.sandbox.config.tmpdir or tempfile.gettempdir())
        sweep_dead_graders(tmp_parent)
        self.tmp_root = Path(tempfile.mkdtemp(prefix=GRADER_DIR_PREFIX, dir=tmp_parent))
        os.chmod(self.tmp_root, 0o755)
        weakref.finalize(self, shutil.rmtree, self.tmp_root, True)  # also when close() is never called
        # held until close(), or by the kernel until this process dies: then a sweep may remove the directory
        self._release_owner = weakref.finalize(self, os.close, hold_owner_lock(self.tmp_root))
        # The wire is compiled once (this is also the toolchain probe) under a random unit name
        # that answer code cannot guess (and could not use: it is not on the allowlist).
        self.wire = f"wire_{secrets.token_hex(8)}"
        self._wire_dir = self.tmp_root / "wire"
        self._wire_dir.mkdir()
        (self._wire_dir / f"{self.wire}.ml").write_text(WIRE_ML)
        res = subprocess.run(["ocamlc", *WARNINGS_OFF, "-c", f"{self.wire}.ml"], cwd=self._wire_dir,
                             capture_output=True, text=True, env=self.sandbox.toolchain.host_env)
        if res.returncode != 0:
            raise ToolchainError(f"ocamlc is installed but cannot compile a trivial module: {res.stderr.strip()[:400]}")
        self._counter = 0
        self._lock = threading.Lock()
        # One compile slot more than the cores: a grading holds its compile server while it reads
        # one reply and writes its next request, and the extra server keeps the cores busy then
        # (no-loop benchmark, two scorers alternated: 1.44 s with 2 servers, 1.39 s with 3).
        self.compilers = Compilers(self.sandbox, self.tmp_root, cores + 1, self.compiler)
        weakref.finalize(self, self.compilers.close)
        # Trusted programs, one per problem, built on first use (or found on disk): the program or why it failed.
        self.trusted = TrustedPrograms(self.sandbox, self.compilers, self.tmp_root, self.wire, self._wire_dir)

    def close(self) -> None:
        self.compilers.close()
        self.sandbox.close()  # its idle prepared sandboxes
        shutil.rmtree(self.tmp_root, ignore_errors=True)
        self._release_owner()  # once: later calls do nothing

    def _new_job_dir(self) -> Path:
        with self._lock:
            self._counter += 1
            n = self._counter
        d = self.tmp_root / f"job{n}"
        d.mkdir()
        return d

    def grade(self, solution: str, tests: str, requires: list[str] = (), entry_points: list[str] = (),
              prompt: str = "") -> Grade:
        """Type check and compile one assembled solution, then run the tests against it. `prompt`
        declares the entry points' types (oracle.interface_of); without a usable one the tests
        cannot be run outside the answer's process, and earn nothing (Grade.unverifiable)."""
        if len(solution) > MAX_SOLUTION_CHARS:  # the grader's own work stays bounded (see the constant)
            return Grade(compile_errors=[TOO_LARGE], compile_timed_out=True,
                         tests_total=src.assertion_count(plan_of(tests)))
        workdir = self._new_job_dir()
        budget = CompileBudget(self.sandbox.limits.compile_s)
        try:
            grade = Grade()
            solution = src.strip_line_directives(solution)
            iface = interface_of(prompt, entry_points[0] if entry_points else "")
            (workdir / "solution.ml").write_text(solution)
            objects, trusted, lenient = None, None, None
            if iface.unverifiable:
                grade.unverifiable = iface.unverifiable
                grade.tests_total = src.assertion_count(plan_of(tests))
            else:
                trusted = self.trusted.get(iface, tests, tuple(requires))
                grade.tests_total = trusted.assertions
                for d, unit in ((self._wire_dir, self.wire), (trusted.lambda_dir, trusted.lambda_unit)):
                    if unit:
                        for ext in (".cmi", ".cmo"):
                            shutil.copyfile(d / (unit + ext), workdir / (unit + ext))
                oracle = functools.partial(render_oracle, solution, iface, self.wire.capitalize(), trusted.lambdas,
                                           trusted.lambda_unit.capitalize())
                (workdir / "oracle.ml").write_text(oracle(strict=True))
                lenient = (oracle, tests)  # rendered only for an answer that fails the strict binding
                # An empty interface: nothing of the answer is exported, so its unused weak types are fine
                (workdir / "oracle.mli").write_text("")
                objects = [f"{self.wire}.cmo"] + ([f"{trusted.lambda_unit}.cmo"] if trusted.lambda_unit else [])
                objects += ["oracle.mli", "oracle.ml"]
            with self.compilers.steps(workdir, budget, tuple(requires)) as steps:
                linked = self._compile(steps, solution, grade, budget, objects, iface, lenient)
            # A check cut short proves nothing, and error counting stopped with it (rewards.py then
            # gives no type-check or compile credit); waiting for a compile slot is not cut short.
            grade.compile_timed_out = budget.timed_out and not linked
            if linked and trusted is not None:
                if trusted.error:
                    grade.test_error = trusted.error
                    return grade
                grade.tests_compiled = True
                passed, finished, grade.timed_out, run = self._execute(
                    workdir, workdir / "prog", trusted.program, grade.tests_total)
                grade.returned, grade.varied, grade.args_varied = run.returned, run.varied, run.args_varied
                grade.tests_passed = len(passed) if trusted.split else int(finished)
                grade.passed_ids = sorted(passed) if trusted.split else [0] * finished  # unsplit tests: one assertion
            return grade
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _compile(self, steps: Steps, solution: str, grade: Grade, budget: CompileBudget,
                 objects: list[str] | None, iface: Interface, lenient: tuple | None = None) -> bool:
        """Steps 1 and 2 (see the module docstring); True when the oracle was built. The oracle's
        entry points are first bound strictly (harness.render_oracle); `lenient`: what renders the
        oracle without that binding, and the tests, for an answer that fails it."""
        phrases = src.split_phrases(solution)
        grade.phrases_total = max(1, len(phrases))
        if self.check_library and objects:
            tc, link = steps.check_and_link("solution.ml", "prog", objects)
        else:
            tc, link = steps.compile("solution.ml", "a" if self.check_library else ""), None
        # Typing got to the end: said by the compiler's exit status, never by its messages.
        # Weak type variables (`let f = List.map g`) are fine in a program, only not in a unit
        # without an interface, so the `-i` check decides that case.
        if not tc.timed_out and tc.returncode != 0 and NONGENERALIZABLE in tc.output:
            tci = steps.compile("solution.ml", "ai" if self.check_library else "i")
            if tci.returncode == 0 and not tci.timed_out:
                tc = tci
        if tc.timed_out or tc.returncode != 0:
            if tc.items is not None:  # it parses: the compiler's own structure items are the phrases
                phrases = src.phrases_from_starts(solution, _char_offsets(solution, tc.items))
                grade.phrases_total = max(1, len(phrases))
            good = self._count_errors(steps, phrases, error_of(tc), grade, budget)
            if objects and not budget.exhausted and not grade.syntax_errors:
                # The entry points, checked on this path too: what typed must define them at the
                # prompt's types, or no part of the answer was typed as asked.
                if mismatch := self._entry_mismatch(steps, _joined(phrases, sorted(good)).text, iface):
                    grade.compile_errors.append(CompileError("entry", 0, ENTRY_MISMATCH + mismatch))
            return False
        grade.compiled, grade.phrases_ok = True, grade.phrases_total
        if tc.denied:  # no test credit; the entry points are still checked (below): no path skips them
            grade.forbidden = tc.denied[0]
        if not objects:
            return False
        link = link or steps.link("prog", objects)
        if link.timed_out or link.returncode != 0:
            err = TIMED_OUT if link.timed_out else error_of(link)
            if not link.timed_out and link.loc and link.loc[2] == ENTRY_FILE:
                # The entry point is missing or not of the prompt's type: the answer's own error.
                if err.kind == "unbound":
                    msg = _undefined_entry(err.unbound)
                elif lenient and self._tests_type_appended(steps, solution, lenient[1]):
                    # A weak entry point, or one with labels the prompt lacks: fine exactly when the
                    # tests appended to the answer type-check (one instantiation, total calls).
                    (steps.workdir / "oracle.ml").write_text(lenient[0]())
                    return self._compile(steps, solution, grade, budget, objects, iface, None)
                elif lenient:
                    msg = ENTRY_MISMATCH + (self._entry_mismatch(steps, solution, iface, direct=True) or NOT_AS_ASKED)
                else:
                    msg = ENTRY_MISMATCH + (self._entry_mismatch(steps, solution, iface) or NOT_AS_ASKED)
                grade.compile_errors.append(CompileError("entry", 0, msg))  # it compiles, but not as asked
                return False
            # shown to people only: no credit depends on it
            grade.test_error = err.message
            return False
        return not grade.forbidden

    def _entry_mismatch(self, steps: Steps, solution: str, iface: Interface, direct: bool = False) -> str | None:
        """None when `solution` defines every entry point at the prompt's type; else what the
        compiler says, in the prompt's own terms: each entry point is bound at the prompt's type,
        its type variables quantified as the prompt wrote them (`'a. 'a -> 'a list -> 'a`), as
        the oracle binds them at its wire's tokens (whose private names must not reach feedback).
        A check cut short by the compile budget is a mismatch: it proved nothing. `direct`: the
        entry points are known not to bind directly (the tests appended did not type): only the
        words are wanted."""
        err = None
        if not direct:
            # `-i`: the whole unit, as the oracle's (its interface is empty): an unused weak helper is fine
            (steps.workdir / "signature.ml").write_text(render_entry_check(solution, iface))
            reply = steps.compile("signature.ml", "i")
            if reply.timed_out:
                return "the check ran out of time"
            if reply.returncode == 0:
                return None
            err = error_of(reply)
            if err.kind == "unbound" and reply.loc and reply.loc[2] == ENTRY_FILE:
                return _undefined_entry(err.unbound)
        # The words: the entry points bound directly say "has type X but ... Y" (through a total
        # application the compiler speaks of an argument); that check decides nothing.
        (steps.workdir / "signature.ml").write_text(render_entry_check(solution, iface, eta=False))
        reply = steps.compile("signature.ml", "i")
        if reply.returncode != 0 and not reply.timed_out:
            err = error_of(reply)
        if err is None:
            return None
        message = err.message.replace("Solution.", "")
        if iface.functor:
            message = message.replace(ENTRY_MODULE, iface.functor.name)
        # Feedback names only what the answer or the prompt wrote: a message that names what the
        # grader appended (its aliases, its bindings, the module around the answer) is not shown.
        if any(name in message for name in GRADER_NAMES):
            return NOT_AS_ASKED
        return message

    @staticmethod
    def _tests_type_appended(steps: Steps, solution: str, tests: str) -> bool:
        """Whether the tests appended to the answer type-check, as in plain OCaml (typed, never
        run): what decides an entry point that binds only leniently (weak, or labelled)."""
        (steps.workdir / "appended.ml").write_text(solution + "\n;;\n" + tests + "\n")
        reply = steps.compile("appended.ml", "i")
        return reply.returncode == 0 and not reply.timed_out

    def _run_pair(self, oracle: tuple[Path, Path], trusted: tuple[Path, Path], start: int, total: int, cpu_s: int):
        """One run of both programs, from assertion `start`: what the trusted program reported, and
        each program's RunResult (the oracle's first). Each run is (directory, program)."""
        lim = self.sandbox.limits
        (udir, uprog), (tdir, tprog) = oracle, trusted
        results_path = self.tmp_root / f"results-{secrets.token_hex(8)}"
        box: dict = {}
        with _Pipes(results_path) as p:
            def run_oracle() -> None:
                box["res"] = self.sandbox.run(
                    ["./prog", str(p.req_r), str(p.rep_w)], udir, wall_s=lim.wall_s, cpu_s=cpu_s,
                    pass_fds=(p.req_r, p.rep_w), nice=RUN_NICE, program=uprog, idle_s=IDLE_LIMIT_S,
                    on_start=p.started(p.req_r, p.rep_w), idle_also=p.trusted_blocked)
            thread = threading.Thread(target=run_oracle, daemon=True)
            thread.start()
            try:
                tres = self.sandbox.run(
                    ["./prog", str(p.results), str(p.req_w), str(p.rep_r), str(start)], tdir, wall_s=lim.wall_s,
                    cpu_s=lim.cpu_s + TRUSTED_CPU_EXTRA_S, pass_fds=(p.results, p.req_w, p.rep_r), nice=RUN_NICE,
                    program=tprog, on_start=p.started(p.results, p.req_w, p.rep_r, trusted=True))
            finally:
                # the trusted program's ends are closed (or it never started): the oracle sees the
                # end of its input and exits, or its own guards stop it
                for fd in (p.req_w, p.rep_r):
                    if fd in p.open:
                        p.open.discard(fd)
                        os.close(fd)
                thread.join()
        with open(results_path, "rb") as f:
            run = tally_run(f.read(RESULTS_READ_CAP).decode("ascii", "replace"), start, total)
        results_path.unlink()
        if "res" not in box:
            raise ToolchainError("the oracle's sandbox could not be started")
        if tres.returncode == 127 and tres.stderr.startswith("launch: "):
            # the launcher failed before the trusted program ran (its own status and message; the
            # trusted program never exits 127): a broken sandbox, not a failing answer
            raise ToolchainError(f"the sandbox could not start the trusted test program: {tres.stderr.strip()}")
        return run, box["res"], tres

    def _count_errors(self, steps: Steps, phrases: list[src.Phrase], first: CompileError, grade: Grade,
                      budget: CompileBudget) -> list[int]:
        """Re-check the phrases without the failing one until the rest type-checks: each
        independent error counts once; errors that only follow from a skipped phrase do not.
        An error is blamed on the phrase that holds its location (line and column) in the file
        that was checked. Counting stops when the completion's compile budget is spent. Returns
        the phrases that type-check together."""
        good: list[int] = []
        pending = list(range(len(phrases)))
        skipped_names: set[str] = set()
        skipped: list[int] = []  # phrases left out, each for an error of its own or a forgiven one
        forgiven: list[int] = []  # those left out for a name a skipped phrase declared
        checks = 0
        err: CompileError | None = first
        checked = _joined(phrases, pending)  # solution.ml is the phrases, back to back
        if first.kind == "syntax" and len(phrases) > 1 and not budget.exhausted:
            # Parsing is context-free, and the compiler often reports a syntax error phrases
            # after its cause: parse every phrase on its own, then type-check those that parse.
            bad = self._unparsed(steps, phrases)
            for j, e in bad.items():
                grade.compile_errors.append(e)
                skipped_names.update(phrases[j].names, src.stand_in(phrases[j].text)[1])
                skipped.append(j)
            pending = [i for i in pending if i not in bad]
            checked = _joined(phrases, pending)
            err = self._check(steps, checked.text) if pending else None
        for _ in range(self.MAX_CHECKS):
            if err is None:
                good += pending
                pending = []
                break
            j = _phrase_of(err, checked, pending)
            if j is None or budget.exhausted:  # cannot attribute (e.g. a time-out): count it and stop
                grade.compile_errors.append(err)
                pending = []
                break
            # Forgiven only when the unbound name is one a skipped phrase declared, exactly
            # (`helper`, `Helper` in `Helper.f`, whose module is the one unbound). A qualified
            # name never is: a failed `module List = ...` must not hide `List.mapp` typos.
            if not (err.unbound and err.unbound in skipped_names):
                grade.compile_errors.append(err)
            else:
                forgiven.append(j)
            skipped_names.update(phrases[j].names, src.stand_in(phrases[j].text)[1])
            skipped.append(j)
            if err.kind != "syntax":  # typing is in order: everything before j is fine
                good += [i for i in pending if i < j]
            pending = [i for i in pending if i > j or (err.kind == "syntax" and i < j)]
            if not pending:
                break
            checked = _joined(phrases, good + pending)
            err = self._check(steps, checked.text)
            checks += 1
        # A phrase left out for a name a broken phrase declared may hold an error of its own: it
        # is checked once more with those names declared at every type (`external f : 'a`), and
        # its first error that is not about them counts too.
        # One that cannot be checked so (it uses a failed type's constructor or label, which no
        # stand-in declares at every type), or is not checked again at all, leaves its own errors
        # unknown: the answer is held to the broken phrase's errors (grade.unchecked; no type-check
        # credit, as a syntax error), never credited for errors nobody counted.
        grade.unchecked = len(forgiven) > max(0, self.MAX_CHECKS - checks)
        for j in forgiven[:max(0, self.MAX_CHECKS - checks)]:
            if budget.exhausted:
                grade.unchecked = True
                break
            good_set, skipped_set = set(good), set(skipped)
            before = [i for i in range(j) if i in good_set or i in skipped_set]
            stand_in = [phrases[i] if i in good_set else replace(phrases[i], text=src.stand_in(phrases[i].text)[0])
                        for i in before]
            checked = _joined(stand_in + [phrases[j]], list(range(len(before) + 1)))
            own = self._check(steps, checked.text)
            if own is TIMED_OUT or (own is not None and own.unbound and own.unbound in skipped_names):
                grade.unchecked = True
            elif own is not None and _phrase_of(own, checked, [len(before)]) is not None:
                grade.compile_errors.append(own)
        if not grade.compile_errors:  # the whole failed but no phrase did: count one
            grade.compile_errors.append(first)
        grade.phrases_ok = len(good)
        return good

    def _unparsed(self, steps: Steps, phrases: list[src.Phrase]) -> dict[int, CompileError]:
        """The phrases that do not parse on their own, each with its syntax error."""
        for i, ph in enumerate(phrases):
            (steps.workdir / f"parse{i}.ml").write_text(ph.text)
        replies = steps.parse_each([f"parse{i}.ml" for i in range(len(phrases))])
        return {i: CompileError("syntax", phrases[i].line, error_of(rep).message)
                for i, rep in enumerate(replies) if rep.returncode != 0}

    @staticmethod
    def _check(steps: Steps, text: str) -> CompileError | None:
        """Type-check some of the phrases, as check.ml (`-i`: the whole unit, weak types allowed)."""
        (steps.workdir / "check.ml").write_text(text)
        rep = steps.compile("check.ml", "i")
        if rep.timed_out:
            return TIMED_OUT
        return None if rep.returncode == 0 else error_of(rep)

    def compile_tests(self, jobs: list[tuple[str, str, list[str], str]], requires: list[str] = ()) -> list[CompileError | None]:
        """Build both programs of each (solution, tests, entry points, prompt) without running
        them: one sandbox call for the whole list (the dataset audit's hot path). None = both
        compile; else the first error (kind "unverifiable" when the entry points have no wire)."""
        workdir = self._new_job_dir()
        try:
            wire = f"wire_{secrets.token_hex(8)}"
            (workdir / f"{wire}.ml").write_text(WIRE_ML)
            files: list[str] = []
            early: dict[int, CompileError] = {}
            for k, (solution, tests, entries, prompt) in enumerate(jobs):
                iface = interface_of(prompt, entries[0] if entries else "")
                if iface.unverifiable:
                    # the prompt's own error first, when it has one
                    (workdir / f"s{k}.ml").write_text('# 1 "solution.ml"\n' + src.strip_line_directives(solution))
                    files.append(f"s{k}.ml")
                    early[k] = CompileError("unverifiable", 0, iface.unverifiable)
                    continue
                plan = src.parse_assert_tests(tests)
                (workdir / f"t{k}.ml").write_text(render_trusted(iface, tests, plan, wire.capitalize()))
                (workdir / f"u{k}.ml").write_text(render_oracle(src.strip_line_directives(solution), iface,
                                                                wire.capitalize()))
                (workdir / f"u{k}.mli").write_text("")
                files.append(f"u{k}.mli")
                files += [f"t{k}.ml", f"u{k}.ml"]
            errors = dict(zip(files, self.compilers.compile_batch(
                workdir, wire, files, tuple(requires), self.sandbox.limits.compile_s * max(1, len(files) / 8))))
            return [errors.get(f"s{k}.ml") or early.get(k) or errors.get(f"t{k}.ml") or errors.get(f"u{k}.ml")
                    for k in range(len(jobs))]
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _execute(self, workdir: Path, oracle: Path, trusted: Path, total: int) -> tuple[set[int], bool, bool, RunTally]:
        """Run the oracle beside the trusted program once, through all the tests. An oracle that
        dies (exit, fatal error) or whose frames fall out of step fails the assertion under way
        and every one after it, as the answer's process dying does in plain OCaml: no fresh
        oracle runs the rest, so the answer's state is never reset partway through the tests. A
        reply the trusted program refuses but could read to its end (malformed, over 32 MB) fails
        its own assertion and the run goes on with the same oracle (wire.ml, `Refused`).

        A run holds one of `cores` run slots, so the oracle has a core to itself; its verdict is
        judged by the CPU the oracle used, with a wall-clock guard of OCAML_WALL_LIMIT_S. The two
        talk over two pipes; the trusted program's results go to a file the oracle cannot reach
        (another sandbox, another uid)."""
        lim = self.sandbox.limits
        runs = ((workdir / "oracle", oracle), (workdir / "trusted", trusted))  # (directory, program)
        for d, _ in runs:
            d.mkdir()
        cpu_limit = max(1, math.ceil(lim.cpu_s))
        with self._run_slots:
            run, ures, tres = self._run_pair(*runs, 0, total, cpu_limit)
        finished = run.finished and tres.returncode == 0 and not tres.timed_out
        # The kernel stops a run at its CPU limit with SIGKILL (soft = hard, launch.c), and nothing
        # else sends it one but the guards, whose kills are `ures.timed_out`: model code has no kill.
        # The CPU the run reports is no test, as it falls short of the kernel's own count on a
        # shared machine (2.78 s for a 3 s limit here, more than a tenth short on CI).
        killed_at_limit = ures.returncode == -signal.SIGKILL
        timed_out = not finished and (ures.timed_out or killed_at_limit or lim.cpu_s - ures.cpu_s <= CPU_TIMEOUT_SLACK_S)
        return run.passed, finished, timed_out, run


class _Pipes:
    """The two programs' pipes and the results file: each side's ends are closed here once its
    process has them (so an end of file reaches the other side), and every end at the latest on exit."""

    def __init__(self, results_path: Path):
        self.results = os.open(results_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
        self.req_r, self.req_w = os.pipe()
        self.rep_r, self.rep_w = os.pipe()
        self.open = {self.results, self.req_r, self.req_w, self.rep_r, self.rep_w}
        self.trusted_uid: int | None = None
        self.trusted_started = False

    def started(self, *fds: int, trusted: bool = False):
        def close(uid: int | None) -> None:
            for fd in fds:
                self.open.discard(fd)
                os.close(fd)
            if trusted:
                self.trusted_uid, self.trusted_started = uid, True
        return close

    def trusted_blocked(self) -> bool:
        """The oracle waits on the trusted program between calls: it is idle only when both are."""
        return not self.trusted_started or self.trusted_uid is None or blocked(self.trusted_uid) is not False

    def __enter__(self) -> "_Pipes":
        return self

    def __exit__(self, *exc) -> None:
        for fd in self.open:
            os.close(fd)


def _char_offsets(text: str, byte_offsets: list[int]) -> list[int]:
    """The compiler counts bytes; Python strings count characters. An offset inside a character
    counts the characters before it. One pass over the text, whatever the number of offsets."""
    data = text.encode()
    order = sorted(range(len(byte_offsets)), key=lambda k: byte_offsets[k])
    out = [0] * len(byte_offsets)
    at, chars = 0, 0  # `chars` characters lie in data[:at]
    for k in order:
        b = min(max(byte_offsets[k], 0), len(data))
        while b > at and b < len(data) and data[b] & 0xC0 == 0x80:  # inside a character: back to its start
            b -= 1
        if b > at:
            chars += len(data[at:b].decode("utf-8", "ignore"))
            at = b
        out[k] = chars
    return out


@dataclass
class Joined:
    """Phrases written back to back as one file, and where each one lies in it."""
    text: str
    spans: list[tuple[int, int, int]]  # (phrase index, first offset, end offset)


def _joined(phrases: list[src.Phrase], keep: list[int]) -> Joined:
    """No line directives: a compiler location points into this text, and from there to a phrase."""
    parts, spans, at = [], [], 0
    for i in keep:
        parts.append(phrases[i].text)
        spans.append((i, at, at + len(phrases[i].text)))
        at += len(phrases[i].text)
    return Joined("".join(parts), spans)


def _phrase_of(err: CompileError, checked: Joined, candidates: list[int]) -> int | None:
    """The candidate phrase holding the error's location; the first candidate when the compiler
    named no location; None when the location is outside every candidate."""
    if err.line <= 0:
        return candidates[0] if candidates else None
    lines = checked.text.split("\n")
    if err.line > len(lines):
        return None
    line_start = sum(len(ln) + 1 for ln in lines[:err.line - 1])
    # the column counts bytes; the text counts characters
    col = len(lines[err.line - 1].encode()[:err.col].decode("utf-8", "ignore"))
    at = min(line_start + col, max(0, len(checked.text) - 1))
    for i, start, end in checked.spans:
        if start <= at < end:
            return i if i in candidates else None
    return None
