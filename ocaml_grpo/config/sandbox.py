"""The sandbox's settings: its limits, where it builds and works, and which toolchain it uses
(the system's or the offline bundle's). The sandbox itself is ocaml_grpo/grading/sandbox.py."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ocaml_grpo.config.settings import Auto, Choice, Float, Int, Setting, Text, cache_dir, resolve

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
    cpu_s: int = 5
    wall_s: float = 50.0
    compile_s: float = 20.0
    memory_mb: int = 512
    file_mb: int = 16
    max_procs: int = 32
    max_files: int = 64
    output_bytes: int = 65536

    @classmethod
    def from_settings(cls, v: Mapping[str, Any]) -> "Limits":
        """From values resolved over SANDBOX_SETTINGS."""
        return cls(cpu_s=v["OCAML_CPU_LIMIT_S"], wall_s=v["OCAML_WALL_LIMIT_S"] or cls.WALL_FACTOR * v["OCAML_CPU_LIMIT_S"],
                   compile_s=v["OCAML_COMPILE_LIMIT_S"], memory_mb=v["OCAML_MEMORY_MB"], file_mb=v["OCAML_FILE_MB"],
                   max_procs=v["OCAML_MAX_PROCS"], max_files=v["OCAML_MAX_FILES"], output_bytes=v["OCAML_OUTPUT_BYTES"])


@dataclass(frozen=True)
class SandboxConfig:
    """The sandbox's settings, resolved once by the command that runs (`sandbox_config`)."""
    mode: str = "bwrap"
    limits: Limits = field(default_factory=Limits)
    compiler: str = "server"  # how the grader compiles: ocaml_grpo/grading/compilers.py
    tmpdir: str | None = field(default_factory=lambda: memory_tmpdir())  # the grader's job directories (None: system temp)
    cache: str = str(Path.home() / ".cache" / "ocaml-grpo")  # where the grader's OCaml tool is built
    toolchain: str = ""  # a bundled toolchain directory ("": the system's)

    @classmethod
    def from_settings(cls, v: Mapping[str, Any]) -> "SandboxConfig":
        """From values resolved over SANDBOX_SETTINGS (with the other settings of a command)."""
        return cls(v["OCAML_SANDBOX"], Limits.from_settings(v), v["OCAML_COMPILER"], v["OCAML_SANDBOX_TMPDIR"],
                   v["OCAML_CACHE_DIR"], v["OCAML_TOOLCHAIN_DIR"])


SANDBOX_SETTINGS = [
    Setting("OCAML_SANDBOX", SandboxConfig.mode, Choice("bwrap", "none"),
            "bwrap: every compile and run isolated; none: model code runs on this host UNISOLATED"),
    Setting("OCAML_CPU_LIMIT_S", str(Limits.cpu_s), Int(1),
            "CPU seconds for a completion's test runs (restarts share them; a run that used them timed out)"),
    Setting("OCAML_WALL_LIMIT_S", "auto", Auto(Float(0, lo_open=True), lambda env: None, f"{Limits.WALL_FACTOR}x the CPU limit"),
            "wall-clock guard of one test run (only for runs that do not use the CPU)"),
    Setting("OCAML_COMPILE_LIMIT_S", str(Limits.compile_s), Float(0, lo_open=True),
            "wall/CPU seconds for all the compiler calls made for one completion"),
    Setting("OCAML_MEMORY_MB", str(Limits.memory_mb), Int(1), "address space of a compile or run"),
    Setting("OCAML_FILE_MB", str(Limits.file_mb), Int(1), "largest file a compile or run may write"),
    Setting("OCAML_MAX_PROCS", str(Limits.max_procs), Int(1), "processes per job (counted per job uid)"),
    Setting("OCAML_MAX_FILES", str(Limits.max_files), Int(8), "open files per process"),
    Setting("OCAML_OUTPUT_BYTES", str(Limits.output_bytes), Int(1), "stdout/stderr bytes kept per call"),
    Setting("OCAML_COMPILER", SandboxConfig.compiler, Choice("server", "ocamlc"),
            "server: the grader compiles with a persistent compiler-libs process (same outputs as ocamlc); "
            "ocamlc: one ocamlc process per step (problems that `require` packages always use ocamlfind ocamlc)"),
    Setting("OCAML_CACHE_DIR", "auto", Auto(Text, lambda env: str(cache_dir(env)), "$XDG_CACHE_HOME/ocaml-grpo"),
            "where the grader's OCaml tool (compile server and allowlist check) and the sandbox's launcher are built and kept"),
    Setting("OCAML_TOOLCHAIN_DIR", SandboxConfig.toolchain, ToolchainDir,
            "the OCaml toolchain, bubblewrap and prebuilt tools of the offline bundle (install-offline.sh "
            "prints it); empty: the system's (apt)"),
    Setting("OCAML_SANDBOX_TMPDIR", "auto", Auto(Text, lambda env: memory_tmpdir(), "/dev/shm when it has 1 GiB free "
                                                 "and allows exec, else the system temp dir"),
            "where the grader's job directories go"),
]


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


def sandbox_config(environ: Mapping[str, str]) -> SandboxConfig:
    """The sandbox's settings from an environment, validated; a bad value is a ValueError naming
    the variable. For commands that resolve these settings alone."""
    values, errors = resolve(SANDBOX_SETTINGS, environ)
    if errors:
        raise ValueError("; ".join(errors))
    return SandboxConfig.from_settings(values)
