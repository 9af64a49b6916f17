#!/usr/bin/env bash
# Installs the offline bundle (`make bundle`: docs/offline.md) on a Linux x86-64
# machine without network that has Python 3.11+ with PyTorch, transformers, peft and accelerate:
#
#     bash install-offline.sh ARCHIVE [PREFIX]    # PREFIX: /opt/ocaml-grpo as root, else ~/.local/ocaml-grpo
#
# PYTHON picks the interpreter (default: python3). Nothing is fetched, nothing outside PREFIX is
# touched, and running it again reinstalls. It leaves in PREFIX:
#   ocaml/      the grader's OCaml toolchain and bubblewrap (what OCAML_TOOLCHAIN_DIR names)
#   site/       the bundle's Python packages that this Python lacked (pip decides which)
#   bin/python  this Python with both
# and prints the command to run next.
set -euo pipefail

top=ocaml-grpo-offline  # the archive's top directory (bundle.py's TOP)
die() { echo "install-offline.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: bash install-offline.sh ARCHIVE [PREFIX]" >&2; exit 2; }
[ -f "$1" ] || die "no archive at $1"
archive=$(realpath "$1")
default_prefix=$([ "$(id -u)" = 0 ] && echo /opt/ocaml-grpo || echo "$HOME/.local/ocaml-grpo")
mkdir -p "${2:-$default_prefix}"
prefix=$(realpath "${2:-$default_prefix}")
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=$(command -v "${PYTHON:-python3}") || die "no ${PYTHON:-python3} on PATH (set PYTHON to the Python that has PyTorch)"

# What pip installs comes from the bundle alone: the machine's pip configuration plays no part.
for v in $(compgen -e | grep '^PIP_' || true); do unset "$v"; done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH  # decide against this Python as it is, not against an earlier install's site/

"$py" - <<'EOF' || die "$py is not a Python 3.11+ with PyTorch, transformers, peft and accelerate (set PYTHON)"
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "peft", "accelerate", "pip") if importlib.util.find_spec(m) is None]
if sys.version_info < (3, 11) or missing:
    sys.exit(f"Python {sys.version.split()[0]}, missing: {' '.join(missing) or 'nothing'}")
EOF

echo "unpacking $archive into $prefix"
unpack=$(mktemp -d "$prefix/.unpack.XXXXXX")
trap 'rm -rf "$unpack"' EXIT
"$py" - "$archive" "$unpack" <<'EOF'
import sys, tarfile
with tarfile.open(sys.argv[1]) as tar:  # the `data` filter, where this Python has it: nothing lands outside
    tar.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
EOF
[ -d "$unpack/$top/ocaml" ] || die "$archive is not an ocaml-grpo offline bundle (no $top/ocaml in it)"

# pip decides, against this Python's packages, which of the bundle's it lacks; the archive's
# directory is searched too (for wheels too large for the bundle: pyarrow, pandas).
if ! "$py" -m pip install --dry-run --quiet --no-index --no-cache-dir --report "$unpack/report.json" \
        --find-links "$unpack/$top/wheels" --find-links "$(dirname "$archive")" -r "$unpack/$top/requirements.txt"; then
    die "pip cannot satisfy the bundle's packages with this Python's (above: which). The bundle carries
trl, datasets, python-dotenv and what they need that the GPU image lacks, not pyarrow (>=24) or pandas
(see requirements-offline.txt): copy their wheels for this Python beside the archive and run this again."
fi
wheels=$("$py" - "$unpack/report.json" <<'EOF'
import json, sys, urllib.parse, urllib.request
for item in json.load(open(sys.argv[1]))["install"]:
    print(urllib.request.url2pathname(urllib.parse.urlparse(item["download_info"]["url"]).path))
EOF
)
rm -rf "$prefix/site" "$prefix/ocaml"
mkdir -p "$prefix/site" "$prefix/bin"
if [ -n "$wheels" ]; then
    # --no-deps: pip already resolved them, against this Python (a --target install would not look at it).
    mapfile -t wheel_list <<<"$wheels"
    "$py" -m pip install --quiet --no-index --no-cache-dir --no-deps --target "$prefix/site" "${wheel_list[@]}"
fi
mv "$unpack/$top/ocaml" "$prefix/ocaml"

cat >"$prefix/bin/python" <<EOF
#!/bin/sh
# Written by install-offline.sh: $py with the offline bundle's packages and OCaml toolchain.
export PYTHONPATH="$prefix/site\${PYTHONPATH:+:\$PYTHONPATH}"
export OCAML_TOOLCHAIN_DIR="\${OCAML_TOOLCHAIN_DIR:-$prefix/ocaml}"
exec "$py" "\$@"
EOF
chmod 755 "$prefix/bin/python"

# The toolchain's binaries run here (a glibc older than VERSIONS says would stop them now, not at
# the trainer's start), and the trainer's imports resolve.
tc=$prefix/ocaml
"$tc/bin/bwrap" --version >/dev/null || die "the bundled bubblewrap does not run here"
env -i PATH="$tc/bin:/usr/bin:/bin" OCAMLLIB="$tc/lib/ocaml" "$tc/bin/ocamlc" -version >/dev/null \
    || die "the bundled ocamlc does not run here ($(head -1 "$tc/VERSIONS"))"
"$tc/bin/ocamlrun" -version >/dev/null || die "the bundled ocamlrun does not run here"
"$prefix/bin/python" -c "import dotenv, datasets; from trl import GRPOConfig, GRPOTrainer" \
    || die "the trainer's packages do not import (above: why)"

added=$(ls "$prefix/site" | sed -n 's/-\([^-]*\)\.dist-info$/ \1/p' | tr '\n' ',' | sed 's/,$//;s/,/, /g')
[ -n "$added" ] || added="none, the machine's Python has them all"
echo "installed in $prefix: $(head -1 "$tc/VERSIONS"); Python packages added: $added"
echo "next, the plumbing run (20 steps of a tiny model; without GRPO_PLUMBING=1 it trains):"
echo "  cd $repo && GRPO_PLUMBING=1 $prefix/bin/python train.py"
