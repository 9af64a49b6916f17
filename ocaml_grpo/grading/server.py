"""The grader's OCaml tool (ocaml/compile_server.ml): built once, run in the toolchain sandbox.

A new `ocamlc` per check costs ~12 ms of CPU before it reads its file, and a sandbox call ~8 ms
more; a grading makes 2-4 of them. The server is `ocamlc` as a library (compiler-libs): started
once per compile slot, inside the same bubblewrap sandbox and rlimits as `ocamlc` calls, it
answers requests over pipes with ocamlc's outputs (files, exit status, stderr) and the facts
ocamlc does not print (`Reply`): the stage that failed, by the compiler's own exception; the
name an "unbound" error is about; where the parsed file's items start; the library paths the
typed tree reaches that ocaml/allowlist.txt does not allow.

Trust: each request is answered by a child the server forks from a parent that never compiles,
so no request inherits another's state (counters, flags, tables, descriptors). A request that
overruns its completion's compile budget is stopped by killing the server (and everything in its
sandbox); a server that dies is restarted and the request re-run once on the fresh one.
The same binary, run once per step (`--once`, `--check-cmt`), gives the OCAML_COMPILER=ocamlc
path the same facts (ocaml_grpo/grading/compilers.py).
"""
from __future__ import annotations

import os
import queue
import select
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

from ocaml_grpo.grading.diagnostics import Reply, parse_reply
from ocaml_grpo.grading.toolcache import Toolchain, ToolchainError, cached_binary
from ocaml_grpo.grading.sandbox import Sandbox, Spawned

OCAML_DIR = Path(__file__).resolve().parent / "ocaml"
SERVER_SOURCE = OCAML_DIR / "compile_server.ml"
ALLOWLIST = OCAML_DIR / "allowlist.txt"  # embedded in the binary: a new list builds a new one
SERVER_PACKAGES = "compiler-libs.bytecomp,unix"
SERVER_IN_BOX = "/opt/ocaml-grpo/compile_server"  # where the toolchain sandbox sees the binary
# Each request's child inherits this CPU rlimit (the parent itself only forks and waits).
SERVER_CPU_S = 600
READ_CHUNK = 1 << 16
START_TIMEOUT_S = 30.0  # a server's start-up (bwrap, exec, reading the stdlib's .cmi) takes ~20 ms


def _read_line(proc: Spawned, deadline: float) -> bytes | None:
    """One line from the server, byte by byte (nothing after it is consumed); None on EOF or
    at the deadline."""
    fd, line = proc.proc.stdout.fileno(), bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        c = os.read(fd, 1)
        if not c:
            return None
        if c == b"\n":
            return bytes(line)
        line += c


def _tool_output(argv: list[str], env: dict | None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=env)


def server_sources(source: Path = SERVER_SOURCE) -> dict[str, str]:
    """The files the server is built from, by name."""
    return {"allowlist_data.ml": _allowlist_module(ALLOWLIST.read_text()),
            "allowlist.ml": (OCAML_DIR / "allowlist.ml").read_text(), "compile_server.ml": source.read_text()}


def build_server(cache: Path, source: Path = SERVER_SOURCE, environ: Mapping[str, str] | None = None,
                 toolchain: Toolchain = Toolchain()) -> Path:
    """The server binary, built with `ocamlfind ocamlopt` on first use and cached (toolcache) under
    a key of its source and the compiler's version. A missing piece of the toolchain is a
    ToolchainError that names the Debian package to install. `environ`: the toolchain's
    environment (None: this process's, inherited). A bundled toolchain's is prebuilt by `make
    bundle`, with the OCaml it ships (it has no ocamlopt)."""
    sources = server_sources(source)
    if toolchain.root:
        return toolchain.prebuilt("compile_server", list(sources.values()))
    env = None if environ is None else dict(environ)
    if not shutil.which("ocamlfind", path=env.get("PATH") if env is not None else None):
        raise ToolchainError("the compile server needs `ocamlfind`, not found on PATH. "
                             "Install it: apt-get install -y ocaml-findlib")
    version = _tool_output(["ocamlfind", "ocamlopt", "-version"], env)
    if version.returncode != 0:
        why = (version.stderr or version.stdout).strip()[:300]
        raise ToolchainError("the compile server needs the native compiler `ocamlopt` (through ocamlfind): "
                             f"{why}. Install it: apt-get install -y ocaml-nox")

    def build(tmp: Path) -> Path:
        missing = [p for p in SERVER_PACKAGES.split(",") if _tool_output(["ocamlfind", "query", p], env).returncode != 0]
        if missing:
            raise ToolchainError(f"the compile server needs the OCaml package(s) {', '.join(missing)} "
                                 "(ocamlfind cannot find them). Install them: apt-get install -y ocaml-compiler-libs")
        for name, text in sources.items():
            (tmp / name).write_text(text)
        res = subprocess.run(["ocamlfind", "ocamlopt", "-package", SERVER_PACKAGES, "-linkpkg", *sources,
                              "-o", "compile_server"], cwd=tmp, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise ToolchainError("building the compile server failed (`ocamlfind ocamlopt -package "
                                 f"{SERVER_PACKAGES}`): {(res.stderr or res.stdout).strip()[-600:]}")
        return tmp / "compile_server"

    return cached_binary(cache, "compile_server", [*sources.values(), version.stdout.strip()], build)


def _allowlist_module(text: str) -> str:
    """allowlist.txt as an OCaml string constant (a quoted string: no escaping to get wrong)."""
    if "|allowlist}" in text:
        raise ValueError(f"{ALLOWLIST} must not contain '|allowlist}}'")
    return "let text = {allowlist|" + text + "|allowlist}\n"


class CompileServer:
    """One server process (started on first use), used by one thread at a time."""

    def __init__(self, sandbox: Sandbox, exe: Path, root: Path):
        self.sandbox, self.exe, self.root = sandbox, exe, root
        # Where `root` is inside the server's sandbox (its /work), or on the host when unisolated.
        self._box_root = "/work" if sandbox.isolated else str(root)
        self._proc: Spawned | None = None
        self.starts = 0  # processes started so far (the tests read it)

    def _start(self) -> Spawned:
        """The running server, started if need be. One that does not come up (its sandbox or
        binary is broken) is a ToolchainError with what it printed, never a compile error."""
        if self._proc is None:
            argv = [SERVER_IN_BOX if self.sandbox.isolated else str(self.exe)]
            with tempfile.TemporaryFile() as err:
                proc = self.sandbox.spawn(argv, self.root, cpu_s=SERVER_CPU_S, stderr_file=err,
                                          ro_binds=((str(self.exe), SERVER_IN_BOX),))
                if _read_line(proc, time.monotonic() + START_TIMEOUT_S) != b"ready":
                    proc.stop()
                    err.seek(0)
                    raise ToolchainError(f"the compile server ({self.exe}) did not start in its sandbox: "
                                         f"{err.read(2000).decode(errors='replace').strip() or 'no output'}")
            self._proc = proc
            self.starts += 1
        return self._proc

    def stop(self, graceful: bool = False) -> None:
        if self._proc is not None:
            self._proc.stop(graceful)
            self._proc = None

    def request(self, workdir: Path, fields: list[str], timeout: float) -> Reply:
        """Run one request in `workdir` (under the server's root) within `timeout` seconds."""
        return self.requests(workdir, fields, timeout)[0]

    def requests(self, workdir: Path, fields: list[str], timeout: float) -> list[Reply]:
        """A request's replies: one, or for `k` two when the check passed and it linked."""
        for attempt in (0, 1):
            t0 = time.monotonic()
            proc = self._start()
            self.sandbox.own(proc, workdir)
            line = "\t".join([f"{self._box_root}/{workdir.relative_to(self.root)}", *fields]) + "\n"
            expected = len(fields) - 1 if fields[0] == "P" else None
            replies = self._exchange(proc, line.encode(), t0 + timeout, linked=fields[0] == "k", expected=expected)
            if replies is not None and not replies[-1].timed_out:
                return replies
            self.stop()  # the only way to stop a compile in flight; a fresh server serves the next
            if replies is None and attempt == 0 and time.monotonic() - t0 < timeout:
                timeout -= time.monotonic() - t0
                continue  # it died (not timed out): re-run once on a fresh server
            return replies or [Reply(2, "Fatal error: the compiler process died\n")]
        raise AssertionError("unreachable")

    @staticmethod
    def _exchange(proc: Spawned, line: bytes, deadline: float, linked: bool = False,
                  expected: int | None = None) -> list[Reply] | None:
        """Send a request and read its replies: None if the server died, the last timed_out if
        the deadline passed first. `linked`: a `k` request, whose check is followed by the link's
        reply when it passed; `expected`: a `P` request's number of replies (one per file)."""
        try:
            proc.proc.stdin.write(line)
        except (BrokenPipeError, OSError):
            return None
        fd = proc.proc.stdout.fileno()
        buf, replies = bytearray(), []
        while True:
            while b"\n" not in buf or len(buf) < _reply_size(buf):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    return [*replies, Reply.timeout()]
                chunk = os.read(fd, READ_CHUNK)
                if not chunk:
                    return None
                buf += chunk
            size = _reply_size(buf)
            replies.append(parse_reply(bytes(buf[:size])))
            del buf[:size]
            first = replies[0]
            if expected is not None:
                if len(replies) == expected:
                    return replies
            elif not (linked and len(replies) == 1 and first.returncode == 0 and not first.denied):
                return replies


def _reply_size(buf: bytearray) -> int:
    head = buf.partition(b"\n")[0]
    return len(head) + 1 + int(head.split()[1])


class ServerPool:
    """One server per compile slot: taking a server is taking a slot."""

    def __init__(self, sandbox: Sandbox, root: Path, size: int, exe: Path):
        self.exe = exe
        self.servers = [CompileServer(sandbox, self.exe, root) for _ in range(size)]
        self._free: queue.SimpleQueue[CompileServer] = queue.SimpleQueue()
        for s in self.servers:
            self._free.put(s)
        self.servers[0]._start()  # a server that cannot run fails the grader's start, not a grading

    @contextmanager
    def server(self) -> Iterator[CompileServer]:
        s = self._free.get()
        try:
            yield s
        finally:
            self._free.put(s)

    def close(self) -> None:
        for s in self.servers:
            s.stop(graceful=True)
