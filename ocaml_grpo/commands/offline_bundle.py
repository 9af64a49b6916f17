"""`python bundle.py`'s work (`make bundle`): the offline archive's wheels, the grader's OCaml
toolchain taken from this machine, and the archive written reproducibly (bundle.py says what it
holds and why).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from ocaml_grpo.grading import toolcache
from ocaml_grpo.grading.server import build_server, server_sources
from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.grading.harness import HANDLES_C
from ocaml_grpo.grading.sandbox import build_launcher, launcher_sources
from ocaml_grpo.grading.trusted import build_handle_stubs

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its requirements files and dist/
ARCHIVE = ROOT / "dist" / "ocaml-grpo-offline.tar.xz"
TOP = "ocaml-grpo-offline"  # the archive's one top directory
MAX_MIB = 60  # the GPU machines take files 64 MiB at a time, the checkout travelling beside it
PYTHONS = ("3.11", "3.12")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
# The findlib packages the allowlist names (Base, React, CalendarLib); ocamlfind adds what they
# require. `threads`: ocamlfind reads its META on every `ocamlfind ocamlc`.
OCAML_PACKAGES = ("base", "react", "calendar", "threads")
GLIBC_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt)\b")
FINDLIB_CONF = """\
# The offline bundle's findlib configuration. No paths: the bundle can be unpacked anywhere, and
# OCAMLPATH and OCAMLLIB (set by the grader, ocaml_grpo/toolcache.Toolchain) say where it is.
ldconf="ignore"
"""


def run(argv: list[str], **kw) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        sys.exit(f"bundle: `{' '.join(argv)}` failed:\n{(res.stderr or res.stdout).strip()[-2000:]}")
    return res.stdout


def native(path: str) -> str:
    """The real file, which must be a native executable (a bytecode one needs /usr/bin/ocamlrun)."""
    real = os.path.realpath(path)
    with open(real, "rb") as f:
        if f.read(4) != b"\x7fELF":
            sys.exit(f"bundle: {path} is not a native executable")
    return real


def copy(src: str | Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o755 if os.access(src, os.X_OK) else 0o644)


# ----------------------------------------------------------------------------- wheels

def requirement_names(path: Path) -> list[str]:
    """`name` or `name==version` per line, comments dropped."""
    return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]


def wheels(dest: Path) -> list[str]:
    """Download requirements-offline.txt's wheels; return the pins install-offline.sh asks pip for
    (the packages requirements.txt names too: their dependencies come along as needed)."""
    wanted = requirement_names(ROOT / "requirements-offline.txt")
    for version in PYTHONS:
        run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--only-binary=:all:", "--implementation", "cp", "--python-version", version,
             *[a for p in PLATFORMS for a in ("--platform", p)], "-c", str(ROOT / "requirements.txt"),
             "-d", str(dest), *wanted])
    versions: dict[str, set[str]] = {}
    for whl in dest.glob("*.whl"):
        name, version = whl.name.split("-")[:2]
        versions.setdefault(name.lower().replace("_", "-"), set()).add(version)
    if extra := {n: v for n, v in versions.items() if len(v) > 1}:
        sys.exit(f"bundle: two versions of one package would stop pip on the machine: {extra}")
    pinned = {n.split("==")[0].lower(): n for n in requirement_names(ROOT / "requirements.txt")}
    return [pinned[n] for n in (w.split("==")[0].lower() for w in wanted) if n in pinned]


# ----------------------------------------------------------------------------- the OCaml toolchain

def toolchain(dest: Path) -> None:
    system = toolcache.Toolchain()
    bin_dir, lib = dest / toolcache.BIN, dest / toolcache.OCAML_LIB
    for name, tool, package in (("ocamlc", "ocamlc.opt", "ocaml-nox"), ("ocamlfind", "ocamlfind", "ocaml-findlib"),
                                ("ocamlrun", "ocamlrun", "ocaml-nox")):
        copy(native(system.which(tool, package)), bin_dir / name)
    stdlib = Path(run(["ocamlfind", "printconf", "stdlib"]).strip()).resolve()

    def take(src: Path) -> None:
        try:
            copy(src, lib / src.relative_to(stdlib))
        except ValueError:
            sys.exit(f"bundle: {src} lies outside the standard library's directory {stdlib}")

    # The standard library: its interfaces, its archive, the bytecode executables' header.
    for f in sorted(stdlib.iterdir()):
        if f.is_file() and (f.suffix == ".cmi" or f.name in ("stdlib.cma", "std_exit.cmo")
                            or f.name.startswith("camlheader")):
            take(f)
    # Each package: its META, its interfaces, the archives a bytecode link takes from it.
    packages = run(["ocamlfind", "query", "-r", "-format", "%p", *OCAML_PACKAGES]).split()
    for p in packages:
        take(Path(run(["ocamlfind", "query", "-format", "%m", p]).strip()))
        archives = run(["ocamlfind", "query", "-predicates", "byte", "-format", "%a", p]).split()
        directory = Path(run(["ocamlfind", "query", "-format", "%d", p]).strip())
        for f in sorted(directory.iterdir()):
            if f.is_file() and (f.suffix == ".cmi" or f.name in archives):
                take(f)
    # The C stubs the shipped archives load (Base's, unix's), which bytecode programs open at run time.
    stubs = set()
    for cma in sorted(lib.rglob("*.cma")):
        line = [ln for ln in run(["ocamlobjinfo", str(cma)]).splitlines() if ln.startswith("Extra dynamically-loaded")]
        stubs |= {f"dll{a[2:]}.so" for a in line[0].split(":")[1].split() if a.startswith("-l")} if line else set()
    for s in sorted(stubs):
        take(stdlib / "stublibs" / s)
    (lib / "ld.conf").write_text("")  # no paths: CAML_LD_LIBRARY_PATH names the stubs' directory
    (dest / toolcache.FINDLIB_CONF).parent.mkdir(parents=True, exist_ok=True)
    (dest / toolcache.FINDLIB_CONF).write_text(FINDLIB_CONF)

    # bubblewrap, finding the libraries it needs beyond glibc beside it (libcap, libselinux, ...).
    bwrap = bin_dir / "bwrap"
    copy(native(system.which("bwrap", "bubblewrap")), bwrap)
    for line in run(["ldd", str(bwrap)]).splitlines():
        name, _, path = line.strip().partition(" => ")
        if path and not GLIBC_LIBS.match(name):
            copy(os.path.realpath(path.split(" (")[0]), dest / "lib" / name)
    patchelf = shutil.which("patchelf") or sys.exit("bundle: patchelf not found: apt-get install -y patchelf")
    # DT_RPATH, not RUNPATH: it also serves the libraries' own needs (libselinux's libpcre2).
    run([patchelf, "--force-rpath", "--set-rpath", "$ORIGIN/../lib", str(bwrap)])

    # Our tools, built here from this checkout's sources, named by them (toolcache.Toolchain.prebuilt).
    cache = cache_dir(os.environ)
    for name, exe, sources in (("launch", build_launcher(cache), launcher_sources()),
                               ("compile_server", build_server(cache), list(server_sources().values()))):
        copy(exe, dest / toolcache.PREBUILT / toolcache.binary_name(name, sources))
    # the handles' primitives, which the bundle's bytecode trusted programs load (trusted.py)
    copy(build_handle_stubs(cache), dest / toolcache.STUBLIBS / f"dll{toolcache.binary_name('handles', [HANDLES_C])}.so")

    # What is in it, and the oldest glibc its binaries run with (the newest symbol version they name).
    packages_versions = re.sub(r" \[distributed with .*\]", "", run(["ocamlfind", "query", "-format", "%p %v", *packages]))
    glibc = max((tuple(map(int, v)) for f in sorted(dest.rglob("*")) if f.is_file() and f.read_bytes()[:4] == b"\x7fELF"
                 for v in re.findall(rb"GLIBC_(\d+)\.(\d+)", f.read_bytes())), default=(0, 0))
    (dest / "VERSIONS").write_text(
        f"OCaml {run([str(bin_dir / 'ocamlc'), '-version']).strip()}, findlib "
        f"{run(['ocamlfind', 'query', '-format', '%v', 'findlib']).strip()}, {run([str(bwrap), '--version']).strip()}"
        f" (Debian's); x86-64 Linux with glibc >= {glibc[0]}.{glibc[1]}\npackages:\n{packages_versions}")


# ----------------------------------------------------------------------------- the archive

def write_archive(stage: Path, archive: Path) -> None:
    """stage/TOP as a tar.xz whose bytes depend on the files alone."""
    def info(path: Path) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(str(path.relative_to(stage)))
        ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "root", "root"
        executable = path.is_dir() or os.access(path, os.X_OK)
        ti.mode = 0o755 if executable else 0o644
        if path.is_dir():
            ti.type = tarfile.DIRTYPE
        else:
            ti.size = path.stat().st_size
        return ti

    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:xz", preset=9, format=tarfile.GNU_FORMAT) as tar:
        for path in [stage / TOP, *sorted((stage / TOP).rglob("*"))]:
            ti = info(path)
            if ti.isdir():
                tar.addfile(ti)
            else:
                with open(path, "rb") as f:
                    tar.addfile(ti, f)
    os.replace(tmp, archive)
