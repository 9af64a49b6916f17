"""Everything that touches the OCaml toolchain or runs model code, isolated and bounded.

Isolation (bubblewrap): no network, no /proc, a scrubbed environment, a fresh PID namespace
(everything the program started dies with it), and, when we are root, an unprivileged uid per
concurrent job (held machine-wide) so that the process-count limit counts. Compiles see a
read-only /usr and write only the job's directory; model code sees only the bytecode runtime and
its libraries (no shell, no interpreter), with small in-memory /work and /tmp. rlimits
(prlimit) bound CPU seconds, address space, file size, processes and open files; a wall-clock
deadline kills the whole tree.

Grading model code (`OcamlGrader.grade`):
1. type check the solution alone (its typed tree decides whether it uses Obj, Marshal,
   `external` or unsafe_*: no test credit then); if it fails, count independent errors phrase
   by phrase, within one compile limit for the whole completion;
2. link it with the tests, each assertion wrapped by a trusted harness module that is
   initialised *before* the solution and reports through a file descriptor with a secret nonce
   the solution never sees (fail-closed: only verified passes count);
3. run it, restarting after the assertion that crashed the process; runs are bounded by the
   cores and judged by the CPU time they used.

Environment: SANDBOX_SETTINGS below (`python train.py --help` lists them).
"""
from __future__ import annotations

import fcntl
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ocaml_grpo import ocaml_source as src
from ocaml_grpo.settings import Auto, Choice, Float, Int, Setting, Text, resolve

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


RUN_TOOLS = ("ocamlrun", "prlimit", "setpriv", "nice")  # all that the model-code sandbox can execute
# A 32 MB minor heap: list-heavy tests on large inputs run ~1.7x faster in bytecode.
RUNPARAM = "s=4M"
# Only a trigger for a second, `-i`, type check that decides (the message itself is text a
# solution can print with [%%ocaml.error "..."]).
NONGENERALIZABLE = "contains type variables that cannot be generalized"
WARNINGS_OFF = ["-w", "-a", "-alert", "-all"]
UID_POOL_BASE, UID_POOL_SIZE = 61000, 256  # unprivileged uids lent to jobs (above the usual user range)
RUN_NICE = 15  # model code yields the CPU to compiles and to the trainer
RESULTS_READ_CAP = 4 << 20  # bytes of harness result lines read back; a test program writes ~40 per assertion
RUN_WORK_FILES = 4  # the model code's in-memory /work holds this many maximum-size files (/tmp: one)
CPU_TIMEOUT_SLACK_S = 0.05  # a run that used its CPU budget less this much was stopped by the CPU limit
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
let emit tag i =
  output_string oc (nonce ^ " " ^ tag ^ " " ^ string_of_int i ^ "\n");
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


@dataclass(frozen=True)
class Limits:
    WALL_FACTOR = 3  # the default wall-clock guard of a test run, in CPU limits
    cpu_s: int = 5
    wall_s: float = 15.0
    compile_s: float = 20.0
    memory_mb: int = 512
    file_mb: int = 16
    max_procs: int = 32
    max_files: int = 64
    output_bytes: int = 65536

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Limits":
        v = sandbox_settings(environ)
        return cls(cpu_s=v["OCAML_CPU_LIMIT_S"], wall_s=v["OCAML_WALL_LIMIT_S"] or cls.WALL_FACTOR * v["OCAML_CPU_LIMIT_S"],
                   compile_s=v["OCAML_COMPILE_LIMIT_S"], memory_mb=v["OCAML_MEMORY_MB"], file_mb=v["OCAML_FILE_MB"],
                   max_procs=v["OCAML_MAX_PROCS"], max_files=v["OCAML_MAX_FILES"], output_bytes=v["OCAML_OUTPUT_BYTES"])


SANDBOX_SETTINGS = [
    Setting("OCAML_SANDBOX", "bwrap", Choice("bwrap", "none"),
            "bwrap: every compile and run isolated; none: model code runs on this host UNISOLATED"),
    Setting("OCAML_CPU_LIMIT_S", str(Limits.cpu_s), Int(1),
            "CPU seconds for a completion's test runs (restarts share them; a run that used them timed out)"),
    Setting("OCAML_WALL_LIMIT_S", "auto", Auto(Float(0, lo_open=True), lambda: None, f"{Limits.WALL_FACTOR}x the CPU limit"),
            "wall-clock guard of one test run (only for runs that do not use the CPU)"),
    Setting("OCAML_COMPILE_LIMIT_S", str(Limits.compile_s), Float(0, lo_open=True),
            "wall/CPU seconds for all the compiler calls made for one completion"),
    Setting("OCAML_MEMORY_MB", str(Limits.memory_mb), Int(1), "address space of a compile or run"),
    Setting("OCAML_FILE_MB", str(Limits.file_mb), Int(1), "largest file a compile or run may write"),
    Setting("OCAML_MAX_PROCS", str(Limits.max_procs), Int(1), "processes per job (counted per job uid)"),
    Setting("OCAML_MAX_FILES", str(Limits.max_files), Int(8), "open files per process"),
    Setting("OCAML_OUTPUT_BYTES", str(Limits.output_bytes), Int(1), "stdout/stderr bytes kept per call"),
    Setting("OCAML_SANDBOX_TMPDIR", "auto", Auto(Text, lambda: None, "the system temp dir"),
            "where the grader's job directories go"),
]


def sandbox_settings(environ: Mapping[str, str] | None = None) -> dict:
    """The sandbox's settings, validated; a bad value is a ValueError naming the variable."""
    values, errors = resolve(SANDBOX_SETTINGS, os.environ if environ is None else environ)
    if errors:
        raise ValueError("; ".join(errors))
    return values


class ToolchainError(RuntimeError):
    """The OCaml toolchain or the sandbox is missing or broken; the message says what to install."""


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool  # the wall-clock guard fired
    cpu_s: float = 0.0  # CPU seconds used by everything the run started


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
# The isolated runner.

def _which_or_raise(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise ToolchainError(f"`{tool}` not found on PATH. Install it: apt-get install -y {package}")
    return path


class UidPool:
    """Unprivileged uids for concurrent jobs, each held by one job at a time across every process
    on the machine (a flock per uid): several trainer ranks or a CLI beside a trainer never share
    a uid, so one job's process limit and kill-by-uid never touch another's processes."""

    def __init__(self, base: int = UID_POOL_BASE, size: int = UID_POOL_SIZE):
        self.base, self.size = base, size
        self.dir = Path(tempfile.gettempdir()) / "ocaml-grpo-uids"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self._held: dict[int, int] = {}  # uid -> lock fd
        self._lock = threading.Lock()

    def acquire(self) -> int:
        start = secrets.randbelow(self.size)
        while True:
            for k in range(self.size):
                uid = self.base + (start + k) % self.size
                with self._lock:
                    if uid in self._held:
                        continue
                    fd = os.open(self.dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        os.close(fd)
                        continue
                    self._held[uid] = fd
                    return uid
            time.sleep(0.01)  # every uid busy: wait for a job to end

    def release(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid)
        os.close(fd)  # closing drops the flock


class Sandbox:
    def __init__(self, limits: Limits | None = None, mode: str | None = None):
        self.limits = limits or Limits.from_env()
        self.mode = mode or sandbox_settings()["OCAML_SANDBOX"]
        if self.mode not in ("bwrap", "none"):
            raise ValueError(f"Sandbox mode {self.mode!r}: expected 'bwrap' or 'none'")
        self.isolated = self.mode == "bwrap"
        self.as_root = os.geteuid() == 0
        self._uids = UidPool() if self.as_root else None
        _which_or_raise("ocamlc", "ocaml-nox")
        _which_or_raise("ocamlfind", "ocaml-findlib")  # problems that `require` packages compile through it
        _which_or_raise("prlimit", "util-linux")
        if self.isolated:
            _which_or_raise("bwrap", "bubblewrap")
            with tempfile.TemporaryDirectory(prefix="ocaml-probe-") as probe_dir:
                probe = self.run(["true"], Path(probe_dir), wall_s=10, cpu_s=5)
            if probe.returncode != 0:
                raise ToolchainError(
                    "bubblewrap is installed but cannot create a sandbox here: "
                    f"{probe.stderr.strip()[:400]}. Run as root, enable unprivileged user namespaces, "
                    "or set OCAML_SANDBOX=none to run model code WITHOUT isolation (not recommended).")

    def describe(self) -> str:
        if not self.isolated:
            return "isolation OFF (OCAML_SANDBOX=none): model code runs unsandboxed on this host"
        who = "per-job unprivileged uid" if self.as_root else "own uid (not root: process limit not enforced)"
        return f"bubblewrap sandbox, {who}, limits {self.limits}"

    def _command(self, argv: list[str], workdir: Path, cpu_s: int, uid: int | None, nice: int,
                 program: Path | None, program_fd: int | None) -> list[str]:
        lim = self.limits
        cmd = [
            "prlimit", f"--cpu={cpu_s}:{cpu_s}", f"--as={lim.memory_mb << 20}:{lim.memory_mb << 20}",
            f"--fsize={lim.file_mb << 20}:{lim.file_mb << 20}", f"--nofile={lim.max_files}:{lim.max_files}",
        ]
        if uid is not None:
            cmd += [f"--nproc={lim.max_procs}:{lim.max_procs}", "--",
                    "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
        cmd += ["--"] + (["nice", "-n", str(nice)] if nice else []) + argv
        if not self.isolated:
            return cmd
        box = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
               "--unshare-cgroup-try", "--as-pid-1", "--die-with-parent"]
        if not self.as_root:
            box.append("--unshare-user")
        if program is None:
            # The toolchain (trusted, runs no model code): all of /usr, the job directory writable.
            box += ["--ro-bind", "/usr", "/usr"] + _root_links(("bin", "sbin", "lib", "lib64", "lib32"))
            box += ["--perms", "0755", "--dir", "/etc"]  # else bwrap makes it 0700: unreadable after the uid drop
            for f in ("/etc/ocamlfind.conf", "/etc/findlib.conf", "/etc/ld.so.cache", "/etc/ld.so.conf"):
                box += ["--ro-bind-try", f, f]
            box += ["--bind", str(workdir), "/work"]
        else:
            # Model code: the bytecode runtime, its libraries and the launch chain, nothing else:
            # no shell, no interpreters (a child could read its parent's memory), no compilers.
            # /work and /tmp are small private tmpfs, so nothing reaches the host's disk.
            box += ["--perms", "0755", "--dir", "/usr", "--perms", "0755", "--dir", "/usr/bin",
                    "--ro-bind", "/usr/lib", "/usr/lib", "--ro-bind-try", "/usr/lib64", "/usr/lib64",
                    "--ro-bind-try", "/usr/local/lib", "/usr/local/lib"]
            box += _root_links(("lib", "lib64", "lib32")) + (["--symlink", "usr/bin", "/bin"] if Path("/bin").is_symlink() else [])
            for tool in RUN_TOOLS:
                path = os.path.realpath(shutil.which(tool) or f"/usr/bin/{tool}")
                box += ["--ro-bind", path, f"/usr/bin/{tool}"]
            # The program is copied in (bwrap closes that descriptor), so the harness can delete
            # it before model code runs: nothing can read the tests' constants from the binary.
            box += ["--perms", "0777", "--size", str(RUN_WORK_FILES * lim.file_mb << 20), "--tmpfs", "/work",
                    "--perms", "0755", "--file", str(program_fd), "/work/prog"]
        box += ["--dev", "/dev", "--perms", "1777", "--size", str(lim.file_mb << 20), "--tmpfs", "/tmp",
                "--chdir", "/work", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work",
                "--setenv", "LC_ALL", "C", "--setenv", "OCAMLRUNPARAM", RUNPARAM, "--"]
        return box + cmd

    def run(self, argv: list[str], workdir: Path, *, wall_s: float, cpu_s: int | None = None,
            pass_fds: tuple[int, ...] = (), nice: int = 0, program: Path | None = None) -> RunResult:
        """Run argv inside `workdir` (seen as /work) under every limit; never raises on the
        program's behaviour: a crash or timeout is in the result. With `program`, run model code:
        that file alone is visible, as /work/prog, in the stripped-down sandbox."""
        cpu_s = int(cpu_s or self.limits.cpu_s)
        uid = self._uids.acquire() if self._uids else None
        try:
            if uid is not None:
                for p in [workdir, *workdir.rglob("*")]:
                    os.chown(p, uid, uid)
            env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "LC_ALL": "C", "OCAMLRUNPARAM": RUNPARAM}
            program_fd = os.open(program, os.O_RDONLY) if program is not None and self.isolated else None
            if program_fd is not None:
                pass_fds = (*pass_fds, program_fd)
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                try:
                    proc = subprocess.Popen(
                        self._command(argv, workdir, cpu_s, uid, nice, program, program_fd), cwd=workdir,
                        env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=pass_fds,
                        start_new_session=True)
                finally:
                    if program_fd is not None:
                        os.close(program_fd)
                status, cpu_s, timed_out = _wait_with_usage(proc, wall_s, uid)
                return RunResult(status, _read_capped(out, self.limits.output_bytes),
                                 _read_capped(err, self.limits.output_bytes), timed_out, cpu_s)
        finally:
            if uid is not None:
                self._uids.release(uid)


def _wait_with_usage(proc: subprocess.Popen, wall_s: float, uid: int | None) -> tuple[int, float, bool]:
    """Wait for proc up to wall_s, then kill everything it started; reap it with wait4: (exit
    status, CPU seconds of it and every descendant it reaped, whether the wall guard fired). The
    CPU figure is what a time-out is judged by, so a run slowed by its neighbours is not a loop."""
    box: dict = {}
    waiter = threading.Thread(target=lambda: box.update(w=os.wait4(proc.pid, 0)), daemon=True)
    waiter.start()
    waiter.join(wall_s)
    timed_out = waiter.is_alive()
    if timed_out:
        # The job's processes first, while bwrap is alive to reap its child (killing bwrap first
        # leaves the child a zombie of init); then the process group, for the rest. proc stays
        # unreaped until the waiter returns, so its pid (the group id) cannot be reused meanwhile.
        if uid is not None:
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        if os.stat(f"/proc/{pid}").st_uid == uid:
                            os.kill(int(pid), signal.SIGKILL)
                    except (FileNotFoundError, ProcessLookupError, PermissionError):
                        pass
            waiter.join(1)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        waiter.join()
    _, status, usage = box["w"]
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return proc.returncode, usage.ru_utime + usage.ru_stime, timed_out


def _root_links(dirs: tuple[str, ...]) -> list[str]:
    """/bin, /lib... as on the host: symlinks into /usr (merged /usr) or read-only binds."""
    out = []
    for d in dirs:
        p = Path("/") / d
        if p.is_symlink():
            out += ["--symlink", os.readlink(p), f"/{d}"]
        elif p.is_dir():
            out += ["--ro-bind", str(p), f"/{d}"]
    return out


def _read_capped(f, limit: int) -> str:
    f.seek(0)
    data = f.read(limit + 1)
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[output truncated]" if len(data) > limit else "")


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

    A file that is missing means its step did not run (or the call timed out before it)."""
    MAX_CHECKS = 10  # bound on compiler calls spent counting errors in one solution

    def __init__(self, sandbox: Sandbox | None = None, tmp_root: str | None = None,
                 max_parallel_compiles: int | None = None):
        self.sandbox = sandbox or Sandbox()
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

    def close(self) -> None:
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
        res = self._compile(["sh", "-c", self._type_check_only(requires, "check.ml") + " >/dev/null"], workdir, budget)
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

    def grade(self, solution: str, tests: str, requires: list[str] = (), entry_points: list[str] = ()) -> Grade:
        """Type check, compile, and run the tests against one assembled solution.

        The type check of the solution alone and the build of the test program share one
        sandbox call (each call costs ~20 ms of process start-up here)."""
        workdir = self._new_job_dir()
        requires = list(requires)
        budget = CompileBudget(self.sandbox.limits.compile_s)
        try:
            grade = Grade()
            solution = src.strip_line_directives(solution)
            phrases = src.split_phrases(solution)
            grade.phrases_total = max(1, len(phrases))
            plan = src.parse_assert_tests(tests)
            grade.tests_total = src.assertion_count(plan)
            grade.forbidden = src.first_identifier(solution, forbidden_identifier)  # text: a fast first filter
            (workdir / "solution.ml").write_text(solution)
            typed = " ".join(self._compiler(requires, False) + ["-dparsetree", "-dtypedtree", "-dump-into-file"])
            script = (f"{typed} -c solution.ml >tc.out 2>&1; echo $? >tc.rc\n"
                      f'if [ "$(cat tc.rc)" != 0 ] && grep -q "{NONGENERALIZABLE}" tc.out; then '
                      f"{typed} -i solution.ml >/dev/null 2>tci.out; echo $? >tci.rc; fi\n")
            if len(phrases) > 1:
                script += self._syntax_script(phrases, requires, workdir)
            if not grade.forbidden:
                for ext in (".cmi", ".cmo"):
                    shutil.copyfile(self._harness_dir / (self.harness + ext), workdir / (self.harness + ext))
                (workdir / "tests.ml").write_text(render_tests(solution, tests, plan, self.harness.capitalize(),
                                                               list(entry_points)))
                link = " ".join(self._compiler(requires, True) + ["-o", "prog", f"{self.harness}.cmo", "tests.ml"])
                script += (f'if [ "$(cat tc.rc)" = 0 ] || [ "$(cat tci.rc 2>/dev/null)" = 0 ]; then '
                           f"{link} >link.out 2>&1; echo $? >link.rc; fi\n")
            res = self._compile(["sh", "-c", script], workdir, budget)
            first = parse_compiler_error(_read(workdir / "tc.out"))
            if res.timed_out:
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
    for tag, i in _parse_events(text, nonce):
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


def _parse_events(text: str, nonce: str) -> list[tuple[str, int]]:
    events = []
    for ln in text.splitlines():
        parts = ln.split(" ")
        if len(parts) == 3 and parts[0] == nonce and parts[1] in ("S", "P", "F", "D") and parts[2].isdigit():
            events.append((parts[1], int(parts[2])))
    return events


def render_tests(solution: str, tests: str, plan: src.TestPlan | None, harness: str, entries: list[str]) -> str:
    """One program: the harness alias, the solution as module `Solution`, then the tests.

    Stdlib is opened after the solution, so a solution that redefines `=`, `List` or `exit`
    cannot change what the tests mean. Each assertion runs inside the harness's `check`."""
    tag = secrets.token_hex(6)
    alias, stdlib = f"H_{tag}", f"Stdlib_{tag}"  # names taken before the solution can shadow them
    head = [f"module {alias} = {harness}", f"module {stdlib} = Stdlib", "module Solution = struct",
            '# 1 "solution.ml"', solution, '# 1 "tests.ml"', "end", "open Solution", f"open! {stdlib}"]
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
