#!/usr/bin/env bash
# Prepares a lent GPU machine's calls for bench/cuda_real.sh when the model is larger than one call
# can carry (64 MiB a call, the working tree included): the GGUF in parts sized to what the tree
# leaves free, the offline bundle and the gguf wheel beside the smallest part, all in .gpu/ (ignored
# through .git/info/exclude), then prints the calls to make, in order, with nothing between them
# (a machine left idle 30 s is given back with what it received).
#
#     bash bench/cuda_parts.sh MODEL.gguf [bench_real flags...]   # prints the calls
#     bash bench/cuda_parts.sh --hold | --restore                  # bench/results/ out of the tree and back
#
# Every call sends the working tree. bench/results/ holds the committed adapters (35 MB each), so
# with it in the tree a call carries little or nothing else: --hold moves it to $HOLD (default
# /tmp/ocaml-grpo-held-results) until --restore; cuda_real.sh needs nothing from it.
# Qwen2.5-Coder-1.5B's 1,117 MB crosses in 18 calls after --hold (2026-12-06: prepared and rehearsed on
# CPU, then no machine was lent; how long the 18 calls take is not measured yet). The flags planned
# for it (issue #55's 1.5B arm; the step count a guess to fit what the transfers leave of 15 minutes):
# --arms base,base_grpo --k 8 --multiple 0 --batch-problems 24 --no-selection --dynamic --no-pool-eval
# --pool 99 --grpo-steps 20 --grpo-prompts 2 --grpo-generations 8 --grpo-lr 5e-5 --grpo-min-lines 0
# (a GRPO stage the box cuts resumes from its checkpoint when the same call runs again).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
hold=${HOLD:-/tmp/ocaml-grpo-held-results}
case "${1:-}" in
    --hold) [ -e "$hold" ] && { echo "$hold exists: --restore first" >&2; exit 1; }
            mv bench/results "$hold"; echo "bench/results/ held in $hold; --restore puts it back"; exit 0 ;;
    --restore) [ -d "$hold" ] || { echo "nothing held in $hold" >&2; exit 1; }
               [ -e bench/results ] && { echo "bench/results exists: not overwritten" >&2; exit 1; }
               mv "$hold" bench/results; git status --short bench/results | head -3; exit 0 ;;
    ""|-h|--help) sed -n 2,14p "$0"; exit 2 ;;
esac
model=$(realpath "$1"); shift
limit=$((64 * 1048576))
tree=$(git ls-files -z | while IFS= read -r -d '' f; do [ -f "$f" ] && stat -c %s "$f"; done | awk '{s += $1} END {print s + 0}')
part=$(( (limit - tree - 1048576) / 1048576 ))  # MiB, a MiB of margin
[ "$part" -ge 16 ] || { echo "the working tree is $((tree / 1048576)) MiB: a call carries ${part} MiB; --hold first" >&2; exit 1; }
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu && mkdir .gpu
[ -f dist/ocaml-grpo-offline.tar.xz ] || make bundle
cp dist/ocaml-grpo-offline.tar.xz .gpu/
wheel=$(.venv/bin/python -m pip download --no-deps --no-index --find-links /opt/pypi/files -d .gpu gguf==0.19.0 -q 2>/dev/null && ls .gpu/gguf-*.whl) \
    || { echo "no gguf wheel (pip download gguf==0.19.0 into .gpu/)" >&2; exit 1; }
split -b "${part}M" -d -a 2 "$model" .gpu/model.
sha=$(sha256sum "$model" | cut -d' ' -f1)
parts=(.gpu/model.*)
extra=$(( $(stat -c %s .gpu/ocaml-grpo-offline.tar.xz) + $(stat -c %s "$wheel") ))
last=${parts[-1]}
[ $(( $(stat -c %s "$last") + extra + tree )) -lt "$limit" ] \
    || { echo "the bundle does not fit beside the last part: send it in a call of its own" >&2; exit 1; }
echo "tree $((tree / 1048576)) MiB, ${#parts[@]} parts of ${part} MiB; sha256 $sha"
echo "call 1 (starts the machine and the install in the background), carry [\"$last\", \".gpu/ocaml-grpo-offline.tar.xz\", \"$wheel\"]:"
echo "  mkdir -p /root/gpu && cp .gpu/* /root/gpu/ && nvidia-smi -L; setsid nohup bash -c 'PREFIX=/root/ocaml-grpo-gpu; bash install-offline.sh /root/gpu/ocaml-grpo-offline.tar.xz \$PREFIX >/root/gpu/install.txt 2>&1 && python3 -m pip install -q --no-index --no-deps --target \$PREFIX/site /root/gpu/$(basename "$wheel") >>/root/gpu/install.txt 2>&1; echo \$? >/root/gpu/install.rc' </dev/null >/dev/null 2>&1 &"
n=2
for p in "${parts[@]}"; do
    [ "$p" = "$last" ] && continue
    echo "call $n, carry [\"$p\"]:  mkdir -p /root/gpu && cp $p /root/gpu/ && ls /root/gpu | wc -l"
    n=$((n + 1))
done
echo "call $n (timeout_s: what is left, less a minute):"
echo "  cat /root/gpu/model.* >/root/model.gguf && echo '$sha  /root/model.gguf' | sha256sum -c || exit 1; until [ -f /root/gpu/install.rc ]; do sleep 2; done; [ \"\$(cat /root/gpu/install.rc)\" = 0 ] || { tail /root/gpu/install.txt; exit 1; }; PREFIX=/root/ocaml-grpo-gpu BOX=... bash bench/cuda_real.sh /root/gpu/ocaml-grpo-offline.tar.xz /root/gpu/$(basename "$wheel") /root/model.gguf \$OUT $*; cp ~/.cache/ocaml-grpo/bench_real/grpo-*/run/metrics.jsonl \$OUT/ 2>/dev/null"
