"""Grading one solution against its tests with the real compiler, inside ocaml_sandbox's sandbox.

1. type check the solution alone; the compiler's typed tree decides which library code it
   reaches, against an allowlist (ocaml_grpo/ocaml/allowlist.txt): anything else earns no test
   credit (the compile server gives the same answer typing the solution once, inside the test
   program of step 2). If it fails, count independent errors phrase by phrase (the compiler's
   structure items), within one compile limit for the whole completion;
2. link it with the tests, each assertion wrapped by a trusted harness module that is
   initialised *before* the solution and reports through a file descriptor with a secret nonce
   the solution never sees (fail-closed: only verified passes count);
3. run it, restarting after the assertion that crashed the process; runs are bounded by the
   cores and judged by the CPU time they used.
Compile steps return values (`Reply`) from either path of ocaml_grpo/compilers.py.
"""
from __future__ import annotations

import math
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from ocaml_grpo import ocaml_source as src
from ocaml_grpo.compiler_output import TIMED_OUT, CompileError, error_of, parse_compiler_error
from ocaml_grpo.compilers import WARNINGS_OFF, CompileBudget, Compilers, Steps
from ocaml_grpo.harness import HARNESS_ML, plan_of, render_tests, tally_run
from ocaml_sandbox import Sandbox, ToolchainError

# Only a trigger for a second, `-i`, type check that decides (the message itself is text a
# solution can print with [%%ocaml.error "..."]).
NONGENERALIZABLE = "contains type variables that cannot be generalized"
RUN_NICE = 15  # model code yields the CPU to compiles and to the trainer
RESULTS_READ_CAP = 4 << 20  # bytes of harness result lines read back; a test program writes ~40 per assertion
CPU_TIMEOUT_SLACK_S = 0.05  # a run that used its CPU budget less this much was stopped by the CPU limit
IDLE_LIMIT_S = 2.0  # a test program blocked this long (using no CPU, e.g. reading a device) is stopped


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
    timed_out: bool = False  # the test runs used their CPU budget
    compile_timed_out: bool = False  # the compile budget ran out before the test program was built
    forbidden: str | None = None  # first library path off the allowlist (or `external`): no test credit
    test_error: str | None = None  # first error compiling the tests against the solution

    @property
    def syntax_errors(self) -> int:
        return sum(1 for e in self.compile_errors if e.kind == "syntax")


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
        self.tmp_root = Path(tempfile.mkdtemp(prefix="ocaml-grader-", dir=tmp_root or self.sandbox.config.tmpdir))
        os.chmod(self.tmp_root, 0o755)
        weakref.finalize(self, shutil.rmtree, self.tmp_root, True)  # also when close() is never called
        # The harness is compiled once (this is also the toolchain probe) under a random unit
        # name that solution code cannot guess (and could not use: it is not on the allowlist).
        self.harness = f"grader_{secrets.token_hex(8)}"
        self._harness_dir = self.tmp_root / "harness"
        self._harness_dir.mkdir()
        (self._harness_dir / f"{self.harness}.ml").write_text(HARNESS_ML)
        res = subprocess.run(["ocamlc", *WARNINGS_OFF, "-c", f"{self.harness}.ml"], cwd=self._harness_dir,
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise ToolchainError(f"ocamlc is installed but cannot compile a trivial module: {res.stderr.strip()[:400]}")
        self._counter = 0
        self._lock = threading.Lock()
        # One compile slot more than the cores: a grading holds its compile server while it reads
        # one reply and writes its next request, and the extra server keeps the cores busy then
        # (no-loop benchmark, two scorers alternated: 1.44 s with 2 servers, 1.39 s with 3).
        self.compilers = Compilers(self.sandbox, self.tmp_root, cores + 1, self.compiler)
        weakref.finalize(self, self.compilers.close)

    def close(self) -> None:
        self.compilers.close()
        shutil.rmtree(self.tmp_root, ignore_errors=True)

    def _new_job_dir(self) -> Path:
        with self._lock:
            self._counter += 1
            n = self._counter
        d = self.tmp_root / f"job{n}"
        d.mkdir()
        return d

    def grade(self, solution: str, tests: str, requires: list[str] = (), entry_points: list[str] = ()) -> Grade:
        """Type check, compile, and run the tests against one assembled solution."""
        workdir = self._new_job_dir()
        budget = CompileBudget(self.sandbox.limits.compile_s)
        try:
            grade = Grade()
            solution = src.strip_line_directives(solution)
            plan = plan_of(tests)
            grade.tests_total = src.assertion_count(plan)
            (workdir / "solution.ml").write_text(solution)
            for ext in (".cmi", ".cmo"):
                shutil.copyfile(self._harness_dir / (self.harness + ext), workdir / (self.harness + ext))
            (workdir / "tests.ml").write_text(render_tests(solution, tests, plan, self.harness.capitalize(),
                                                           list(entry_points)))
            with self.compilers.steps(workdir, budget, tuple(requires)) as steps:
                linked = self._compile(steps, solution, grade, budget)
            # A check cut short proves nothing, and error counting stopped with it (rewards.py
            # then gives no type-check or compile credit). A program that was built was not cut short.
            grade.compile_timed_out = budget.exhausted and not linked
            if linked:
                grade.tests_compiled = True
                # The program runs alone in a fresh directory: no sources to read answers from.
                rundir = workdir / "run"
                rundir.mkdir()
                shutil.move(workdir / "prog", rundir / "prog")
                passed, finished, grade.timed_out = self._execute(rundir, grade.tests_total)
                grade.tests_passed = len(passed) if plan else int(finished)
            return grade
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _compile(self, steps: Steps, solution: str, grade: Grade, budget: CompileBudget) -> bool:
        """Steps 1 and 2 (see the module docstring); True when the test program was built."""
        phrases = src.split_phrases(solution)
        grade.phrases_total = max(1, len(phrases))
        objects = [f"{self.harness}.cmo", "tests.ml"]
        if self.check_library:
            tc, link = steps.check_and_link("solution.ml", "prog", objects)
        else:
            tc, link = steps.compile("solution.ml", ""), None
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
            self._count_errors(steps, phrases, error_of(tc), grade, budget)
            return False
        grade.compiled, grade.phrases_ok = True, grade.phrases_total
        if tc.denied:
            grade.forbidden = tc.denied[0]
            return False
        link = link or steps.link("prog", objects)
        if link.timed_out or link.returncode != 0:
            # shown to people only: no credit depends on it, and ocamlc's link reports no facts
            grade.test_error = TIMED_OUT.message if link.timed_out else parse_compiler_error(link.output).message
            return False
        return True

    def _count_errors(self, steps: Steps, phrases: list[src.Phrase], first: CompileError, grade: Grade,
                      budget: CompileBudget) -> None:
        """Re-check the phrases without the failing one until the rest type-checks: each
        independent error counts once; errors that only follow from a skipped phrase do not.
        An error is blamed on the phrase that holds its location (line and column) in the file
        that was checked. Counting stops when the completion's compile budget is spent."""
        good: list[int] = []
        pending = list(range(len(phrases)))
        skipped_names: set[str] = set()
        err: CompileError | None = first
        checked = _joined(phrases, pending)  # solution.ml is the phrases, back to back
        if first.kind == "syntax" and len(phrases) > 1 and not budget.exhausted:
            # Parsing is context-free, and the compiler often reports a syntax error phrases
            # after its cause: parse every phrase on its own, then type-check those that parse.
            bad = self._unparsed(steps, phrases)
            for j, e in bad.items():
                grade.compile_errors.append(e)
                skipped_names.update(phrases[j].names)
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
            skipped_names.update(phrases[j].names)
            if err.kind != "syntax":  # typing is in order: everything before j is fine
                good += [i for i in pending if i < j]
            pending = [i for i in pending if i > j or (err.kind == "syntax" and i < j)]
            if not pending:
                break
            checked = _joined(phrases, good + pending)
            err = self._check(steps, checked.text)
        if not grade.compile_errors:  # the whole failed but no phrase did: count one
            grade.compile_errors.append(first)
        grade.phrases_ok = len(good)

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

    def compile_tests(self, jobs: list[tuple[str, str, list[str]]], requires: list[str] = ()) -> list[CompileError | None]:
        """Build the test program of each (solution, tests, entry points) without running it:
        one sandbox call for the whole list (the dataset audit's hot path). None = it compiles."""
        workdir = self._new_job_dir()
        try:
            harness = f"grader_{secrets.token_hex(8)}"
            (workdir / f"{harness}.ml").write_text(HARNESS_ML)
            for k, (solution, tests, entries) in enumerate(jobs):
                plan = src.parse_assert_tests(tests)
                (workdir / f"p{k}.ml").write_text(render_tests(solution, tests, plan, harness.capitalize(), entries))
            return self.compilers.compile_batch(workdir, harness, len(jobs), tuple(requires),
                                                self.sandbox.limits.compile_s * max(1, len(jobs) / 4))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _execute(self, rundir: Path, total: int) -> tuple[set[int], bool, bool]:
        """Run the test program until it finishes, restarting after an assertion that killed
        the process (exit, fatal error), while its CPU budget lasts.

        A run holds one of `cores` run slots, so it has a core to itself; its verdict is judged
        by the CPU it used (the limit is shared by all restarts), with a wall-clock guard of
        OCAML_WALL_LIMIT_S per run only for runs that do not use the CPU (blocked)."""
        lim = self.sandbox.limits
        cpu_left = float(lim.cpu_s)
        nonce = secrets.token_hex(16)
        passed: set[int] = set()
        start, finished, timed_out = 0, False, False
        with self._run_slots:
            while True:
                if cpu_left <= CPU_TIMEOUT_SLACK_S:
                    timed_out = True
                    break
                # The results file is write-only for the program: nothing it starts can read the
                # nonce back from it. The nonce arrives on a descriptor the harness closes first.
                results_path = self.tmp_root / f"results-{secrets.token_hex(8)}"
                rfd = os.open(results_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
                try:
                    with tempfile.TemporaryFile(dir=self.tmp_root) as secret:
                        secret.write(f"{nonce}\n{start}\n".encode())
                        secret.flush()
                        secret.seek(0)
                        sfd = secret.fileno()
                        program = rundir / "prog"
                        if not self.sandbox.isolated:  # the harness deletes the file it runs from
                            program = rundir / "attempt"
                            shutil.copy2(rundir / "prog", program)
                        res = self.sandbox.run([f"./{program.name}", str(rfd), str(sfd)], rundir, wall_s=lim.wall_s,
                                               cpu_s=max(1, math.ceil(cpu_left)), pass_fds=(rfd, sfd), nice=RUN_NICE,
                                               program=program, idle_s=IDLE_LIMIT_S)
                finally:
                    os.close(rfd)
                with open(results_path, "rb") as f:
                    run = tally_run(f.read(RESULTS_READ_CAP).decode("ascii", "replace"), nonce, start, total)
                results_path.unlink()
                passed |= run.passed
                cpu_left -= res.cpu_s
                if run.finished and res.returncode == 0 and not res.timed_out:
                    finished = True
                    break
                if res.timed_out or cpu_left <= CPU_TIMEOUT_SLACK_S:
                    timed_out = True
                    break
                crashed_in = sorted(run.began - run.done)
                if not crashed_in or crashed_in[-1] + 1 >= total:
                    break
                start = crashed_in[-1] + 1
        return passed, finished, timed_out


def _char_offsets(text: str, byte_offsets: list[int]) -> list[int]:
    """The compiler counts bytes; Python strings count characters."""
    data = text.encode()
    return [len(data[:b].decode("utf-8", "ignore")) for b in byte_offsets]


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
