"""The plumbing run alone and beside one CPU-bound neighbour, with torch's default threads and with
the project's (GRPO_TORCH_THREADS=auto: half the cores).

    python -m bench.bench_load --json bench/results/load_2core.json            # 10-step plumbing runs
    python -m bench.bench_load --steps 20 --threads 2,1                         # the README's whole plumbing run

The neighbour is fixed and synthetic: `python -c 'while True: pass'`, one core busy at the same
priority, started before the run and stopped after it. Each row is `GRPO_PLUMBING=1 python
train.py` in a fresh process and folder (the audit's cache warm), timed from start to exit; the
load average before each run is recorded beside it, since a figure means little without it.
Goal (issue #48): beside one neighbour, at most 3x the quiet time on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEIGHBOUR = [sys.executable, "-c", "while True: pass"]


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(threads: str, steps: int, timeout: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "LORA_", "REWARD_")) and k != "OMP_NUM_THREADS"}
        env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", GRPO_PLUMBING="1", GRPO_MAX_STEPS=str(steps),
                   GRPO_OUTPUT_DIR=str(Path(tmp) / "run"), GRPO_TORCH_THREADS=threads)
        before = load()
        t0 = time.time()
        res = subprocess.run([sys.executable, str(ROOT / "train.py")], cwd=tmp, env=env, capture_output=True, text=True,
                             timeout=timeout)
        wall = time.time() - t0
    if res.returncode:
        raise SystemExit(f"train.py failed (exit {res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    done = re.search(r"^done in (\d+)s", res.stdout, re.M)
    return {"wall_s": round(wall, 1), "training_s": int(done.group(1)) if done else None, "load_before": before}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", default=f"auto,{os.cpu_count()}",
                    help="GRPO_TORCH_THREADS values to compare (default: torch's own, a thread per core, and auto)")
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    run("auto", 2, args.timeout)  # warms the audit's cache and builds the plumbing model, untimed
    rows = []
    for threads in args.threads.split(","):
        quiet = run(threads, args.steps, args.timeout)
        print(f"GRPO_TORCH_THREADS={threads:5s} quiet {quiet['wall_s']:6.1f} s (load {quiet['load_before']})", flush=True)
        neighbour = subprocess.Popen(NEIGHBOUR)
        try:
            time.sleep(2)
            busy = run(threads, args.steps, args.timeout)
        finally:
            neighbour.kill()
            neighbour.wait()
        row = {"threads": threads, "quiet": quiet, "beside_one_neighbour": busy,
               "slowdown": round(busy["wall_s"] / quiet["wall_s"], 2)}
        rows.append(row)
        print(f"GRPO_TORCH_THREADS={threads:5s} quiet {quiet['wall_s']:6.1f} s (load {quiet['load_before']})  "
              f"beside one neighbour {busy['wall_s']:6.1f} s (load {busy['load_before']})  x{row['slowdown']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
                                               "steps": args.steps, "neighbour": "python -c 'while True: pass'",
                                               "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
