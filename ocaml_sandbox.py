"""The sandbox: every toolchain call and every run of model code, isolated and bounded.

The implementation is ocaml_grpo/grading/sandbox.py (with its launcher, grading/launch.c); this
file is its public door, for people who want to run OCaml the way the grader does:

    from ocaml_sandbox import Sandbox, SandboxConfig, from_env
    box = Sandbox(SandboxConfig())   # the defaults; from_env(SandboxConfig, os.environ) reads OCAML_*
    box.run(["./prog"], workdir, program=workdir / "prog")   # a RunResult
    box.close()   # stops its idle prepared sandboxes (they also end with this process)

What it covers (bubblewrap, on by default): no network; no /proc; a scrubbed environment; a PID
namespace of its own (everything the program started dies with it); compiles see a read-only /usr
and write only their job directory; model code sees only the OCaml bytecode runtime, its libraries
and the launcher (no shell, no other program), with small in-memory /work and /tmp; rlimits on CPU
seconds, address space, file size and open files; a wall-clock guard that kills the whole tree.
As root, model code runs in prepared sandboxes (one bubblewrap started once, each run a fresh
child in new mount, IPC and PID namespaces with a new /work and /tmp and its own uid): the runs of
one prepared sandbox follow one another and share its read-only files and its empty network
namespace, never its processes or files (docs/grader.md, Isolation).

What it does not cover, plainly:
- The kernel is shared. Bubblewrap is namespaces and rlimits, not a virtual machine: a kernel
  exploit in model code escapes it. Grade on a machine you would let the model's code run on.
- There is no seccomp filter: every system call the kernel offers inside the namespaces is allowed.
- The process limit (OCAML_MAX_PROCS) holds only when the trainer runs as root, which gives each
  concurrent job an unprivileged uid of its own; without root, RLIMIT_NPROC counts every process
  of your user, so it is set but does not bound a fork bomb by itself (the PID namespace and the
  wall-clock guard still end it).
- Memory is bounded per process (RLIMIT_AS), not per job by a cgroup.
- OCAML_SANDBOX=none turns isolation off: model code runs as you, with only the rlimits and the
  wall-clock guard (every breakdown record then says "isolated": false). Use it only where
  bubblewrap cannot run and the machine is disposable.
What credit a program earns is decided elsewhere, by a program the model's code never runs in
(ocaml_grpo/grading/grader.py, docs/grader.md).
"""
from ocaml_grpo.config.isolation import SANDBOX_SETTINGS, Limits, SandboxConfig
from ocaml_grpo.config.settings import from_env
from ocaml_grpo.grading.sandbox import RunResult, Sandbox
from ocaml_grpo.grading.toolcache import ToolchainError

__all__ = ["Limits", "RunResult", "SANDBOX_SETTINGS", "Sandbox", "SandboxConfig", "ToolchainError", "from_env"]
