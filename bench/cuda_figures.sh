#!/usr/bin/env bash
# Issue #37's A/B in one call, on a GPU machine without network: install the offline bundle
# (`make bundle`), then the trainer step on the seed configuration with the compiled generation
# engine and with the default one (bench_train), each in its own time box.
#
#     bash bench/cuda_figures.sh ARCHIVE OUT [STEPS]    # STEPS: measured steps per engine (default 2)
#
# PYTHON: the Python with PyTorch (default python3), as for install-offline.sh.
#
# The compiled engine runs first (it is what is unknown): inductor with CUDA graphs; if that fails
# (no Triton or C compiler on the machine, say), the `cudagraphs` backend. Then the default engine,
# then 3 plumbing steps of train.py with the compiled engine (their gradient norms must be finite).
# Every stage writes into OUT as it finishes, so a call cut off by its time limit keeps what was
# measured; summary.txt puts the engines side by side (the .err files: torch's recompile and
# CUDA-graph notes). On an H200 the default engine needs ~3 min
# (1 warm-up + 2 steps); the compiled engine's warm-up is its compile.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash bench/cuda_figures.sh ARCHIVE OUT [STEPS]" >&2; exit 2; }
archive=$1 out=$2 steps=${3:-2}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
out=$(realpath "$out")
cd "$repo"
t_start=$SECONDS
log() { echo "[$(date +%T) +$((SECONDS - t_start))s] $*" | tee -a "$out/progress.txt"; }

log "machine"
{ nvidia-smi; nproc; command -v gcc cc; "${PYTHON:-python3}" -c "import sys, torch, transformers, peft
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'transformers', transformers.__version__, 'peft', peft.__version__)
import importlib.util; print('triton', importlib.util.find_spec('triton') is not None)"; } >"$out/machine.txt" 2>&1
tail -3 "$out/machine.txt"

log "install the bundle"
prefix=$(mktemp -d)/ocaml-grpo
bash install-offline.sh "$archive" "$prefix" >"$out/install.txt" 2>&1 || { tail -20 "$out/install.txt"; exit 1; }
py=$prefix/bin/python  # with the bundle's packages and OCAML_TOOLCHAIN_DIR
export HF_HUB_OFFLINE=1

train() {  # $1: engine, $2: time box in seconds, $3: name of the outputs, $4...: more bench_train flags
    local engine=$1 box=$2 name=$3; shift 3
    log "bench_train, engine $engine $*, 1 warm-up + $steps measured steps, at most ${box}s"
    TORCH_LOGS=recompiles,perf_hints timeout "$box" "$py" -m bench.bench_train --engines "$engine" --steps "$steps" \
        --warmup 1 --json "$out/train_$name.json" --out "$(dirname "$prefix")/runs" "$@" \
        >"$out/train_$name.txt" 2>"$out/train_$name.err"
    local rc=$?
    log "bench_train $name: exit $rc"
    grep -E "^(engine|$engine |device|prompts kept|$engine: (step|failed))" "$out/train_$name.txt"
    [ $rc -eq 0 ] || tail -5 "$out/train_$name.err"
    return $rc
}
train compiled 270 compiled
rc=$?  # a compiled engine that failed (not one out of time) gets the backend without Triton
[ $rc -eq 0 ] || [ $rc -eq 124 ] || train compiled 150 compiled_cudagraphs --compile-backend cudagraphs
train default 200 default
# The user's door with the compiled engine: a short plumbing run through train.py, repair turns on.
# Its gradient norms are the check bench_train cannot make (a NaN shows as grad=nan).
log "train.py, plumbing, compiled engine, repair turns"
(cd "$(dirname "$prefix")" && GRPO_PLUMBING=1 GRPO_COMPILED_GENERATION=1 GRPO_REPAIR_TURNS=1 GRPO_MAX_STEPS=3 \
    GRPO_OUTPUT_DIR="$(dirname "$prefix")/plumbing" timeout 90 "$py" "$repo/train.py" >"$out/plumbing_compiled.txt" 2>&1)
log "train.py plumbing: exit $?"
grep -E "^\[Epoch|Error" "$out/plumbing_compiled.txt" | cut -c1-110
"$py" - "$out" <<'PY' | tee "$out/summary.txt"
import json, pathlib, sys
runs = [json.loads(p.read_text())["results"] for p in sorted(pathlib.Path(sys.argv[1]).glob("train_*.json"))]
res = [r[0] for r in runs if r]
base = next((r for r in res if r["engine"] == "default"), None)
gb = lambda v: "-" if v is None else f"{v:.1f}"
for r in res:
    ratio = r["generation_tok_per_s"] / base["generation_tok_per_s"] if base else float("nan")
    print(f"{r['engine']:<9} step {r['step_s']:.2f} s  generation {r['generation_s']:.2f} s  "
          f"{r['generation_tok_per_s']:.0f} tok/s "
          f"({ratio:.2f}x default)  warm-up {r['warmup_step_s']:.1f} s  recompiles {r['recompiles_after_warmup']}  "
          f"graphs {r['graphs_compiled']}  peak {gb(r['peak_alloc_gb'])} GB allocated, {gb(r['peak_used_gb'])} GB used")
PY
log "done"
