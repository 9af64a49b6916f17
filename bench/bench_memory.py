"""The memory estimate (ocaml_grpo/commands/memory.py) against the peak a real run reaches.

    python -m bench.bench_memory --json bench/results/memory_cpu.json                 # tiny + SmolLM2-135M shape
    python -m bench.bench_memory --models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct   # named models, when installed
    python -m bench.bench_memory --models smollm2-shape-large        # two larger runs (~9 GB): on a machine with room

Each row is one `python train.py` run of one optimizer step (GRPO_PLUMBING=1: bundled problems,
offline; AUDIT_DATASET=0), in a fresh process: the estimate is the one train.py prints before the
model loads, the peak is the process's maximum resident set (os.wait4's ru_maxrss: the libraries,
the model, generation and the training pass; the grader's processes are counted apart). Goal:
the estimate within 25% of the peak, never under it by more than 10%.

The estimate sizes the worst step: every prompt as long as the longest, every answer to the limit.
So each run trains on the bundled set's GRPO_BATCH_SIZE longest prompts (in the model's own
tokenizer, with the row's worked examples): its one step draws exactly those. Each row records the
longest prompt and answer the step had (`step_prompt_tokens`, `step_completion_tokens`, from the
run's completions log); a pretrained model may stop before the limit.

Models: `tiny` (the plumbing model); `smollm2-shape` (SmolLM2-135M-Instruct's config, random
weights, the plumbing tokenizer: no download, and random weights write every answer to the
completion limit, the case the estimate sizes for); a named model (ocaml_grpo/
models/named.py) when its package is installed, else the row is skipped with a note; or a local
model folder (its rows: the named models'). The H200
figures on record (bench/BENCHMARKS.md, "Generation on a GPU") are compared with the estimate for
their configuration, printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.commands import memory
from ocaml_grpo.models.named import NAMED, named_model_error
from ocaml_grpo.models.tiny import ensure_shaped_model

ROOT = Path(__file__).resolve().parents[1]
# (label, settings) per model: small enough to leave this 24 GB machine room for its other jobs.
RUNS = {
    "tiny": [("2x4, 64-token answers", {}),
             ("4x8, 256-token answers", {"GRPO_BATCH_SIZE": "4", "GRPO_NUM_GENERATIONS": "8", "GRPO_MAX_COMPLETION": "256"})],
    "smollm2-shape": [("1x2, no examples, 32", {"GRPO_BATCH_SIZE": "1", "GRPO_NUM_GENERATIONS": "2",
                                                "GRPO_PROMPT_EXAMPLES": "0", "GRPO_MAX_COMPLETION": "32"}),
                      ("1x2, 1 example, 64", {"GRPO_BATCH_SIZE": "1", "GRPO_NUM_GENERATIONS": "2",
                                              "GRPO_PROMPT_EXAMPLES": "1", "GRPO_MAX_COMPLETION": "64"})],
    # larger runs, measured when the machine has ~10 GB to spare: --models smollm2-shape-large
    "smollm2-shape-large": [("1x4, no examples, 64", {"GRPO_BATCH_SIZE": "1", "GRPO_NUM_GENERATIONS": "4",
                                                      "GRPO_PROMPT_EXAMPLES": "0", "GRPO_MAX_COMPLETION": "64"}),
                            ("1x2, 3 examples, 32", {"GRPO_BATCH_SIZE": "1", "GRPO_NUM_GENERATIONS": "2",
                                                     "GRPO_MAX_COMPLETION": "32"})],
}
NAMED_RUNS = [("1x2, no examples, 32", {"GRPO_BATCH_SIZE": "1", "GRPO_NUM_GENERATIONS": "2",
                                        "GRPO_PROMPT_EXAMPLES": "0", "GRPO_MAX_COMPLETION": "32"}),
              ("1x2, 3 examples, 32", {"GRPO_BATCH_SIZE": "1", "GRPO_NUM_GENERATIONS": "2", "GRPO_MAX_COMPLETION": "32"})]
# The README's SmolLM2 command (2 prompts x 2 answers of 64 tokens, no worked examples), beside the named runs.
RUNS["smollm2-135m-instruct"] = NAMED_RUNS + [("2x2, no examples, 64 (the README's)", {
    "GRPO_BATCH_SIZE": "2", "GRPO_NUM_GENERATIONS": "2", "GRPO_PROMPT_EXAMPLES": "0", "GRPO_MAX_COMPLETION": "64"})]
# The H200 run on record: Qwen2.5-Coder-1.5B's shape, bf16, 4 prompts x 6 completions, prompts cut to
# 704 tokens, 512-token completions, LoRA r=32 on the 7 projections, gradient checkpointing.
H200 = dict(shape=memory.ModelShape(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128,
                                    vocab=151936, tied=True, source="Qwen2.5-Coder-1.5B config"),
            run=memory.RunShape(sequences=24, grad_accum=1, prompt_tokens=704, completion_tokens=512, lora_r=32,
                                lora_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                on_gpu=True, checkpointing=True),
            allocated_gb=12.1, device_gb=14.1)
ESTIMATE_RE = re.compile(r"^memory: the run's peak is estimated at ([\d.]+) GB \((.*) GB\)", re.M)


def model_id(name: str) -> str | None:
    """What BASE_MODEL_ID gets for `name`; None (with a note printed) when it is not available here."""
    if name == "tiny":
        return ""  # GRPO_PLUMBING's own
    if name.startswith("smollm2-shape"):
        return str(ensure_shaped_model("smollm2-shape", cache_dir(os.environ)))
    if Path(name).is_dir():
        return name  # a local model folder
    if name not in NAMED:
        print(f"skipped {name}: not a named model in this checkout (ocaml_grpo/models/named.py)")
        return None
    if err := named_model_error("--model", name):
        print(f"skipped {name}: {err}")
        return None
    return name


def longest_prompts(model: str, settings: dict, out: Path) -> dict[str, int]:
    """Write the bundled problems with the GRPO_BATCH_SIZE longest prompts (as train.py counts them)
    to `out`; their ids and token counts."""
    from ocaml_grpo.config import PLUMBING_DEFAULTS
    from ocaml_grpo.models.loading import load_tokenizer
    from ocaml_grpo.models.named import resolve_model
    from ocaml_grpo.models.tiny import ensure_plumbing_model, plumbing_model_dir
    from ocaml_grpo.problems import BUNDLED, read_rows
    from ocaml_grpo.prompting import ALL, prompt_token_count
    folder = resolve_model(model, cache_dir(os.environ)) if model else ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ)))
    tokenizer = load_tokenizer(folder)
    examples = int(settings.get("GRPO_PROMPT_EXAMPLES", ALL))
    counted = sorted(((prompt_token_count(tokenizer, r["prompt"], examples), r) for r in read_rows(BUNDLED)),
                     key=lambda t: -t[0])
    chosen = counted[:int(settings.get("GRPO_BATCH_SIZE", PLUMBING_DEFAULTS["GRPO_BATCH_SIZE"]))]
    out.write_text("".join(json.dumps(r) + "\n" for _, r in chosen))
    return {r["id"]: n for n, r in chosen}


def measure(model: str, settings: dict, timeout: int, extra_env: dict | None = None) -> dict:
    """One step of train.py on the longest prompts: its printed estimate, its peak resident memory
    and the longest prompt and answer the step had."""
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        prompts = longest_prompts(model, settings, Path(tmp) / "longest.jsonl")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "LORA_", "REWARD_"))}
        env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", GRPO_PLUMBING="1", GRPO_MAX_STEPS="1",
                   GRPO_SAVE_STEPS="1000", GRPO_OUTPUT_DIR=str(Path(tmp) / "run"), AUDIT_DATASET="0",
                   GRPO_MEMORY_CHECK="0", GRPO_TRACK_PROBLEMS="0", TRAINING_DATASET=str(Path(tmp) / "longest.jsonl"),
                   **settings, **(extra_env or {}))
        if model:
            env["BASE_MODEL_ID"] = model
        t0 = time.time()
        log = Path(tmp) / "out.txt"
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, str(ROOT / "train.py")], cwd=tmp, env=env, stdout=f,
                                    stderr=subprocess.STDOUT)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak (ru_maxrss, KiB), not this process's
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out = log.read_text()
        logged = Path(tmp) / "run" / "reward_logs" / "completions.jsonl"
        answers = [json.loads(line) for line in logged.read_text().splitlines()] if logged.exists() else []
    peak_kb = usage.ru_maxrss
    m = ESTIMATE_RE.search(out)
    if proc.returncode or m is None:
        raise SystemExit(f"train.py failed (exit {proc.returncode}):\n{out[-3000:]}")
    estimate, peak = float(m.group(1)), peak_kb * 1024 / memory.GB
    prompt = re.search(r"the longest prompt (\d+) tokens", out)
    return {"estimate_gb": estimate, "parts": m.group(2), "peak_gb": round(peak, 2),
            "error": round(estimate / peak - 1, 3), "seconds": round(time.time() - t0, 1),
            "prompt_tokens": int(prompt.group(1)) if prompt else None,
            "step_prompt_tokens": max((prompts.get(a["problem_id"], 0) for a in answers), default=None),
            "step_completion_tokens": max((int(a["completion_tokens"] or 0) for a in answers), default=None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-shape,smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each row (the CPU peak varies from one run to the next)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable every run gets (e.g. an allocator setting); repeatable")
    args = ap.parse_args(argv)
    extra_env = {}
    for pair in args.env:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            ap.error(f"--env {pair}: expected NAME=VALUE")
        extra_env[name] = value
    rows = []
    for name in args.models.split(","):
        mid = model_id(name)
        if mid is None:
            rows.append({"model": name, "skipped": True})
            continue
        for label, settings in [run for run in RUNS.get(name, NAMED_RUNS) for _ in range(args.repeat)]:
            r = {"model": name, "run": label, **measure(mid, settings, args.timeout, extra_env)}
            rows.append(r)
            print(f"{name:30s} {label:26s} estimate {r['estimate_gb']:6.2f} GB  peak {r['peak_gb']:6.2f} GB  "
                  f"(step: prompt {r['step_prompt_tokens']}, answer {r['step_completion_tokens']} tokens)  "
                  f"{r['error']:+.0%}  ({r['parts']})  {r['seconds']:.0f} s", flush=True)
    est = memory.estimate(H200["shape"], H200["run"])
    runtime = est.parts["runtime"]
    h200 = {"model": "qwen1.5b-shape on the H200 (on record)", "estimate_gb": round(est.total / memory.GB, 2),
            "estimate_allocated_gb": round((est.total - runtime) / memory.GB, 2), "allocated_gb": H200["allocated_gb"],
            "device_gb": H200["device_gb"], "error_allocated": round((est.total - runtime) / memory.GB / H200["allocated_gb"] - 1, 3),
            "error_device": round(est.total / memory.GB / H200["device_gb"] - 1, 3), "parts": est.describe()}
    rows.append(h200)
    print(f"H200 on record: estimate {h200['estimate_allocated_gb']:.2f} GB allocated ({h200['error_allocated']:+.0%} of "
          f"{H200['allocated_gb']}), {h200['estimate_gb']:.2f} GB on the device ({h200['error_device']:+.0%} of {H200['device_gb']})")
    measured = [r for r in rows if "error" in r]
    worst = [r["error"] for r in measured] + [h200["error_allocated"], h200["error_device"]]
    ok = all(-0.10 <= e <= 0.25 for e in worst)
    print(f"goal (within 25%, never under by more than 10%): {'met' if ok else 'NOT met'}; errors "
          + " ".join(f"{e:+.0%}" for e in worst))
    if args.json:
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
                                               "load": load, "env": args.env, "repeat": args.repeat, "rows": rows,
                                               "goal_met": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
