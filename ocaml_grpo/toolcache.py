"""Native tools the grader builds on first use, kept in OCAML_CACHE_DIR: the sandbox's launcher
(launch.c, built by ocaml_sandbox.py) and the compile server (ocaml/, built by compile_server.py).

A binary's name carries a key of its sources and its compiler's version, so a new source or a
compiler upgrade builds a new one; trainer ranks that start together build it once (a lock)."""
from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable


class ToolchainError(RuntimeError):
    """The OCaml toolchain or the sandbox is missing or broken; the message says what to install."""


def cached_binary(cache: Path, name: str, key_parts: list[str], build: Callable[[Path], Path]) -> Path:
    """cache/NAME-KEY, built by `build(tmpdir) -> the built file` when it is not there yet."""
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    exe = cache / f"{name}-{key}"
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
