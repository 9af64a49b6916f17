"""Runs the OCaml toolchain and untrusted model code, isolated and bounded.

Isolation (bubblewrap): no network, no /proc, a scrubbed environment, a fresh PID namespace
(everything the program started dies with it), and, when we are root, an unprivileged uid per
concurrent job (held machine-wide) so that the process-count limit counts. Compiles see a
read-only /usr and write only the job's directory; model code sees only the bytecode runtime and
its libraries (no shell, no interpreter), with small in-memory /work and /tmp. rlimits bound CPU
seconds, address space, file size, processes and open files, set by the sandbox's launcher
(ocaml_grpo/grading/launch.c, built with `cc` on first use), which also drops to the job's uid; a
wall-clock guard kills the whole tree, and each run reports the CPU time it used. As root, model
code runs in prepared sandboxes (PreparedSandbox: one bubblewrap, started once, whose launcher
starts each run in fresh namespaces: 3-4 ms of CPU a run against 7-9 ms; bench/sandbox_start.py). The
toolchain is the system's (apt), or the offline bundle's (OCAML_TOOLCHAIN_DIR: toolcache.Toolchain).

What is compiled and run, and how it is judged, is ocaml_grpo/grading/grader.py's business.
Environment: SANDBOX_SETTINGS in ocaml_grpo/config/isolation.py (`python train.py --help` lists them).
"""
from __future__ import annotations

import fcntl
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ocaml_grpo.config.isolation import SandboxConfig, memory_tmpdir
from ocaml_grpo.grading.toolcache import Toolchain, ToolchainError, cached_binary

LAUNCHER_SOURCE = Path(__file__).resolve().parent / "launch.c"
LAUNCHER_IN_BOX = "/opt/ocaml-grpo/launch"  # where both sandboxes see the launcher
STUBLIBS_IN_BOX = "/opt/ocaml-grpo/stublibs"  # where model code sees a bundled toolchain's C stubs
# A 32 MB minor heap: list-heavy tests on large inputs run ~1.7x faster in bytecode.
RUNPARAM = "s=4M"
UID_POOL_BASE, UID_POOL_SIZE = 61000, 256  # unprivileged uids lent to jobs (above the usual user range)
# Long-lived toolchain processes (compile servers) get uids of their own, never a job's.
SERVER_UID_BASE, SERVER_UID_SIZE = 60000, 256
RUN_WORK_FILES = 4  # the model code's in-memory /work holds this many maximum-size files (/tmp: one)
RUN_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")  # Random.self_init reads urandom
IDLE_POLL_S = 0.2
START_TIMEOUT_S = 30  # a prepared sandbox's answer to a run's start (a fork and two mounts)


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool  # the wall-clock guard fired
    cpu_s: float = 0.0  # CPU seconds used by everything the run started


# ---------------------------------------------------------------------------------------------
# The isolated runner.

def launcher_sources() -> list[str]:
    return [LAUNCHER_SOURCE.read_text()]


def build_launcher(cache: Path, toolchain: Toolchain = Toolchain()) -> Path:
    """The sandbox's launcher (ocaml_grpo/grading/launch.c), built with `cc` on first use and cached; a
    bundled toolchain's is prebuilt (`make bundle`)."""
    if toolchain.root:
        return toolchain.prebuilt("launch", launcher_sources())
    cc = toolchain.which("cc", "gcc")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    [source] = launcher_sources()

    def build(tmp: Path) -> Path:
        (tmp / "launch.c").write_text(source)
        res = subprocess.run([cc, "-O2", "-Wall", "-o", "launch", "launch.c"], cwd=tmp, capture_output=True, text=True)
        if res.returncode != 0:
            raise ToolchainError(f"building the sandbox's launcher with `{cc}` failed: "
                                 f"{(res.stderr or res.stdout).strip()[-600:]}")
        return tmp / "launch"

    return cached_binary(cache, "launch", [source, version], build)


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
    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self.limits, self.mode = self.config.limits, self.config.mode
        if self.mode not in ("bwrap", "none"):
            raise ValueError(f"Sandbox mode {self.mode!r}: expected 'bwrap' or 'none'")
        self.isolated = self.mode == "bwrap"
        self.as_root = os.geteuid() == 0
        self._uids = UidPool() if self.as_root else None
        self._server_uids = UidPool(SERVER_UID_BASE, SERVER_UID_SIZE) if self.as_root else None
        self._capture_dir = memory_tmpdir()  # each call's stdout/stderr (None: the system temp dir)
        self._work_bytes, self._tmp_bytes = RUN_WORK_FILES * self.limits.file_mb << 20, self.limits.file_mb << 20
        # Model code runs in prepared sandboxes as root (a run's own uid is what keeps runs apart
        # there); without root, each run is a bubblewrap of its own.
        self._prepared: list[PreparedSandbox] = []  # idle ones; a run holds one to itself
        self._prepared_lock = threading.Lock()
        self.toolchain = tc = Toolchain(self.config.toolchain)
        tc.which("ocamlc", "ocaml-nox")
        tc.which("ocamlfind", "ocaml-findlib")  # problems that `require` packages compile through it
        self.launcher = str(build_launcher(Path(self.config.cache), tc))
        # The bytecode runtime: what the model-code sandbox runs (test programs start with #!/usr/bin/ocamlrun)
        self._ocamlrun = os.path.realpath(tc.which("ocamlrun", "ocaml-nox"))
        if self.isolated:
            self._bwrap = tc.which("bwrap", "bubblewrap")
            with tempfile.TemporaryDirectory(prefix=f"ocaml-probe-{os.getpid()}-") as probe_dir:
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
        where = f", the bundled OCaml toolchain in {self.toolchain.root}" if self.toolchain.root else ""
        return f"bubblewrap sandbox, {who}, limits {self.limits}{where}"

    def _launch_args(self, argv: list[str], cpu_s: int, uid: int | None, nice: int) -> list[str]:
        """The launcher's arguments: every limit, the job's uid and nice value, then the program."""
        lim = self.limits
        return [str(cpu_s), str(lim.memory_mb << 20), str(lim.file_mb << 20), str(lim.max_files), str(lim.max_procs),
                "-" if uid is None else str(uid), str(nice), "--", *argv]

    def _command(self, argv: list[str], workdir: Path, cpu_s: int, uid: int | None, nice: int,
                 program: Path | None, program_fd: int | None, ro_binds: tuple[tuple[str, str], ...] = (),
                 serve_fd: int | None = None) -> list[str]:
        """The bubblewrap command for one run (with `serve_fd`: the prepared model-code sandbox,
        which starts runs itself, each with its own program)."""
        cmd = ([LAUNCHER_IN_BOX, "--serve", str(serve_fd)] if serve_fd is not None
               else [LAUNCHER_IN_BOX if self.isolated else self.launcher, *self._launch_args(argv, cpu_s, uid, nice)])
        if not self.isolated:
            if program is not None and self.toolchain.root:
                # A test program starts with #!/usr/bin/ocamlrun, the system's runtime: a bundled
                # toolchain's is named instead (the sandbox binds it at that path).
                return [*cmd[:-len(argv)], self._ocamlrun, *argv]
            return cmd
        box = [self._bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        if serve_fd is None:
            box += ["--as-pid-1", "--die-with-parent"]
        # A prepared sandbox keeps bubblewrap's init, which reaps; it is started by whichever
        # thread first needs one and outlives that thread (die-with-parent would follow the thread):
        # it ends when its control socket does, at the latest with this process.
        if not self.as_root:
            box.append("--unshare-user")
        if program is None:
            # The toolchain (trusted, runs no model code): all of /usr, the job directory writable.
            box += ["--ro-bind", "/usr", "/usr", *_root_links(("bin", "sbin", "lib", "lib64", "lib32"))]
            box += ["--perms", "0755", "--dir", "/etc"]  # else bwrap makes it 0700: unreadable after the uid drop
            for f in ("/etc/ocamlfind.conf", "/etc/findlib.conf", "/etc/ld.so.cache", "/etc/ld.so.conf"):
                box += ["--ro-bind-try", f, f]
            box += ["--bind", str(workdir), "/work"]
            box += _tool_binds(((self.launcher, LAUNCHER_IN_BOX), *ro_binds))  # ours: the launcher, the compile server
        else:
            # Model code: the bytecode runtime, its libraries and the launcher, nothing else:
            # no shell, no interpreters (a child could read its parent's memory), no compilers.
            # /work and /tmp are small private tmpfs, so nothing reaches the host's disk.
            box += ["--perms", "0755", "--dir", "/usr", "--perms", "0755", "--dir", "/usr/bin",
                    "--ro-bind", "/usr/lib", "/usr/lib", "--ro-bind-try", "/usr/lib64", "/usr/lib64",
                    "--ro-bind-try", "/usr/local/lib", "/usr/local/lib"]
            box += [*_root_links(("lib", "lib64", "lib32"))] + (["--symlink", "usr/bin", "/bin"] if _BIN_IS_LINK else [])
            # all the model-code sandbox can execute: the launcher, and the runtime it starts
            box += ["--ro-bind", self._ocamlrun, "/usr/bin/ocamlrun"] + _tool_binds(((self.launcher, LAUNCHER_IN_BOX),))
            # The program is copied in (bwrap closes that descriptor): each run sees its own program
            # alone (the oracle never sees the trusted program, which holds the tests' constants).
            box += ["--perms", "0777", "--size", str(self._work_bytes), "--tmpfs", "/work"]
            if serve_fd is None:
                box += ["--perms", "0755", "--file", str(program_fd), "/work/prog"]
            # Devices: only what a program's runtime may open (no terminals, no ptys, no shm).
            box += ["--perms", "0755", "--dir", "/dev"] + [a for d in RUN_DEVICES for a in ("--dev-bind", d, d)]
        if program is None:
            box += ["--dev", "/dev"]
        box += ["--perms", "1777", "--size", str(self._tmp_bytes), "--tmpfs", "/tmp"]
        env = self.toolchain.env
        if self.toolchain.root:
            # Compiles see all of the bundled toolchain, at its host path (after /tmp, which may
            # hold it); model code only the C stubs its program loads (Base's, unix's), at a path
            # of ours: a prepared sandbox's runs get a fresh /tmp, which would hide a bundle there.
            # (_tool_binds: each directory above it 0755, which bwrap would make 0700.)
            if program is None:
                box += _tool_binds(((self.toolchain.root, self.toolchain.root),))
            else:
                box += _tool_binds(((self.toolchain.stublibs, STUBLIBS_IN_BOX),))
                env = {"PATH": "/usr/bin:/bin", "CAML_LD_LIBRARY_PATH": STUBLIBS_IN_BOX}
        box += ["--chdir", "/work", "--clearenv", *[a for k, v in env.items() for a in ("--setenv", k, v)],
                "--setenv", "HOME", "/work", "--setenv", "LC_ALL", "C", "--setenv", "OCAMLRUNPARAM", RUNPARAM, "--"]
        return box + cmd

    def run(self, argv: list[str], workdir: Path, *, wall_s: float, cpu_s: int | None = None,
            pass_fds: tuple[int, ...] = (), nice: int = 0, program: Path | None = None,
            ro_binds: tuple[tuple[str, str], ...] = (), idle_s: float | None = None,
            on_start: Callable[[int | None], None] | None = None,
            idle_also: Callable[[], bool] | None = None) -> RunResult:
        """Run argv inside `workdir` (seen as /work) under every limit; never raises on the
        program's behaviour: a crash or timeout is in the result. With `program`, run model code:
        that file alone is visible, as /work/prog, in the stripped-down sandbox. With `idle_s`,
        a run whose processes all stay blocked (none running or runnable) that long is stopped
        as timed out (with a job uid, i.e. as root: its processes are found by uid), and only while
        `idle_also()` holds too (a peer it waits on is blocked as well). `on_start(uid)` is called
        once the process is started (e.g. to close this side's copies of its pipes)."""
        cpu_s = int(cpu_s or self.limits.cpu_s)
        uid = self._uids.acquire() if self._uids else None
        try:
            sealed = program is not None and self.isolated  # workdir itself is not in the sandbox
            if uid is not None and not sealed:
                _chown_tree(workdir, uid, uid)
            capture = self._capture_dir
            with tempfile.TemporaryFile(dir=capture) as out, tempfile.TemporaryFile(dir=capture) as err:
                if sealed and self.as_root:
                    status, used, timed_out = self._run_prepared(
                        self._launch_args(argv, cpu_s, uid, nice), program, (out.fileno(), err.fileno(), pass_fds),
                        wall_s, uid, idle_s, on_start, idle_also)
                else:
                    status, used, timed_out = self._run_boxed(
                        argv, workdir, cpu_s, uid, nice, program, ro_binds, (out, err, pass_fds),
                        wall_s, idle_s, on_start, idle_also)
                return RunResult(status, _read_capped(out, self.limits.output_bytes),
                                 _read_capped(err, self.limits.output_bytes), timed_out, used)
        finally:
            if uid is not None:
                self._uids.release(uid)

    def _run_boxed(self, argv, workdir, cpu_s, uid, nice, program, ro_binds, io, wall_s, idle_s, on_start,
                   idle_also) -> tuple[int, float, bool]:
        """One run in a bubblewrap of its own: (exit status, CPU seconds, whether a guard fired)."""
        out, err, pass_fds = io
        env = {**self.toolchain.env, "HOME": str(workdir), "LC_ALL": "C", "OCAMLRUNPARAM": RUNPARAM}
        if program is not None and not self.isolated and program != workdir / "prog":
            shutil.copyfile(program, workdir / "prog")  # unisolated, it runs where it is: ./prog
            os.chmod(workdir / "prog", 0o755)
        program_fd = os.open(program, os.O_RDONLY) if program is not None and self.isolated else None
        if program_fd is not None:
            pass_fds = (*pass_fds, program_fd)
        try:
            proc = subprocess.Popen(
                self._command(argv, workdir, cpu_s, uid, nice, program, program_fd, ro_binds), cwd=workdir,
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=pass_fds,
                start_new_session=True)
        finally:
            if program_fd is not None:
                os.close(program_fd)
            if on_start is not None:
                on_start(uid)

        def wait() -> tuple[int, float]:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
            return proc.returncode, usage.ru_utime + usage.ru_stime

        def stop() -> None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return _guarded_wait(wait, stop, wall_s, uid, idle_s, idle_also)

    def _run_prepared(self, launch_args, program, io, wall_s, uid, idle_s, on_start,
                      idle_also) -> tuple[int, float, bool]:
        """One run started by a prepared sandbox held for it alone: (exit status, CPU seconds,
        whether a guard fired)."""
        out_fd, err_fd, pass_fds = io
        fds = {1: out_fd, 2: err_fd, **{fd: fd for fd in pass_fds}}
        box = self._take_prepared()
        try:
            try:
                with open(program, "rb") as prog:
                    try:
                        run = box.start(launch_args, prog.fileno(), fds, self._work_bytes, self._tmp_bytes)
                    except ToolchainError:
                        if box.alive():
                            raise
                        box.close()  # it ended while idle (killed from outside): once more, in a new one
                        box = PreparedSandbox(self)
                        run = box.start(launch_args, prog.fileno(), fds, self._work_bytes, self._tmp_bytes)
            finally:
                if on_start is not None:
                    on_start(uid)
            with run:
                return _guarded_wait(lambda: _run_status(run), lambda: _tell(run, b"kill"), wall_s, uid,
                                     idle_s, idle_also)
        finally:
            self._give_back(box)

    def _take_prepared(self) -> "PreparedSandbox":
        with self._prepared_lock:
            while self._prepared:
                box = self._prepared.pop()
                if box.alive():
                    return box
                box.close()
        return PreparedSandbox(self)

    def _give_back(self, box: "PreparedSandbox") -> None:
        if not box.alive():
            box.close()
            return
        with self._prepared_lock:
            self._prepared.append(box)

    def close(self) -> None:
        """Stop the idle prepared sandboxes (the Sandbox stays usable: it starts new ones)."""
        with self._prepared_lock:
            idle, self._prepared = self._prepared, []
        for box in idle:
            box.close()

    def spawn(self, argv: list[str], workdir: Path, *, cpu_s: int, ro_binds: tuple[tuple[str, str], ...] = (),
              stderr_file=None) -> "Spawned":
        """Start a long-lived toolchain process (the compile server) in the toolchain sandbox, with
        `workdir` as /work and pipes on its stdin and stdout. It holds its own uid (when we are
        root) until `stop`: what it writes belongs to that uid, so give it the directories it
        must write (`own`). Its limits are the toolchain's, CPU seconds counted over its life."""
        pool = self._server_uids
        uid = pool.acquire() if pool else None
        try:
            env = {**self.toolchain.env, "HOME": str(workdir), "LC_ALL": "C"}
            proc = subprocess.Popen(self._command(argv, workdir, cpu_s, uid, 0, None, None, ro_binds), cwd=workdir,
                                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=stderr_file or subprocess.DEVNULL, bufsize=0, start_new_session=True)
        except BaseException:
            if uid is not None:
                pool.release(uid)
            raise
        return Spawned(proc, uid, pool)

    def own(self, spawned: "Spawned", path: Path) -> None:
        """Let a spawned process write `path` and everything in it (skipped when the directory is
        its already: then so is every file not written since by us, which it only reads)."""
        if spawned.uid is not None and os.stat(path).st_uid != spawned.uid:
            _chown_tree(path, spawned.uid, spawned.uid)

    def disown(self, path: Path) -> None:
        """Take `path` and everything in it back from whichever spawned process owned it: a
        long-lived one goes on to serve other jobs and must not be able to change this one's."""
        if self._server_uids is not None:
            _chown_tree(path, os.getuid(), os.getgid())


class PreparedSandbox:
    """A model-code sandbox started once, which starts each run as a fresh child (launch.c's serve
    mode): new mount, IPC and PID namespaces, empty /work (the program copied in) and /tmp, the
    run's own uid and limits. One bubblewrap start (~6 ms of CPU) is paid per sandbox, not per run.
    A run holds its sandbox to itself: runs never share one at the same time; what the runs of one
    sandbox share, one after another, is its read-only files and its empty network namespace (a
    run's processes, and with them its sockets, are gone before the next starts)."""

    def __init__(self, sandbox: "Sandbox"):
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            cmd = sandbox._command([], Path("/"), 0, None, 0, Path("prog"), None, serve_fd=theirs.fileno())
            self.proc = subprocess.Popen(cmd, env={**sandbox.toolchain.env, "LC_ALL": "C"}, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, launch_args: list[str], program_fd: int, fds: dict[int, int], work_bytes: int,
              tmp_bytes: int) -> socket.socket:
        """Start one run: the launcher's arguments, the program (as /work/prog), and the
        descriptors it gets (number inside -> ours). Returns the run's socket (see _run_status)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # A native program is executed from its descriptor, never copied (the trusted
            # programs are ~4 MB); bytecode is copied in, as its #! line needs a path. (An
            # `ocamlc -custom` program, which reads its own file, would need copying too: none is built.)
            how = "exec" if os.pread(program_fd, 4, 0) == b"\x7fELF" else "copy"
            fields = [str(work_bytes), str(tmp_bytes), how, str(len(fds)), *map(str, fds), *launch_args]
            request = b"".join(f.encode() + b"\0" for f in fields)
            socket.send_fds(self.control, [request], [theirs.fileno(), program_fd, *fds.values()])
            theirs.close()  # the sandbox holds it now: its end (or its manager's) closing is our end of file
            mine.settimeout(START_TIMEOUT_S)
            reply = mine.recv(4096)
            mine.settimeout(None)
        except OSError as e:
            mine.close()
            raise ToolchainError(f"the prepared sandbox could not take a run: {e}") from e
        finally:
            theirs.close()  # (again: closing twice is harmless)
        if reply != b"started":
            mine.close()
            raise ToolchainError("the prepared sandbox could not start a run: "
                                 + (reply.decode(errors="replace") or "it ended"))
        return mine

    def close(self) -> None:
        self.control.close()  # its end of the control socket: it exits, and bubblewrap with it
        try:
            self.proc.wait(1)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _run_status(run: socket.socket) -> tuple[int, float]:
    """A prepared run's exit status and CPU seconds, once it ended ("exit WAIT_STATUS CPU_US")."""
    reply = run.recv(256).decode(errors="replace").split()
    if len(reply) != 3 or reply[0] != "exit":
        raise ToolchainError(f"the prepared sandbox lost a run: {' '.join(reply) or 'it ended'}")
    return os.waitstatus_to_exitcode(int(reply[1])), int(reply[2]) / 1e6


def _tell(run: socket.socket, message: bytes) -> None:
    try:
        run.send(message)
    except OSError:
        pass  # its manager is gone: so is the run


@dataclass
class Spawned:
    proc: subprocess.Popen
    uid: int | None
    pool: UidPool | None  # where its uid goes back
    stopped: bool = False

    def stop(self, graceful: bool = False) -> None:
        """Kill the process and everything it started (gracefully: close its stdin and give it a
        moment to exit first); give its uid back."""
        if self.stopped:
            return
        self.stopped = True
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        if graceful:
            try:
                self.proc.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        # As for a run that timed out: the uid's processes first, while bwrap lives to reap them.
        _kill_uid(self.uid)
        try:
            self.proc.wait(1)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        if self.uid is not None:
            self.pool.release(self.uid)


def _kill_uid(uid: int | None) -> None:
    """SIGKILL every process running as the job's uid (none when there is no uid)."""
    if uid is None:
        return
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    os.kill(int(pid), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass


def blocked(uid: int | None) -> bool | None:
    """Whether every process of the uid is blocked (sleeping or stopped, none running or
    runnable); None when it has none."""
    states = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    with open(f"/proc/{pid}/stat") as f:
                        states.append(f.read().rpartition(")")[2].split()[0])
            except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
                pass
    return all(st not in "R" for st in states) if states else None


def _guarded_wait(wait: Callable[[], tuple[int, float]], stop: Callable[[], None], wall_s: float,
                  uid: int | None, idle_s: float | None = None,
                  idle_also: Callable[[], bool] | None = None) -> tuple[int, float, bool]:
    """Wait for a run (`wait`: its exit status and the CPU seconds of it and every descendant it
    reaped) up to wall_s, or until it has been blocked for idle_s, then kill everything it started
    (`stop`): (exit status, CPU seconds, whether a guard fired). The CPU figure is what a time-out
    is judged by, so a run slowed by its neighbours is not a loop."""
    box: dict = {}

    def waiter_body() -> None:
        try:
            box["w"] = wait()
        except BaseException as e:  # re-raised below, in the caller's thread
            box["e"] = e
    waiter = threading.Thread(target=waiter_body, daemon=True)
    waiter.start()
    if idle_s is None or uid is None:
        waiter.join(wall_s)
    else:
        deadline, blocked_since = time.monotonic() + wall_s, None
        while time.monotonic() < deadline:
            waiter.join(IDLE_POLL_S)
            if not waiter.is_alive():
                break
            now = time.monotonic()
            idle = blocked(uid) and (idle_also is None or idle_also())
            blocked_since = (blocked_since or now) if idle else None
            if blocked_since is not None and now - blocked_since >= idle_s:
                break
    timed_out = waiter.is_alive()
    if timed_out:
        # The job's processes first, while whoever started them is alive to reap them (killing
        # bwrap first leaves its child a zombie of init); then the rest. The run stays unreaped
        # until the waiter returns, so its pid cannot be reused meanwhile.
        if uid is not None:
            _kill_uid(uid)
            waiter.join(1)
        stop()
        waiter.join()
    if "e" in box:
        raise box["e"]
    status, cpu_s = box["w"]
    return status, cpu_s, timed_out


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    """`path` and everything under it (links themselves, never what they point to)."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def _tool_binds(tools: tuple[tuple[str, str], ...]) -> list[str]:
    """Read-only binds of our own tools (host path, path inside), their directories created once."""
    dirs = dict.fromkeys(str(p) for _, inside in tools for p in reversed(Path(inside).parents) if str(p) != "/")
    return [a for d in dirs for a in ("--perms", "0755", "--dir", d)] + [a for t in tools for a in ("--ro-bind", *t)]


_BIN_IS_LINK = Path("/bin").is_symlink()  # merged /usr


@functools.lru_cache(maxsize=4)  # the host's layout: read once, not per call
def _root_links(dirs: tuple[str, ...]) -> tuple[str, ...]:
    """/bin, /lib... as on the host: symlinks into /usr (merged /usr) or read-only binds."""
    out: list[str] = []
    for d in dirs:
        p = Path("/") / d
        if p.is_symlink():
            out += ["--symlink", os.readlink(p), f"/{d}"]
        elif p.is_dir():
            out += ["--ro-bind", str(p), f"/{d}"]
    return tuple(out)


def _read_capped(f, limit: int) -> str:
    f.seek(0)
    data = f.read(limit + 1)
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[output truncated]" if len(data) > limit else "")
