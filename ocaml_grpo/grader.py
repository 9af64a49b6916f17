"""Grading one solution against its tests with the real compiler, inside ocaml_sandbox's sandbox.

1. type check the solution alone (its typed tree decides whether it uses Obj, Marshal,
   `external` or unsafe_*: no test credit then); if it fails, count independent errors phrase
   by phrase (the compiler's structure items), within one compile limit for the whole completion;
2. link it with the tests, each assertion wrapped by a trusted harness module that is
   initialised *before* the solution and reports through a file descriptor with a secret nonce
   the solution never sees (fail-closed: only verified passes count);
3. run it, restarting after the assertion that crashed the process; runs are bounded by the
   cores and judged by the CPU time they used.
Compiles go to compile servers (ocaml_grpo/compile_server.py: `ocamlc` as a persistent process
in the toolchain sandbox) or, with OCAML_COMPILER=ocamlc, to one `ocamlc` per step.
"""
from __future__ import annotations

import math
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ocaml_grpo import ocaml_source as src
from ocaml_grpo.compile_server import CompileServer, Reply, ServerPool
from ocaml_grpo.harness import HARNESS_ML, plan_of, render_tests, tally_run
from ocaml_sandbox import RunResult, Sandbox, ToolchainError, sandbox_settings

# Ways to read or forge memory (the harness's nonce lives there): no test credit when used.
# The verdict is the compiler's: the solution's typed tree (`typed_tree_forbidden`) names every
# module and value it refers to, resolved through opens and includes, and every `external`.
# The text check (`forbidden_identifier`) only saves building a program that cannot earn credit.
FORBIDDEN_MODULES = {"Obj", "Marshal"}  # and every Camlinternal* unit
FORBIDDEN_VALUES = {"input_value", "output_value"}  # Marshal under another name  (and unsafe_*)


def forbidden_identifier(name: str) -> bool:
    name = name.removeprefix("Stdlib__")
    return (name in FORBIDDEN_MODULES or name in FORBIDDEN_VALUES or name == "external"
            or name.startswith(("unsafe", "Camlinternal")))


# Every verdict below needs one of these in the dump: a forbidden module or value, `external`,
# an unsafe_* value, a Camlinternal* unit, or a primitive's declaration.
DUMP_WORDS = (*FORBIDDEN_MODULES, *FORBIDDEN_VALUES, "external", "unsafe", "Camlinternal", "value_description")
TYPED_PATH_RE = re.compile(r'^\s*(T[a-z]+_[a-z_]+) "([^"]*)"')
# Nodes whose quoted text is a name being defined or a constructor/label as written, not a path.
NOT_A_PATH = {"Tpat_var", "Tpat_alias", "Tpat_construct", "Texp_construct", "Tpat_variant", "Texp_variant"}


STRUCTURE_ITEM_RE = re.compile(r"^  structure_item \([^\[\n]*\[\d+,(\d+)\+(\d+)\]")


def parse_tree_item_starts(dump: str, source: str) -> list[int] | None:
    """Where each top-level item of `source` begins (character offsets), from the parse tree at
    the head of an `ocamlc -dparsetree -dump-into-file` dump; None when there is none (the file
    did not parse). Indentation, `;;` and several items on a line cannot fool this split."""
    if not dump.startswith("["):
        return None
    data, byte_starts = source.encode(), []
    for line in dump.splitlines()[1:]:
        if line == "]":
            return [len(data[:b].decode("utf-8", "ignore")) for b in byte_starts]
        if m := STRUCTURE_ITEM_RE.match(line):
            byte_starts.append(int(m.group(1)) + int(m.group(2)))
    return None


def typed_tree_forbidden(dump: str) -> str | None:
    """The first forbidden construct in an `ocamlc -dtypedtree` dump, else None.

    Paths in the dump are the compiler's resolved ones (`Stdlib!.Obj.magic`, `O/158.repr`), so
    opens, includes and aliases cannot hide a module: any path through Obj, Marshal or a
    Camlinternal* unit counts, as does a value named unsafe_*, input_value or output_value, and
    every primitive declaration (`external`, in a structure or a signature). String constants
    are printed escaped on their own `Const_string` lines, so no literal can forge a line here."""
    if not any(word in dump for word in DUMP_WORDS):  # nothing below could match: skip the walk
        return None
    lines = dump.splitlines()
    for k, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("value_description"):
            # Its primitive list follows its type, one level deeper: `[]` unless it is an external.
            indent = len(line) - len(line.lstrip()) + 2
            for nxt in lines[k + 1:]:
                ind = len(nxt) - len(nxt.lstrip())
                if ind < indent:
                    break
                if ind == indent and nxt.strip().startswith("["):
                    if nxt.strip() != "[]":
                        return "external"
                    break
            continue
        m = TYPED_PATH_RE.match(line)
        if not m or m.group(1) in NOT_A_PATH or "Const_string" in line:
            continue
        parts = [re.sub(r"(/\d+)?!?$", "", c) for c in re.split(r"[.()]", m.group(2)) if c]
        for c in parts:
            if c.removeprefix("Stdlib__") in FORBIDDEN_MODULES or c.startswith(("Camlinternal", "Stdlib__Camlinternal")):
                return c
        if m.group(1) == "Texp_ident" and parts and forbidden_identifier(parts[-1]):
            return parts[-1]
    return None


# Only a trigger for a second, `-i`, type check that decides (the message itself is text a
# solution can print with [%%ocaml.error "..."]).
NONGENERALIZABLE = "contains type variables that cannot be generalized"
WARNINGS_OFF = ["-w", "-a", "-alert", "-all"]
RUN_NICE = 15  # model code yields the CPU to compiles and to the trainer
RESULTS_READ_CAP = 4 << 20  # bytes of harness result lines read back; a test program writes ~40 per assertion
CPU_TIMEOUT_SLACK_S = 0.05  # a run that used its CPU budget less this much was stopped by the CPU limit


@dataclass
class CompileError:
    kind: str  # "syntax" | "type" | "unbound" | "other"
    line: int  # 0: the compiler named no location
    message: str
    file: str = ""
    col: int = 0  # the location's first byte on its line


@dataclass
class Grade:
    """Facts about one solution; rewards.py turns them into a score."""
    type_errors: list[CompileError] = field(default_factory=list)
    phrases_total: int = 0
    phrases_ok: int = 0
    compiled: bool = False  # the solution alone compiles to bytecode
    tests_compiled: bool = False  # the solution links with the tests
    tests_passed: int = 0
    tests_total: int = 0
    timed_out: bool = False
    forbidden: str | None = None  # a construct that voids test credit (Obj, Marshal, external, unsafe_*)
    test_error: str | None = None  # first error compiling the tests against the solution

    @property
    def syntax_errors(self) -> int:
        return sum(1 for e in self.type_errors if e.kind == "syntax")


# ---------------------------------------------------------------------------------------------
# Compiler messages.

ERROR_LOCATION_RE = re.compile(r'^File "([^"]+)", lines? (\d+)(?:-\d+)?(?:, characters (\d+)-\d+)?')


def parse_compiler_error(output: str) -> CompileError:
    """First error of an ocamlc run, classified. Its location is the header just above its
    `Error:` line: a warning a solution re-enabled (`[@@@warning "+a"]`) prints a header of its own
    earlier, which must not move the blame."""
    lines = output.splitlines()
    for k, ln in enumerate(lines):
        if ln.startswith("Error:"):
            body = [ln[len("Error:"):].strip()]
            for cont in lines[k + 1:]:
                if not cont.startswith(" ") or ERROR_LOCATION_RE.match(cont):
                    break
                body.append(cont.strip())
            message = " ".join(b for b in body if b)
            for head in reversed(lines[:k]):
                if m := ERROR_LOCATION_RE.match(head):
                    return CompileError(classify_error(message), int(m.group(2)), message[:500], m.group(1),
                                        int(m.group(3) or 0))
            return CompileError(classify_error(message), 0, message[:500])
    message = next((ln.strip() for ln in lines if ln.strip()), "unknown compiler failure")
    return CompileError(classify_error(message), 0, message[:500])


SYNTAX_MARKERS = ("syntax error", "illegal character", "not terminated", "might be unmatched",
                  "unterminated", "illegal escape", "invalid literal")
SYNTAX_ERROR_RE = "|".join(SYNTAX_MARKERS)  # the same test, for grep in the sandbox


def classify_error(message: str) -> str:
    m = message.lower()
    if any(s in m for s in SYNTAX_MARKERS):
        return "syntax"
    if m.startswith("unbound"):
        return "unbound"
    if any(s in m for s in ("has type", "type ", "expects", "is applied to", "constructor",
                            "was expected", "is not a function", "labels", "field")):
        return "type"
    return "other"


UNBOUND_NAME_RE = re.compile(r"Unbound (?:value|constructor|module|type constructor|record field) ([\w'.]+)")


# ---------------------------------------------------------------------------------------------
# The grader.

@dataclass
class CompileBudget:
    """One compile limit per completion, shared by every toolchain call made for it: a phrase
    whose type checking blows up costs one limit, not one per error-counting pass."""
    seconds: float
    exhausted: bool = False  # a call ran out of it: count no further errors


class OcamlGrader:
    """Grades one solution against its tests. The sandbox's shell scripts leave their results
    in the job directory, one small file each (the protocol between the scripts and Python):

    tc.out / tc.rc         type check of the solution alone: output, exit status
    solution.cmo.dump      its typed tree (-dtypedtree), read for forbidden constructs
    tci.out / tci.rc       only when tc failed on weak type variables: the `-i` check that
                           decides whether typing got to the end
    bad, err<i>.txt        after a syntax error: the phrases that do not parse, and why
    check.ml/.out/.rc      the phrases that parse, type-checked together
    link.out / link.rc     the test program (harness + solution + tests) built as `prog`

    A file that is missing means its step did not run (or the call timed out before it).
    With the compile server, each step is a request and Python writes the same files from the
    replies, so everything after the first steps reads them the same way on both paths."""
    MAX_CHECKS = 10  # bound on compiler calls spent counting errors in one solution

    def __init__(self, sandbox: Sandbox | None = None, tmp_root: str | None = None,
                 max_parallel_compiles: int | None = None, compiler: str | None = None):
        self.sandbox = sandbox or Sandbox()
        self.compiler = compiler or sandbox_settings()["OCAML_COMPILER"]
        if self.compiler not in ("server", "ocamlc"):
            raise ValueError(f"compiler {self.compiler!r}: expected 'server' or 'ocamlc'")
        cores = max_parallel_compiles or os.cpu_count() or 1
        # Compiles and test runs are CPU-bound: each is bounded by the cores, so a test run gets
        # a core to itself and a correct but slow answer never loses its verdict to neighbours
        # that loop (a loop is stopped by its CPU limit, not by the wall clock).
        self._compile_slots = threading.BoundedSemaphore(cores)
        self._run_slots = threading.BoundedSemaphore(cores)
        self.tmp_root = Path(tempfile.mkdtemp(prefix="ocaml-grader-", dir=tmp_root or sandbox_settings()["OCAML_SANDBOX_TMPDIR"]))
        os.chmod(self.tmp_root, 0o755)
        weakref.finalize(self, shutil.rmtree, self.tmp_root, True)  # also when close() is never called
        # The harness is compiled once (this is also the toolchain probe) under a random unit
        # name that solution code cannot guess, so it cannot refer to the harness's `emit`.
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
        # One compile server per compile slot; built (or found in the cache) now, so a missing
        # piece of the toolchain is an error at start-up, never a silent switch to ocamlc.
        self._servers = ServerPool(self.sandbox, self.tmp_root, cores) if self.compiler == "server" else None
        if self._servers:
            weakref.finalize(self, self._servers.close)

    def close(self) -> None:
        if self._servers:
            self._servers.close()
        shutil.rmtree(self.tmp_root, ignore_errors=True)

    def _new_job_dir(self) -> Path:
        with self._lock:
            self._counter += 1
            n = self._counter
        d = self.tmp_root / f"job{n}"
        d.mkdir()
        return d

    @staticmethod
    def _compiler(requires: list[str], link: bool) -> list[str]:
        if not requires:
            return ["ocamlc", *WARNINGS_OFF]
        return ["ocamlfind", "ocamlc", *WARNINGS_OFF, "-package", ",".join(requires)] + (["-linkpkg"] if link else [])

    def _compile(self, argv: list[str], workdir: Path, budget: CompileBudget | None = None, files: int = 1) -> RunResult:
        """A toolchain call under a compile slot. With a budget, the call gets what is left of it
        and spends what it used; without, the limit scales with the files it builds."""
        limit = budget.seconds if budget else self.sandbox.limits.compile_s * max(1, files / 4)
        with self._compile_slots:
            t0 = time.monotonic()
            res = self.sandbox.run(argv, workdir, wall_s=limit, cpu_s=max(1, math.ceil(limit)))
        if budget:
            budget.seconds -= time.monotonic() - t0
            budget.exhausted = res.timed_out or budget.seconds <= 0
        return res

    def _count_errors(self, phrases: list[src.Phrase], first: CompileError, requires: list[str],
                      workdir: Path, grade: Grade, budget: CompileBudget) -> None:
        """Re-check the phrases without the failing one until the rest type-checks: each
        independent error counts once; errors that only follow from a skipped phrase do not.
        An error is blamed on the phrase that holds its location (line and column) in the file
        that was checked. Counting stops when the completion's compile budget is spent."""
        good: list[int] = []
        pending = list(range(len(phrases)))
        skipped_names: set[str] = set()
        err: CompileError | None = first
        checked = _joined(phrases, pending)  # solution.ml is the phrases, back to back
        bad = _read_syntax_check(phrases, workdir)  # done in the first sandbox call
        if bad:
            for j, e in bad.items():
                grade.type_errors.append(e)
                skipped_names.update(phrases[j].names)
            pending = [i for i in pending if i not in bad]
            checked = _joined(phrases, pending)  # check.ml: the phrases that parse
            err = None if _read(workdir / "check.rc").strip() == "0" or not pending else \
                parse_compiler_error(_read(workdir / "check.out"))
        for _ in range(self.MAX_CHECKS):
            if err is None:
                good += pending
                pending = []
                break
            j = _phrase_of(err, checked, pending)
            if j is None or budget.exhausted:  # cannot attribute (e.g. a time-out): count it and stop
                grade.type_errors.append(err)
                pending = []
                break
            unbound = UNBOUND_NAME_RE.search(err.message)
            dependent = unbound is not None and unbound.group(1).split(".")[0] in skipped_names
            if not dependent:
                grade.type_errors.append(err)
            skipped_names.update(phrases[j].names)
            if err.kind != "syntax":  # typing is in order: everything before j is fine
                good += [i for i in pending if i < j]
            pending = [i for i in pending if i > j or (err.kind == "syntax" and i < j)]
            if not pending:
                break
            checked = _joined(phrases, good + pending)
            err = self._check(checked.text, requires, workdir, budget)
        if not grade.type_errors:  # the whole failed but no phrase did: count one
            grade.type_errors.append(first)
        grade.phrases_ok = len(good)

    def _check(self, text: str, requires: list[str], workdir: Path, budget: CompileBudget) -> CompileError | None:
        """Type-check some of the phrases, as check.ml."""
        (workdir / "check.ml").write_text(text)
        if self._served(requires):
            with self._server_for(workdir) as server:
                rep = self._serve(server, workdir, ["c", "i", "check.ml"], budget)
            res = RunResult(rep.returncode, "", rep.output, rep.timed_out)
        else:
            argv = ["sh", "-c", self._type_check_only(requires, "check.ml") + " >/dev/null"]
            res = self._compile(argv, workdir, budget)
        if res.timed_out:
            return CompileError("other", 0, "compiler timed out")
        return None if res.returncode == 0 else parse_compiler_error(res.stderr)

    def _type_check_only(self, requires: list[str], file: str) -> str:
        """`-i` types the whole unit and stops: weak type variables, fine in a program, are not an
        error of the unit here (and nothing is written but the signature, on stdout)."""
        return " ".join(self._compiler(requires, False) + ["-i", file])

    def _syntax_script(self, phrases: list[src.Phrase], requires: list[str], workdir: Path) -> str:
        """Shell for the first sandbox call: on a syntax error, parse every phrase on its own
        (parsing is context-free, and the compiler often reports a syntax error phrases after
        its cause), then type-check the phrases that parse, back to back, as check.ml."""
        for i, ph in enumerate(phrases):
            (workdir / f"parse{i}.ml").write_text(ph.text)
        n = len(phrases) - 1
        return (f'if [ "$(cat tc.rc)" != 0 ] && grep -qiE "{SYNTAX_ERROR_RE}" tc.out; then\n'
                f"  : >bad; : >check.ml\n"
                f"  for i in $(seq 0 {n}); do ocamlc -stop-after parsing -c parse$i.ml >/dev/null 2>err$i.txt "
                f"|| echo $i >>bad; done\n"
                f"  for i in $(seq 0 {n}); do grep -qx $i bad || cat parse$i.ml >>check.ml; done\n"
                f"  {self._type_check_only(requires, 'check.ml')} >/dev/null 2>check.out; echo $? >check.rc\n"
                f"fi\n")

    def _first_steps_script(self, workdir: Path, phrases: list[src.Phrase], requires: list[str], link: bool,
                            budget: CompileBudget) -> bool:
        """The first steps (see the class docstring) as one shell script in one sandbox call, one
        `ocamlc` each; True if the call timed out."""
        typed = " ".join(self._compiler(requires, False) + ["-dparsetree", "-dtypedtree", "-dump-into-file"])
        script = (f"{typed} -c solution.ml >tc.out 2>&1; echo $? >tc.rc\n"
                  f'if [ "$(cat tc.rc)" != 0 ] && grep -q "{NONGENERALIZABLE}" tc.out; then '
                  f"{typed} -i solution.ml >/dev/null 2>tci.out; echo $? >tci.rc; fi\n")
        if len(phrases) > 1:
            script += self._syntax_script(phrases, requires, workdir)
        if link:
            prog = " ".join(self._compiler(requires, True) + ["-o", "prog", f"{self.harness}.cmo", "tests.ml"])
            script += (f'if [ "$(cat tc.rc)" = 0 ] || [ "$(cat tci.rc 2>/dev/null)" = 0 ]; then '
                       f"{prog} >link.out 2>&1; echo $? >link.rc; fi\n")
        return self._compile(["sh", "-c", script], workdir, budget).timed_out

    def _served(self, requires: list[str]) -> bool:
        """Whether a compile server does this completion's compiles (problems that `require`
        packages go through ocamlfind ocamlc)."""
        return self._servers is not None and not requires

    @contextmanager
    def _server_for(self, workdir: Path) -> Iterator[CompileServer]:
        """A compile server for requests in `workdir`; the directory is taken back after them,
        since the server goes on to other completions."""
        try:
            with self._servers.server() as server:
                yield server
        finally:
            self.sandbox.disown(workdir)

    def _served_steps(self, server: CompileServer, workdir: Path, phrases: list[src.Phrase], link: bool,
                      budget: CompileBudget) -> bool:
        """The same steps as `_first_steps_script`, each a request to the compile server, leaving
        the same files; True if one timed out (the steps after it do not run)."""
        def step(fields: list[str], out: str, rc: str | None) -> bool:
            rep = self._serve(server, workdir, fields, budget)
            if not rep.timed_out:
                (workdir / out).write_text(rep.output)
                if rc:
                    (workdir / rc).write_text(f"{rep.returncode}\n")
            return rep.timed_out

        if step(["c", "d", "solution.ml"], "tc.out", "tc.rc"):
            return True
        tc_out, tc_ok = _read(workdir / "tc.out"), _read(workdir / "tc.rc").strip() == "0"
        if not tc_ok and NONGENERALIZABLE in tc_out and step(["c", "di", "solution.ml"], "tci.out", "tci.rc"):
            return True
        if len(phrases) > 1 and not tc_ok and re.search(SYNTAX_ERROR_RE, tc_out, re.IGNORECASE):
            bad = []
            for i, ph in enumerate(phrases):  # parsing alone takes ocamlc's default warnings
                (workdir / f"parse{i}.ml").write_text(ph.text)
                if step(["c", "pW", f"parse{i}.ml"], f"err{i}.txt", f"parse{i}.rc"):
                    return True
                if _read(workdir / f"parse{i}.rc").strip() != "0":
                    bad.append(i)
            (workdir / "bad").write_text("".join(f"{i}\n" for i in bad))
            (workdir / "check.ml").write_text("".join(ph.text for i, ph in enumerate(phrases) if i not in bad))
            if step(["c", "i", "check.ml"], "check.out", "check.rc"):
                return True
        if link and (tc_ok or _read(workdir / "tci.rc").strip() == "0"):
            return step(["o", "prog", f"{self.harness}.cmo", "tests.ml"], "link.out", "link.rc")
        return False

    @staticmethod
    def _serve(server: CompileServer, workdir: Path, fields: list[str], budget: CompileBudget) -> Reply:
        """One compile-server request within what is left of the completion's compile budget."""
        if budget.seconds <= 0:
            budget.exhausted = True
            return Reply(2, "compiler timed out", timed_out=True)
        t0 = time.monotonic()
        rep = server.request(workdir, fields, budget.seconds)
        budget.seconds -= time.monotonic() - t0
        budget.exhausted = rep.timed_out or budget.seconds <= 0
        return rep

    def grade(self, solution: str, tests: str, requires: list[str] = (), entry_points: list[str] = ()) -> Grade:
        """Type check, compile, and run the tests against one assembled solution.

        The type check of the solution alone and the build of the test program go to one
        compile server, request after request (OCAML_COMPILER=server), or share one sandbox
        call of `ocamlc`s (each call costs ~20 ms of process start-up here)."""
        workdir = self._new_job_dir()
        requires = list(requires)
        budget = CompileBudget(self.sandbox.limits.compile_s)
        try:
            grade = Grade()
            solution = src.strip_line_directives(solution)
            phrases = src.split_phrases(solution)
            grade.phrases_total = max(1, len(phrases))
            plan = plan_of(tests)
            grade.tests_total = src.assertion_count(plan)
            grade.forbidden = src.first_identifier(solution, forbidden_identifier)  # text: a fast first filter
            (workdir / "solution.ml").write_text(solution)
            link = not grade.forbidden
            if link:
                for ext in (".cmi", ".cmo"):
                    shutil.copyfile(self._harness_dir / (self.harness + ext), workdir / (self.harness + ext))
                (workdir / "tests.ml").write_text(render_tests(solution, tests, plan, self.harness.capitalize(),
                                                               list(entry_points)))
            if self._served(requires):
                with self._server_for(workdir) as server:
                    timed_out = self._served_steps(server, workdir, phrases, link, budget)
            else:
                timed_out = self._first_steps_script(workdir, phrases, requires, link, budget)
            first = parse_compiler_error(_read(workdir / "tc.out"))
            if timed_out:
                first = CompileError("other", 0, "compiler timed out")
            # Typing got to the end: said by the compiler's exit status, never by its messages.
            # Weak type variables (`let f = List.map g`) are fine in a program, only not in a
            # unit without an interface, so the `-i` check decides that case.
            dump = _read(workdir / "solution.cmo.dump")
            if _read(workdir / "tc.rc").strip() == "0" or _read(workdir / "tci.rc").strip() == "0":
                grade.compiled, grade.phrases_ok = True, grade.phrases_total
            else:
                starts = parse_tree_item_starts(dump, solution)
                if starts is not None:  # it parses: the compiler's own structure items are the phrases
                    phrases = src.phrases_from_starts(solution, starts)
                    grade.phrases_total = max(1, len(phrases))
                    (workdir / "bad").unlink(missing_ok=True)  # a syntax scan grep'd from source excerpts
                self._count_errors(phrases, first, requires, workdir, grade, budget)
                return grade
            grade.forbidden = grade.forbidden or typed_tree_forbidden(dump)
            if grade.forbidden:
                return grade
            if _read(workdir / "link.rc").strip() != "0" or not (workdir / "prog").exists():
                grade.test_error = parse_compiler_error(_read(workdir / "link.out")).message
                return grade
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
            comp = " ".join(self._compiler(list(requires), False) + ["-c"])
            script = (f"{comp} {harness}.ml >h.out 2>&1 || exit 3\n"
                      f"for k in $(seq 0 {len(jobs) - 1}); do {comp} p$k.ml >e$k.txt 2>&1; echo $? >r$k.txt; done\n")
            res = self._compile(["sh", "-c", script], workdir, files=len(jobs))
            if res.returncode == 3:  # the harness itself did not build: a toolchain or package problem
                err = parse_compiler_error(_read(workdir / "h.out"))
                return [err] * len(jobs)
            out: list[CompileError | None] = []
            for k in range(len(jobs)):
                rc = _read(workdir / f"r{k}.txt").strip()
                if rc == "0":
                    out.append(None)
                elif rc:
                    out.append(parse_compiler_error(_read(workdir / f"e{k}.txt")))
                else:
                    out.append(CompileError("other", 0, "compiler timed out" if res.timed_out else "not compiled"))
            return out
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
                                               program=program)
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


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _read_syntax_check(phrases: list[src.Phrase], workdir: Path) -> dict[int, CompileError]:
    bad = {}
    for tok in _read(workdir / "bad").split():
        i = int(tok)
        e = parse_compiler_error(_read(workdir / f"err{i}.txt"))
        bad[i] = CompileError("syntax", phrases[i].line, e.message)
    return bad


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
