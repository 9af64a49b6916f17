"""The grader's two compile paths behind one interface: steps that return `Reply` values.

    with compilers.steps(workdir, budget, requires) as steps:
        tc = steps.compile("solution.ml", "a")       # flags as the tool's: a i p W
        prog = steps.link("prog", ["wire.cmo", "oracle.mli", "oracle.ml"])

OCAML_COMPILER=server: each step is a request to a compile server (ocaml_grpo/grading/server.py).
OCAML_COMPILER=ocamlc, and every problem that `require`s packages: each step is one sandboxed
`ocamlc` (through ocamlfind); the grader's OCaml tool, run once in the same sandbox call, adds the
facts ocamlc does not print: what the allowlists deny, from ocamlc's own `-bin-annot` .cmt (and
the source's parse tree, for attributes),
and, after a failure, the stage, the unbound name and the items, from its own parse and type
check. Both paths give the same `Reply` for the same step (bench/compare_compilers.py checks).
One compile budget per completion (OCAML_COMPILE_LIMIT_S) is shared by all its steps.
"""
from __future__ import annotations

import functools
import math
import shlex
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Protocol

from ocaml_grpo.grading.diagnostics import Reply, parse_reply
from ocaml_grpo.grading.server import SERVER_IN_BOX, CompileServer, ServerPool, build_server
from ocaml_grpo.grading.diagnostics import CompileError, error_of, parse_compiler_error
from ocaml_grpo.grading.toolcache import Toolchain
from ocaml_grpo.grading.sandbox import RunResult, Sandbox

WARNINGS_OFF = ["-w", "-a", "-alert", "-all"]


@dataclass
class CompileBudget:
    """One compile limit per completion, shared by every toolchain call made for it: a phrase
    whose type checking blows up costs one limit, not one per error-counting pass."""
    seconds: float
    exhausted: bool = False  # a call ran out of it: count no further errors
    timed_out: bool = False  # a call was stopped by it: no type-check or compile credit

    def spend(self, since: float, timed_out: bool) -> None:
        self.seconds -= time.monotonic() - since
        self.exhausted = timed_out or self.seconds <= 0
        self.timed_out |= timed_out


class Steps(Protocol):
    workdir: Path

    def compile(self, file: str, flags: str) -> Reply: ...
    def link(self, out: str, files: list[str]) -> Reply: ...

    def check_and_link(self, file: str, out: str, files: list[str]) -> tuple[Reply, Reply | None]:
        """`compile(file, "a")`, then `link(out, files)` only if it compiled and the allowlist denied
        nothing (None otherwise)."""

    def parse_each(self, files: list[str]) -> list[Reply]:
        """`compile(f, "pW")` for each file (fewer replies when the budget ran out)."""


@functools.lru_cache(maxsize=32)
def package_dirs(requires: tuple[str, ...], toolchain: Toolchain) -> tuple[str, ...]:
    """The include directories of the packages and everything they depend on (ocamlfind); none
    for an unknown package (its compile then fails with ocamlfind's own message)."""
    if not requires:
        return ()
    res = subprocess.run(["ocamlfind", "query", "-r", "-format", "%d", *requires], capture_output=True, text=True,
                         env=toolchain.host_env)
    return tuple(dict.fromkeys(res.stdout.split())) if res.returncode == 0 else ()


class ServerSteps:
    def __init__(self, server: CompileServer, workdir: Path, budget: CompileBudget):
        self.server, self.workdir, self.budget = server, workdir, budget

    def _request(self, fields: list[str]) -> list[Reply]:
        if self.budget.seconds <= 0:
            self.budget.exhausted = self.budget.timed_out = True
            return [Reply.timeout()]
        t0 = time.monotonic()
        replies = self.server.requests(self.workdir, fields, self.budget.seconds)
        self.budget.spend(t0, replies[-1].timed_out)
        return replies

    def compile(self, file: str, flags: str) -> Reply:
        return self._request(["c", flags or "-", file])[0]

    def link(self, out: str, files: list[str]) -> Reply:
        return self._request(["o", out, *files])[0]

    def check_and_link(self, file: str, out: str, files: list[str]) -> tuple[Reply, Reply | None]:
        # One request: the server types the answer once, inside the oracle program, and checks it
        # alone (in a second child) only when the program does not compile (compile_server.ml, `k`).
        replies = self._request(["k", file, out, *files])
        return replies[0], (replies[1] if len(replies) > 1 else None)

    def parse_each(self, files: list[str]) -> list[Reply]:
        return [r for r in self._request(["P", *files]) if not r.timed_out]


class OcamlcSteps:
    """One sandbox call per step: `ocamlc` (ocamlfind with packages), then the tool for the facts."""
    FLAG_ARGS = {"i": ["-i"], "p": ["-stop-after", "parsing"], "a": ["-bin-annot"]}

    def __init__(self, compilers: "Compilers", workdir: Path, budget: CompileBudget, requires: tuple[str, ...]):
        self.c, self.workdir, self.budget, self.requires = compilers, workdir, budget, requires

    def _ocamlc(self, flags: str, link: bool) -> list[str]:
        warn = [] if "W" in flags else WARNINGS_OFF
        opts = [a for f in flags for a in self.FLAG_ARGS.get(f, [])]
        if not self.requires:
            return ["ocamlc", *warn, *opts]
        pkgs = ["-package", ",".join(self.requires)] + (["-linkpkg"] if link else [])
        return ["ocamlfind", "ocamlc", *warn, *pkgs, *opts]

    def _step(self, script: str, name: str) -> Reply:
        if self.budget.seconds <= 0:
            self.budget.exhausted = self.budget.timed_out = True
            return Reply.timeout()
        with self.c.slots:  # waiting for a compile slot is not the completion's compile time
            t0 = time.monotonic()
            res = self.c.run_script(script, self.workdir, self.budget.seconds, slot_held=True)
            self.budget.spend(t0, res.timed_out)
        rc = _read(self.workdir / f"{name}.rc").strip()
        if res.timed_out or not rc:
            return Reply.timeout()
        out = _read(self.workdir / f"{name}.out")
        facts = _read(self.workdir / f"{name}.facts")
        if rc == "0":
            return Reply(0, out, denied=facts.split())
        rep = parse_reply(facts.encode())
        return replace(rep, returncode=int(rc), output=out, denied=[]) if rep else Reply(int(rc), out)

    def compile(self, file: str, flags: str) -> Reply:
        name, tool = Path(file).stem, self.c.tool_in_box
        dirs = package_dirs(self.requires, self.c.sandbox.toolchain)
        once = "\t".join([self.c.box_dir(self.workdir), "c", flags or "-", file, *dirs])
        check = f"{tool} --check-cmt {name}.cmt >{name}.facts" if "a" in flags else f": >{name}.facts"
        script = (f"{shlex.join(self._ocamlc(flags, False))} -c {file} >/dev/null 2>{name}.out; rc=$?; echo $rc >{name}.rc\n"
                  f"if [ $rc = 0 ]; then {check}; else {tool} --once {shlex.quote(once)} >{name}.facts; fi\n")
        return self._step(script, name)

    def check_and_link(self, file: str, out: str, files: list[str]) -> tuple[Reply, Reply | None]:
        tc = self.compile(file, "a")
        return tc, (self.link(out, files) if tc.returncode == 0 and not tc.timed_out and not tc.denied else None)

    def parse_each(self, files: list[str]) -> list[Reply]:
        replies = []
        for f in files:
            rep = self.compile(f, "pW")
            if rep.timed_out:
                break
            replies.append(rep)
        return replies

    def link(self, out: str, files: list[str]) -> Reply:
        # ocamlc's link prints no facts: after a failure the tool builds it again for them (where
        # the error lies: an oracle's entry point that does not match is the answer's error)
        once = "\t".join([self.c.box_dir(self.workdir), "o", out, *files])
        facts = f"{self.c.tool_in_box} --once {shlex.quote(once)} >{out}.facts" if not self.requires else f": >{out}.facts"
        script = (f"{shlex.join(self._ocamlc('', True))} -o {out} {' '.join(files)} >/dev/null 2>{out}.out; "
                  f"rc=$?; echo $rc >{out}.rc; [ $rc = 0 ] || {facts}\n")
        return self._step(script, out)


class Compilers:
    """The compile slots (the grader asks for one more than its cores), the tool binary, and the
    servers when they are used."""

    def __init__(self, sandbox: Sandbox, root: Path, cores: int, kind: str):
        if kind not in ("server", "ocamlc"):
            raise ValueError(f"compiler {kind!r}: expected 'server' or 'ocamlc'")
        self.sandbox = sandbox
        self.slots = threading.BoundedSemaphore(cores)
        # Built (or found in the cache) now: a missing piece of the toolchain is an error at
        # start-up, never a silent switch to another path.
        self.exe = build_server(Path(sandbox.config.cache), toolchain=sandbox.toolchain)
        self.tool_in_box = SERVER_IN_BOX if sandbox.isolated else str(self.exe)
        self._servers = ServerPool(sandbox, root, cores, self.exe) if kind == "server" else None

    def close(self) -> None:
        if self._servers:
            self._servers.close()

    def box_dir(self, workdir: Path) -> str:
        return "/work" if self.sandbox.isolated else str(workdir)

    @contextmanager
    def steps(self, workdir: Path, budget: CompileBudget, requires: tuple[str, ...] = ()) -> Iterator[Steps]:
        """Steps for one completion's job directory. A server's steps give the directory back
        after them: the server goes on to other completions."""
        if self._servers is None or requires:
            yield OcamlcSteps(self, workdir, budget, tuple(requires))
            return
        try:
            with self._servers.server() as server:
                yield ServerSteps(server, workdir, budget)
        finally:
            self.sandbox.disown(workdir)

    def compile_batch(self, workdir: Path, wire: str, files: list[str], requires: tuple[str, ...],
                      limit: float) -> list[CompileError | None]:
        """Compile each of `files` (programs using the `wire` unit, `wire`.ml in workdir) in one
        sandbox call: None for each that compiles, else its first error."""
        steps = OcamlcSteps(self, workdir, CompileBudget(limit), requires)
        comp = shlex.join(steps._ocamlc("", False))
        facts = [self.tool_in_box, "--once", "\t".join([self.box_dir(workdir), "c", "-", "$f",
                                                         *package_dirs(requires, self.sandbox.toolchain)])]
        once = " ".join(shlex.quote(a) if "$f" not in a else f'"{a}"' for a in facts)
        script = (f"{comp} -c {wire}.ml >h.out 2>&1 || exit 3\n"
                  f"for f in {' '.join(files)}; do {comp} -c $f >$f.err 2>&1; rc=$?; echo $rc >$f.rc; "
                  f"[ $rc = 0 ] || {once} >$f.facts; done\n")
        res = self.run_script(script, workdir, limit)
        if res.returncode == 3:  # the wire itself did not build: a toolchain or package problem
            return [parse_compiler_error(_read(workdir / "h.out"))] * len(files)
        out: list[CompileError | None] = []
        for f in files:
            rc = _read(workdir / f"{f}.rc").strip()
            if rc == "0":
                out.append(None)
            elif rc:
                rep = parse_reply(_read(workdir / f"{f}.facts").encode()) or Reply(2, "")
                out.append(error_of(replace(rep, returncode=int(rc), output=_read(workdir / f"{f}.err"))))
            else:
                out.append(CompileError("other", 0, "compiler timed out" if res.timed_out else "not compiled"))
        return out

    def run_script(self, script: str, workdir: Path, limit: float, slot_held: bool = False) -> RunResult:
        """A shell script in the toolchain sandbox, under a compile slot, the tool beside it."""
        if not slot_held:
            with self.slots:
                return self.run_script(script, workdir, limit, slot_held=True)
        return self.sandbox.run(["sh", "-c", script], workdir, wall_s=limit, cpu_s=max(1, math.ceil(limit)),
                                ro_binds=((str(self.exe), SERVER_IN_BOX),))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
