"""The sandbox's settings: its limits, where it builds and works, and which toolchain it uses
(the system's or the offline bundle's). The sandbox itself is ocaml_grpo/grading/sandbox.py."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ocaml_grpo.config.settings import Auto, Choice, Float, Int, Text, cache_dir, section, setting, settings_of

# The offline bundle's toolchain directory (`make bundle` writes it, install-offline.sh unpacks
# it; OCAML_TOOLCHAIN_DIR names it). Its binaries are Debian's, whose compiled-in paths are
# /usr/bin and /usr/lib/ocaml: every one of them is told where it is by the environment instead.
BIN = "bin"  # ocamlc (the native ocamlc.opt), ocamlfind, ocamlrun, bwrap
OCAML_LIB = "lib/ocaml"  # the standard library and the packages the allowlist names (META, .cmi, .cma)
STUBLIBS = "lib/ocaml/stublibs"  # the C stubs bytecode programs load (Base's, unix's)
FINDLIB_CONF = "etc/findlib.conf"  # no paths in it: OCAMLPATH and OCAMLLIB give them
PREBUILT = "libexec"  # the launcher and the compile server, built by `make bundle` (NAME-KEY of their sources)
TOOLCHAIN_FILES = (f"{BIN}/ocamlc", f"{BIN}/ocamlfind", f"{BIN}/ocamlrun", f"{BIN}/bwrap",
                   f"{OCAML_LIB}/stdlib.cma", FINDLIB_CONF)


def ToolchainDir(s: str) -> str:
    """OCAML_TOOLCHAIN_DIR's parser: empty, or a bundled toolchain directory (made absolute: the
    sandboxes see it at the same path)."""
    if not s:
        return ""
    root = Path(s).expanduser().resolve()
    if not all((root / f).is_file() for f in TOOLCHAIN_FILES):
        raise ValueError
    return str(root)
ToolchainDir.accepts = ("empty (the system's OCaml, findlib, bubblewrap and cc), or the `ocaml` directory "
                        "install-offline.sh unpacked (holding " + ", ".join(TOOLCHAIN_FILES) + ")")


@dataclass(frozen=True)
class Limits:
    # The default wall-clock guard of a test run, in CPU limits. Time-outs are judged by CPU time;
    # the guard only catches a run that does not use the CPU, and must outlast a run niced below
    # compiles that hold both cores (up to OCAML_COMPILE_LIMIT_S) without cutting it short.
    WALL_FACTOR = 10
    cpu_s: int = setting("OCAML_CPU_LIMIT_S", "5", Int(1),
                         "CPU seconds for a completion's test run (a run that used them timed out)")
    wall: float | None = setting("OCAML_WALL_LIMIT_S", "auto",
                                 Auto(Float(0, lo_open=True), lambda env: None, f"{WALL_FACTOR}x the CPU limit"),
                                 "wall-clock guard of one test run (only for runs that do not use the CPU)")
    compile_s: float = setting("OCAML_COMPILE_LIMIT_S", "20.0", Float(0, lo_open=True),
                               "wall/CPU seconds for all the compiler calls made for one completion")
    memory_mb: int = setting("OCAML_MEMORY_MB", "512", Int(1), "address space of a compile or run")
    file_mb: int = setting("OCAML_FILE_MB", "16", Int(1), "largest file a compile or run may write")
    max_procs: int = setting("OCAML_MAX_PROCS", "32", Int(1), "processes per job (counted per job uid)")
    max_files: int = setting("OCAML_MAX_FILES", "64", Int(8), "open files per process")
    output_bytes: int = setting("OCAML_OUTPUT_BYTES", "65536", Int(1), "stdout/stderr bytes kept per call")

    @property
    def wall_s(self) -> float:
        return self.wall or self.WALL_FACTOR * self.cpu_s


@dataclass(frozen=True)
class SandboxConfig:
    """The sandbox's settings, resolved once by the command that runs."""
    mode: str = setting("OCAML_SANDBOX", "bwrap", Choice("bwrap", "none"),
                        "bwrap: every compile and run isolated; none: model code runs on this host UNISOLATED")
    limits: Limits = section(Limits)
    compiler: str = setting(  # how the grader compiles: ocaml_grpo/grading/compilers.py
        "OCAML_COMPILER", "server", Choice("server", "ocamlc"),
        "server: the grader compiles with a persistent compiler-libs process (same outputs as ocamlc); "
        "ocamlc: one ocamlc process per step (problems that `require` packages always use ocamlfind ocamlc)")
    cache: str = setting("OCAML_CACHE_DIR", "auto", Auto(Text, lambda env: str(cache_dir(env)), "$XDG_CACHE_HOME/ocaml-grpo"),
                         "where the grader's OCaml tool (compile server and allowlist check) and the sandbox's launcher "
                         "are built and kept")
    trusted_cache_mb: int = setting("OCAML_TRUSTED_CACHE_MB", "2048", Int(0),
                                    "disk for the trusted test programs kept in OCAML_CACHE_DIR/trusted (~1-4 MB a "
                                    "problem): beyond it, a grader starting up removes the least recently used; 0: none kept")
    toolchain: str = setting("OCAML_TOOLCHAIN_DIR", "", ToolchainDir,
                             "the OCaml toolchain, bubblewrap and prebuilt tools of the offline bundle (install-offline.sh "
                             "prints it); empty: the system's (apt)")
    tmpdir: str | None = setting("OCAML_SANDBOX_TMPDIR", "auto",  # None: the system temp dir
                                 Auto(Text, lambda env: memory_tmpdir(), "/dev/shm when it has 1 GiB free "
                                      "and allows exec, else the system temp dir"),
                                 "where the grader's job directories go")


SANDBOX_SETTINGS = settings_of(SandboxConfig)


def memory_tmpdir(path: str = "/dev/shm", min_free: int = 1 << 30) -> str | None:
    """A memory file system for job directories, when there is a usable one: a grading creates
    and deletes ~20 small files, each a journal write on a disk file system (measured here:
    ~0.3 ms per open on ext4, a tenth of that on tmpfs)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    usable = os.access(path, os.W_OK | os.X_OK) and not st.f_flag & (os.ST_NOEXEC | os.ST_RDONLY)
    return path if usable and st.f_bavail * st.f_frsize >= min_free else None

