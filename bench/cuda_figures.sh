#!/usr/bin/env bash
# Issue #30's CUDA figures in one call, on a GPU machine without network: install the offline
# bundle (`make bundle`), then the trainer step on the seed configuration (bench_train, default
# engine), the grader's throughput on the machine's cores (bench_rewards), and the paged engine.
#
#     bash bench/cuda_figures.sh ARCHIVE OUT [STEPS]    # STEPS: measured steps per engine (default 2)
#
# PYTHON: the Python with PyTorch (default python3), as for install-offline.sh.
#
# Every stage writes into OUT as it finishes (bench_train: each engine's JSON and table row as
# soon as it is measured), so a call cut off by its time limit keeps what was measured. On the
# seed configuration a step takes ~50 s (default) to ~85 s (paged) on an H100, the warm-up more:
# the whole script needs ~8-9 minutes with STEPS=2. vLLM is not run: its wheel and its own torch
# do not fit a 64 MiB bundle (README, "Offline GPU machines").
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash bench/cuda_figures.sh ARCHIVE OUT [STEPS]" >&2; exit 2; }
archive=$1 out=$2 steps=${3:-2}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
out=$(realpath "$out")
cd "$repo"
log() { echo "[$(date +%T)] $*" | tee -a "$out/progress.txt"; }

log "machine"
{ nvidia-smi; nproc; "${PYTHON:-python3}" -c "import sys, torch, transformers, peft
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'transformers', transformers.__version__, 'peft', peft.__version__)"; } >"$out/machine.txt" 2>&1

log "install the bundle"
prefix=$(mktemp -d)/ocaml-grpo
bash install-offline.sh "$archive" "$prefix" >"$out/install.txt" 2>&1 || { tail -20 "$out/install.txt"; exit 1; }
py=$prefix/bin/python  # with the bundle's packages and OCAML_TOOLCHAIN_DIR
export HF_HUB_OFFLINE=1

train() {  # $1: engine
    log "bench_train, engine $1, 1 warm-up + $steps measured steps"
    "$py" -m bench.bench_train --engines "$1" --steps "$steps" --warmup 1 --json "$out/train_$1.json" --out "$(dirname "$prefix")/runs" \
        >"$out/train_$1.txt" 2>"$out/train_$1.err"
    log "bench_train $1: exit $?"
    grep -E "^(engine|$1 |device|prompts kept|$1: (step|failed))" "$out/train_$1.txt"
}
train default
log "bench_rewards"
"$py" -m bench.bench_rewards >"$out/rewards.txt" 2>&1
log "bench_rewards: exit $?"
grep -E "^(corpus|no-loop|mixed  |GRPO batch)" "$out/rewards.txt"
train paged
log "done"
