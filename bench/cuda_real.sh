#!/usr/bin/env bash
# bench_real (base, base + GRPO, SFT only, SFT + GRPO on the real model) on a GPU machine without network:
# install the offline bundle (`make bundle`) unless PREFIX already holds it, add the gguf package
# from its wheel, then run the benchmark on the model's .gguf with the flags given.
#
#     bash bench/cuda_real.sh ARCHIVE GGUF_WHEEL MODEL.gguf OUT [bench_real flags...]
#
# The .gguf is larger than one transfer to a lent GPU machine (64 MiB a call): SmolLM2's 98 MB in two
# parts, Qwen2.5-Coder-0.5B's 491 MB in eight (`split -b 60M` of the file `make model-qwen05` assembles:
# `python train.py model` keeps none, so `cat` the six installed parts, or take them from the wheels),
# one part a call, each copied out of the repository there (/root survives between calls on a warm
# machine; ignored files in the checkout may not), joined there and checked with sha256sum against
# ocaml_grpo/models/named.py's value before use (`bench/cuda_parts.sh` prepares the parts and prints
# the calls). MultiPL-E's rows are not in the repository: pass
# --multiple 0 unless they were sent too.
#
# PREFIX: where the bundle goes (default ~/ocaml-grpo-gpu: a second call on the same machine
# skips the install); PYTHON: the Python with PyTorch (default python3); BOX: the benchmark's time
# box in seconds (default 540). Everything the benchmark prints goes to OUT/bench.txt as it comes,
# its JSON to OUT/real_model.json, GRPO's learning.log and the SFT log beside them, so a run cut off
# by its box keeps what was measured.
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: bash bench/cuda_real.sh ARCHIVE GGUF_WHEEL MODEL.gguf OUT [bench_real flags...]" >&2; exit 2; }
archive=$1 wheel=$2 model=$(realpath "$3") out=$4; shift 4
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${PREFIX:-$HOME/ocaml-grpo-gpu}
mkdir -p "$out"
out=$(realpath "$out")
cd "$repo"
t_start=$SECONDS
log() { echo "[$(date +%T) +$((SECONDS - t_start))s] $*" | tee -a "$out/progress.txt"; }

if [ ! -x "$prefix/bin/python" ]; then
    log "install the bundle"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$out/machine.txt" 2>&1
    bash install-offline.sh "$archive" "$prefix" >"$out/install.txt" 2>&1 || { tail -20 "$out/install.txt"; exit 1; }
    "${PYTHON:-python3}" -m pip install --quiet --no-index --no-deps --target "$prefix/site" "$wheel" \
        >>"$out/install.txt" 2>&1 || { tail -5 "$out/install.txt"; exit 1; }
fi
log "bench_real on $model: $*"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout "${BOX:-540}" "$prefix/bin/python" -m bench.bench_real --model "$model" \
    --json "$out/real_model.json" "$@" >"$out/bench.txt" 2>"$out/bench.err"
rc=$?
log "bench_real: exit $rc"
stages=${XDG_CACHE_HOME:-$HOME/.cache}/ocaml-grpo/bench_real
for f in "$stages"/grpo-*/run/learning.log; do [ -f "$f" ] && cp "$f" "$out/$(basename "$(dirname "$(dirname "$f")")")_learning.log"; done
find "$stages" -name sft_log.jsonl -exec cp {} "$out/" \; 2>/dev/null
grep -E "^(bench_real|   |\| |[a-z_]+-[a-z]+: |== )" "$out/bench.txt"
[ $rc -eq 0 ] || tail -15 "$out/bench.err"
exit $rc
