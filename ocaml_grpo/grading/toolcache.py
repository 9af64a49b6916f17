"""Native tools the grader builds on first use, kept in OCAML_CACHE_DIR: the sandbox's launcher
(launch.c, built by ocaml_sandbox.py) and the compile server (ocaml/, built by compile_server.py);
and where the OCaml toolchain comes from (`Toolchain`): the system's, or the offline bundle's.

A binary's name carries a key of its sources and its compiler's version, so a new source or a
compiler upgrade builds a new one; trainer ranks that start together build it once (a lock)."""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ocaml_grpo.config.isolation import BIN, FINDLIB_CONF, OCAML_LIB, PREBUILT, STUBLIBS


class ToolchainError(RuntimeError):
    """The OCaml toolchain or the sandbox is missing or broken; the message says what to install."""


def binary_name(name: str, key_parts: list[str]) -> str:
    """NAME-KEY, KEY a hash of what the binary is built from."""
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    return f"{name}-{key}"


def cached_binary(cache: Path, name: str, key_parts: list[str], build: Callable[[Path], Path]) -> Path:
    """cache/NAME-KEY, built by `build(tmpdir) -> the built file` when it is not there yet."""
    exe = cache / binary_name(name, key_parts)
    if exe.exists():
        return exe
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open(cache / ".build.lock", "w")
    except OSError as e:
        raise ToolchainError(f"cannot write the grader's tool cache directory {cache} ({e}); "
                             "set OCAML_CACHE_DIR (or XDG_CACHE_HOME) to a writable directory") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.exists():
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                built = build(Path(tmp))
                os.chmod(built, 0o755)
                os.replace(built, exe)
    return exe


@dataclass(frozen=True)
class Toolchain:
    """Where the grader's OCaml toolchain and bubblewrap come from: the system's (`root` empty:
    apt's /usr/bin and /usr/lib/ocaml, the launcher and compile server built on first use), or a
    bundled toolchain directory, seen at the same path on the host and inside the sandboxes, so
    that what `ocamlfind query` prints on the host is true inside them too."""
    root: str = ""

    @property
    def env(self) -> dict[str, str]:
        """The variables every toolchain process gets, on the host (bundled) and in the sandbox."""
        if not self.root:
            return {"PATH": "/usr/bin:/bin"}
        lib = f"{self.root}/{OCAML_LIB}"
        return {"PATH": f"{self.root}/{BIN}:/usr/bin:/bin", "OCAMLLIB": lib, "OCAMLPATH": lib,
                "OCAMLFIND_CONF": f"{self.root}/{FINDLIB_CONF}", "CAML_LD_LIBRARY_PATH": f"{self.root}/{STUBLIBS}"}

    @property
    def host_env(self) -> dict[str, str] | None:
        """The environment of a toolchain call made on the host: the system's tools inherit this
        process's (None), the bundled ones get `env` alone."""
        return self.env if self.root else None

    @property
    def trusted_compiler(self) -> str:
        """What builds the trusted test programs: the system's ocamlopt, or the bundle's ocamlc
        (the bundle has no ocamlopt, assembler or linker; its trusted programs run as bytecode)."""
        return "ocamlc" if self.root else "ocamlopt"

    @property
    def stublibs(self) -> str:
        return f"{self.root}/{STUBLIBS}"

    def which(self, tool: str, package: str) -> str:
        """The tool's path; a missing one is a ToolchainError saying how to get it."""
        if not self.root:
            path = shutil.which(tool)
            if not path:
                raise ToolchainError(f"`{tool}` not found on PATH. Install it: apt-get install -y {package} "
                                     "(without apt: the offline bundle, OCAML_TOOLCHAIN_DIR)")
            return path
        path = Path(self.root) / BIN / tool
        if not os.access(path, os.X_OK):
            raise ToolchainError(f"OCAML_TOOLCHAIN_DIR={self.root} has no {BIN}/{tool}: reinstall the bundle")
        return str(path)

    def prebuilt(self, name: str, sources: list[str]) -> Path:
        """The bundle's binary built from these sources: a bundled toolchain has no C compiler or
        ocamlopt to build one, and a binary from other sources must not stand in for it."""
        exe = Path(self.root) / PREBUILT / binary_name(name, sources)
        if not exe.is_file():
            raise ToolchainError(f"OCAML_TOOLCHAIN_DIR={self.root} holds no {name} built from this checkout's "
                                 f"sources (no {PREBUILT}/{exe.name}): the bundle was made from another version "
                                 "of the project. Run `make bundle` on a machine with the system toolchain "
                                 "and install the new archive")
        return exe

    def prebuilt_stubs(self, name: str, sources: list[str]) -> str:
        """The bundle's C stubs built from these sources, as `ocamlc -dllib -lLIB` names them: LIB =
        NAME-KEY, the file dllLIB.so among the stublibs, where bytecode programs find their C stubs
        (CAML_LD_LIBRARY_PATH, in the sandbox too)."""
        lib = binary_name(name, sources)
        if not (Path(self.stublibs) / f"dll{lib}.so").is_file():
            raise ToolchainError(f"OCAML_TOOLCHAIN_DIR={self.root} holds no {name} stubs built from this checkout's "
                                 f"sources (no {STUBLIBS}/dll{lib}.so): the bundle was made from another version "
                                 "of the project. Run `make bundle` on a machine with the system toolchain "
                                 "and install the new archive")
        return lib
