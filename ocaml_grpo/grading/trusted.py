"""A problem's trusted program: the prompt's definitions, a stub per entry point that asks the
oracle, and the tests (harness.render_trusted), with the tests' closures compiled for the oracle
(shipped.shippable). It runs no model code and decides every assertion. Built once per problem in
the toolchain sandbox, kept for the grader's life and on disk (OCAML_CACHE_DIR/trusted/KEY/), so a
second grader, a resumed run and the CLI do not build it again. KEY covers the interface, the
tests, the packages, the sources that write and build the program, and the compiler's version.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.compilers import WARNINGS_OFF, CompileBudget, Compilers, OcamlcSteps
from ocaml_grpo.grading.diagnostics import TIMED_OUT, parse_compiler_error
from ocaml_grpo.grading.harness import HANDLES_C, WIRE_ML, plan_of, render_trusted
from ocaml_grpo.grading.interface import Interface
from ocaml_grpo.grading.shipped import Lambda, lambda_unit_text, names_the_tests_may_bind, rewrite_tests, shippable
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.grading.toolcache import Toolchain, ToolchainError, cached_binary

TRUSTED_IN_USE_S = 3600  # a trusted program used this recently is never swept from the cache
TRUSTED_META = "trusted.json"  # in a cached trusted program's directory: its build error, closures, unit


@functools.lru_cache(maxsize=1)
def grader_code_digest() -> str:
    """A hash of the code that writes a trusted program and decides what compiles: a change in it
    makes every cached trusted program and audit verdict stale."""
    here = Path(__file__).resolve().parent
    text = "\0".join((here / f).read_text() for f in ("grader.py", "trusted.py", "harness.py", "oracle.py",
                                                       "codecs.py", "writeback.py", "shipped.py",
                                                       "interface.py", "source.py", "ocaml/wire.ml",
                                                       "ocaml/handles.c"))
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def _native_compiler_version(toolchain: Toolchain) -> str:
    return subprocess.run(["ocamlfind", toolchain.trusted_compiler, "-version"], capture_output=True, text=True,
                          env=toolchain.host_env).stdout.strip()


def sweep_trusted_cache(cache: Path, max_bytes: int, in_use_s: float = TRUSTED_IN_USE_S) -> list[Path]:
    """Remove the least recently used trusted programs until the cache holds at most max_bytes,
    never one used in the last in_use_s (a grader marks its entries every minute while it runs),
    and the half-written entries older than that (a grader that died while storing). Returns what
    it removed."""
    now, entries, removed = time.time(), [], []
    try:
        listing = list(os.scandir(cache))
    except OSError:
        return removed
    for e in listing:
        try:
            st = e.stat(follow_symlinks=False)
            size = sum(f.stat(follow_symlinks=False).st_size for f in os.scandir(e.path))
        except OSError:
            continue  # removed meanwhile
        entries.append((st.st_mtime, size, Path(e.path)))
    total = sum(size for _, size, _ in entries)
    for mtime, size, path in sorted(entries, key=lambda x: x[0]):
        if now - mtime < in_use_s:
            break  # the rest are newer still
        if path.name.startswith(".") or total > max_bytes:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            total -= size
    return removed


@dataclass(frozen=True)
class Trusted:
    """A problem's trusted program, and the tests' closures compiled for its oracles."""
    program: Path
    error: str  # "" when it built
    lambdas: tuple[Lambda, ...]
    lambda_unit: str  # the closures' unit ("" when none ships)
    lambda_dir: Path
    assertions: int  # the tests' graded units (source.assertion_count), kept with the program so that
    split: bool  # a grader that finds it on disk need not lex the tests; split: per assertion


class TrustedPrograms:
    """One grader's trusted programs: found in memory, on disk, or built (a build failure is kept
    too: the tests cannot run, no completion passes)."""

    def __init__(self, sandbox: Sandbox, compilers: Compilers, tmp_root: Path, wire: str, wire_dir: Path):
        self.sandbox, self.compilers, self.tmp_root, self.wire, self.wire_dir = sandbox, compilers, tmp_root, wire, wire_dir
        config = sandbox.config
        self.cache = Path(config.cache) / "trusted" if config.cache and config.trusted_cache_mb else None
        if self.cache is not None:
            sweep_trusted_cache(self.cache, config.trusted_cache_mb << 20)
        self.used: dict[str, float] = {}  # key -> when its entry on disk was last marked used
        self.version = "\0".join([_native_compiler_version(sandbox.toolchain), sandbox.toolchain.root,
                                  grader_code_digest()])
        self._built: dict[str, Trusted] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, iface: Interface, tests: str, requires: tuple[str, ...]) -> Trusted:
        """The problem's trusted program (and the tests' closures the oracle holds too)."""
        key = hashlib.sha256("\0".join([repr(iface), tests, *requires, self.version]).encode()).hexdigest()[:24]
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            # (one found on disk is read again if the directory went away: a cache cleared meanwhile)
            if key not in self._built or not self._built[key].lambda_dir.is_dir():
                self._built[key] = (self.cached(key, iface, tests)
                                    or self._store(key, self.build(key, iface, tests, requires)))
            self._mark_used(key)
            return self._built[key]

    def _mark_used(self, key: str) -> None:
        """Keep the entry's time of last use (its directory's mtime) within a minute: what the
        sweep of another grader starting up goes by, so that it never removes one in use."""
        now = time.time()
        if self.cache is not None and now - self.used.get(key, 0) > 60:
            self.used[key] = now
            try:
                os.utime(self.cache / key)
            except OSError:
                pass  # not stored (a failed write): nothing to keep

    def cached(self, key: str, iface: Interface, tests: str) -> Trusted | None:
        """The entry on disk, as the audit keeps its results."""
        if self.cache is None:
            return None
        d = self.cache / key
        try:
            meta = json.loads((d / TRUSTED_META).read_text())
        except (OSError, ValueError):
            return None
        kept = set(meta["lambdas"])
        lambdas = tuple(lam for lam in shippable(iface, tests) if lam.j in kept)
        return Trusted(d / "prog", meta["error"], lambdas, meta["unit"], d, meta["assertions"], meta["split"])

    def _store(self, key: str, built: Trusted) -> Trusted:
        """Written whole under another name, then renamed into place."""
        if self.cache is None:
            return built
        try:
            self.cache.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.cache))
            files = ["prog"] + ([f"{built.lambda_unit}.cmi", f"{built.lambda_unit}.cmo"] if built.lambda_unit else [])
            # Copied by `cp`, not by this process: a child another grading thread forks while this
            # process holds `prog` open for writing would keep that write handle until its exec, and a
            # grader that runs the stored program then fails with "Text file busy" (ETXTBSY).
            present = [str(built.lambda_dir / f) for f in files if (built.lambda_dir / f).exists()]
            subprocess.run(["cp", "-p", *present, str(tmp)], check=True, capture_output=True)
            (tmp / TRUSTED_META).write_text(json.dumps({"error": built.error, "unit": built.lambda_unit,
                                                        "lambdas": [lam.j for lam in built.lambdas],
                                                        "assertions": built.assertions, "split": built.split}))
            os.chmod(tmp, 0o755)
            try:
                os.rename(tmp, self.cache / key)
            except OSError:  # another grader stored it first: theirs is the same program
                shutil.rmtree(tmp, ignore_errors=True)
        except (OSError, subprocess.CalledProcessError):  # a cache that cannot be written costs only the next grader a build
            pass
        return built

    def build(self, key: str, iface: Interface, tests: str, requires: tuple[str, ...]) -> Trusted:
        """Compile the tests' closures for the oracle and the trusted program, in the toolchain sandbox."""
        d = self.tmp_root / f"trusted-{key}"
        d.mkdir()
        for ext in (".cmi", ".cmo"):
            shutil.copyfile(self.wire_dir / (self.wire + ext), d / (self.wire + ext))
        limit = self.sandbox.limits.compile_s * 4
        steps = OcamlcSteps(self.compilers, d, CompileBudget(limit), requires)
        lambdas, unit = shippable(iface, tests), f"lam_{key[:16]}"
        # Each closure that does not compile alone stays a handle: first with every name the tests
        # may bind declared unusable (one that uses such a name means the tests' value), then as shipped.
        for poison in (names_the_tests_may_bind(tests), frozenset()):
            while lambdas:
                (d / f"{unit}.ml").write_text(lambda_unit_text(iface, lambdas, poison))
                rep = steps.compile(f"{unit}.ml", "")
                if rep.returncode == 0 and not rep.timed_out:
                    break
                bad = rep.loc[2] if rep.loc else ""
                kept = tuple(lam for lam in lambdas if f"lambda_{lam.j}.ml" != bad)
                lambdas = kept if len(kept) < len(lambdas) and not rep.timed_out else ()
        wire = self.wire.capitalize()
        text = render_trusted(iface, rewrite_tests(tests, lambdas, wire), plan_of(rewrite_tests(tests, lambdas, wire)),
                              wire)
        (d / "trusted.ml").write_text(text)
        # Native code where the toolchain has ocamlopt: it builds the tests' inputs and reads every
        # reply, and it runs no model code (a million-element list crosses ~5x faster than from
        # bytecode); built once per problem. The offline bundle ships no native compiler.
        (d / "twire.ml").write_text(WIRE_ML)
        packages = ["-package", ",".join(requires), "-linkpkg"] if requires else []
        build = shlex.join(["ocamlfind", self.sandbox.toolchain.trusted_compiler, *WARNINGS_OFF, *packages,
                            *self._handle_stubs(iface, d), "-o", "prog", "twire.ml", "trusted.ml"])
        (d / "trusted.ml").write_text(text.replace(f"{wire}.", "Twire."))
        res = self.compilers.run_script(f"{build} >build.out 2>&1; echo $? >build.rc\n", d, limit)
        self.sandbox.disown(d)
        error = ""
        if res.timed_out or _read_text(d / "build.rc").strip() != "0":
            error = "the tests do not compile against the prompt's entry points: " + (
                TIMED_OUT.message if res.timed_out else parse_compiler_error(_read_text(d / "build.out")).message)
        plan = plan_of(tests)
        return Trusted(d / "prog", error, lambdas, unit if lambdas else "", d, src.assertion_count(plan), plan is not None)


    def _handle_stubs(self, iface: Interface, d: Path) -> list[str]:
        """The handles' C primitives (ocaml/handles.c), for an interface with abstract types: compiled
        in with ocamlopt; the bundle's bytecode loads them prebuilt (it has no C compiler)."""
        if not any(t.kind == "handle" for t in iface.types):
            return []
        toolchain = self.sandbox.toolchain
        if toolchain.trusted_compiler == "ocamlc":
            return ["-dllib", "-l" + toolchain.prebuilt_stubs("handles", [HANDLES_C])]
        (d / "handles.c").write_text(HANDLES_C)
        return ["handles.c"]


def build_handle_stubs(cache: Path, toolchain: Toolchain = Toolchain()) -> Path:
    """ocaml/handles.c as the shared library a bytecode trusted program loads: the offline bundle's
    (`make bundle` ships it among its stublibs: Toolchain.prebuilt_stubs)."""
    cc = toolchain.which("cc", "gcc")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    where = subprocess.run(["ocamlc", "-where"], capture_output=True, text=True, env=toolchain.host_env).stdout.strip()

    def build(tmp: Path) -> Path:
        (tmp / "handles.c").write_text(HANDLES_C)
        res = subprocess.run([cc, "-O2", "-Wall", "-shared", "-fPIC", "-I", where, "-o", "dllhandles.so", "handles.c"],
                             cwd=tmp, capture_output=True, text=True)
        if res.returncode != 0:
            raise ToolchainError(f"building the handles' stubs with `{cc}` failed: {(res.stderr or res.stdout).strip()[-600:]}")
        return tmp / "dllhandles.so"

    return cached_binary(cache, "dllhandles", [HANDLES_C, version, where], build)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
