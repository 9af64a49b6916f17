"""`make bundle`: one archive holding what the trainer and the grader need on a GPU machine without
internet, beyond its PyTorch, transformers, peft and accelerate (docs/offline.md).

    python bundle.py [ARCHIVE]     # default dist/ocaml-grpo-offline.tar.xz; install-offline.sh installs it

- wheels/: the packages requirements-offline.txt names (why each, and what is left out, is written
  there), for CPython 3.11 and 3.12 on manylinux x86-64; requirements.txt: the ones to ask pip for.
- ocaml/: the grader's OCaml toolchain (OCAML_TOOLCHAIN_DIR), taken from this machine's Debian
  packages: ocamlc (the native ocamlc.opt), ocamlfind and ocamlrun; the standard library and the
  packages the allowlist names with what they require (META, .cmi, .cma, .cmo, C stubs); bubblewrap
  with the shared libraries it needs beyond glibc; the sandbox's launcher, the compile server and
  the trusted programs' C primitives for abstract values (among the stublibs), built here (the
  machine needs neither a C compiler nor ocamlopt).

Nothing in it names a path of this machine: the OCaml binaries' compiled-in /usr paths are
overridden by the environment (ocaml_grpo/toolcache.Toolchain), the findlib configuration holds no
path, and bwrap finds its libraries through $ORIGIN. The same inputs give the same bytes (names
sorted, dated 0, owned by root, xz)."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ocaml_grpo.commands.offline_bundle import ARCHIVE, MAX_MIB, TOP, toolchain, wheels, write_archive

def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bundle.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("archive", nargs="?", default=str(ARCHIVE))
    archive = Path(parser.parse_args(argv).archive).resolve()
    with tempfile.TemporaryDirectory(prefix="ocaml-grpo-bundle-") as tmp:
        top = Path(tmp) / TOP
        install = wheels(top / "wheels")
        (top / "requirements.txt").write_text("".join(f"{r}\n" for r in install))
        toolchain(top / "ocaml")
        write_archive(Path(tmp), archive)
        sizes = {d.name: sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in (top / "wheels", top / "ocaml")}
    mib = archive.stat().st_size / (1 << 20)
    print(f"{archive}: {mib:.1f} MiB (unpacked: wheels {sizes['wheels'] / (1 << 20):.1f} MiB, "
          f"ocaml {sizes['ocaml'] / (1 << 20):.1f} MiB)")
    if mib > MAX_MIB:
        print(f"bundle: larger than {MAX_MIB} MiB: it will not fit one transfer to the GPU machines", file=sys.stderr)
        return 1
    print(f"install on the machine: bash install-offline.sh {archive.name} [PREFIX]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
