"""Evaluate a model (optionally with a LoRA adapter) on OCaml problems with the training prompt
and the training grader: whether a base model solves enough problems for GRPO to learn from, and
a before/after check.

    python evaluate.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --n 10 --k 1
    python evaluate.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --adapter grpo_runs/final_adapter --n 50 --k 4
    python evaluate.py --model demo --dataset ../shared/benchmarks/multipl_e_ml.jsonl --n 20   # offline
    python evaluate.py --model PATH --vllm       # generate with vLLM when it is installed
    python evaluate.py --probe stats.jsonl       # per-problem statistics for GRPO_PROBLEM_STATS (--probe --help)

Writes OUT/report.json, OUT/report.md and OUT/completions.jsonl (default OUT: eval_runs/<time>,
created only once the completions are graded). Each completion carries two rewards:
  graded_reward  the reward with the minimum-lines gate off: what pass@k and "solved" judge
  train_reward   the reward training would give it, MIN_NON_EMPTY_LINES gate included (a correct
                 answer shorter than the gate scores 0 here); mean_reward averages this one
pass@k uses the unbiased estimator 1 - C(n-c, k) / C(n, k) over the n = --samples (default k)
completions per problem. "Solved" means every test of the problem passed.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path

from ocaml_grpo import probe
from ocaml_grpo.demo_model import ensure_demo_model
from ocaml_grpo.models import go_offline_unless_needed, load_model, load_tokenizer, model_error
from ocaml_grpo.problems import DatasetError, Problem, load_problems
from ocaml_grpo.prompting import chat_messages
from rewards import Breakdown, RewardConfig, RewardScorer

atexit.register(gc.freeze)  # skips ~1.7 s of collecting torch's and transformers' objects at exit (see train.py)

CAPABILITY_THRESHOLD = 0.20  # the original training analysis: under 20% solved -> the base model is not ready for GRPO
# Share of completions with each Breakdown flag set, and what the flag means.
RATES = {
    "has_end_marker": "the END marker is in the completion",
    "compiled": "the solution alone compiles (0 type and 0 syntax errors)",
    "tests_compiled": "the solution and the tests build one program",
    "solved": "every test passed",
}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c are correct (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"k={k} > n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def verdict(pass1: float) -> str:
    if pass1 < CAPABILITY_THRESHOLD:
        return (f"pass@1 {pass1:.0%} < {CAPABILITY_THRESHOLD:.0%}: GRPO will see mostly all-zero groups. Consider a "
                "stronger base model (e.g. Qwen/Qwen2.5-Coder-7B-Instruct), an easier subset of problems, or more "
                "few-shot examples in the prompt (prompting.py); REWARD_CURRICULUM=1 helps the early phase.")
    return f"pass@1 {pass1:.0%} >= {CAPABILITY_THRESHOLD:.0%}: the model solves enough problems for GRPO to learn from."


def generate_hf(model_id: str, adapter: str | None, prompts: list[list[dict]], samples: int, max_new_tokens: int,
                temperature: float, batch_size: int, seed: int, top_k: int | None = None,
                progress: bool = True, on_batch=None) -> tuple[list[list[str]], list[list[int]]]:
    """`samples` completions per prompt (top_k=0 samples as TRL's GRPO does, repetition penalty
    off; None keeps the model's generation config). `on_batch(start, texts, lens)` sees each batch as it is done."""
    import torch

    torch.manual_seed(seed)
    on_gpu = torch.cuda.is_available()
    # decoder-only: pad on the left so generation continues the prompt
    tokenizer = load_tokenizer(adapter if adapter and (Path(adapter) / "tokenizer_config.json").exists() else model_id,
                               padding_side="left")
    model = load_model(model_id)
    if adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, adapter)
    model.to("cuda" if on_gpu else "cpu").eval()
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in prompts]
    outs: list[list[str]] = []
    lens: list[list[int]] = []
    do_sample = temperature > 0
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False).to(model.device)
        with torch.no_grad():
            gen = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                 temperature=temperature if do_sample else None, top_p=1.0 if do_sample else None,
                                 # TRL also sets repetition_penalty 1 (Qwen2.5's generation config has 1.05)
                                 **({"top_k": top_k, "repetition_penalty": 1.0} if do_sample and top_k is not None else {}),
                                 num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id)
        new = gen[:, batch["input_ids"].shape[1]:]
        for i in range(0, new.shape[0], samples):
            group = new[i:i + samples]
            outs.append([tokenizer.decode(g, skip_special_tokens=True) for g in group])
            lens.append([int((g != tokenizer.pad_token_id).sum()) for g in group])
        if progress:
            print(f"generated {min(start + batch_size, len(texts))}/{len(texts)} problems", flush=True)
        if on_batch is not None:
            on_batch(start, outs[start:], lens[start:])
    return outs, lens


def generate_vllm(model_id: str, adapter: str | None, prompts: list[list[dict]], samples: int, max_new_tokens: int,
                  temperature: float, seed: int) -> tuple[list[list[str]], list[list[int]]]:
    try:
        from vllm import LLM, SamplingParams
    except ImportError:
        sys.exit("--vllm was asked for but vLLM is not installed (pip install vllm on a CUDA machine), "
                 "or drop --vllm to use transformers' generate")
    llm = LLM(model=model_id, enable_lora=bool(adapter), seed=seed)
    params = SamplingParams(n=samples, temperature=temperature, max_tokens=max_new_tokens, seed=seed)
    lora = None
    if adapter:
        from vllm.lora.request import LoRARequest
        lora = LoRARequest("adapter", 1, adapter)
    results = llm.chat(prompts, params, lora_request=lora)
    return ([[o.text for o in r.outputs] for r in results], [[len(o.token_ids) for o in r.outputs] for r in results])


def grade_completions(chosen: list[Problem], texts: list[list[str]], lens: list[list[int]], k: int,
                      max_new_tokens: int, scorer: RewardScorer, min_lines: int) -> tuple[dict, list[dict]]:
    """Grade every completion and aggregate: pass@1, pass@k, rates, per-difficulty table, verdict.
    `texts[i]` holds the completions of `chosen[i]`, all lists the same length (the samples)."""
    samples = len(texts[0])
    flat = [(p, t, n) for p, ts, ns in zip(chosen, texts, lens) for t, n in zip(ts, ns)]
    graded = scorer.score_batch([f[0] for f in flat], [f[1] for f in flat], [f[2] for f in flat], max_new_tokens)

    def train_reward(b: Breakdown) -> float:  # the training reward, line gate included
        return 0.0 if b.code_lines < min_lines else b.reward

    rows = [{"problem_id": p.id, "completion": text, "completion_tokens": ntok, "max_completion_tokens": max_new_tokens,
             "solved": b.solved, "graded_reward": b.reward, "train_reward": train_reward(b),
             **{key: v for key, v in asdict(b).items() if key not in ("problem_id", "reward")}}
            for (p, text, ntok), b in zip(flat, graded)]
    per_problem: dict[str, list[Breakdown]] = defaultdict(list)
    for (p, _, _), b in zip(flat, graded):
        per_problem[p.id].append(b)

    def mean_pass(ids, kk):
        return sum(pass_at_k(samples, sum(b.solved for b in per_problem[i]), kk) for i in ids) / len(ids)

    n = len(graded)
    # Each rate is named after the Breakdown field it counts (RATES says what that means).
    rates = {name: sum(bool(getattr(b, name)) for b in graded) / n for name in RATES}
    by_diff: dict[str, list[str]] = defaultdict(list)
    for p in chosen:
        by_diff[p.difficulty or "unknown"].append(p.id)
    per_difficulty = {d: {"n_problems": len(ids), "pass@1": mean_pass(ids, 1),
                          "mean_reward": sum(train_reward(b) for i in ids for b in per_problem[i]) / (len(ids) * samples)}
                      for d, ids in sorted(by_diff.items())}
    ids = [p.id for p in chosen]
    pass1 = mean_pass(ids, 1)
    core = {"pass@1": pass1, "pass@k": mean_pass(ids, k), "mean_reward": sum(map(train_reward, graded)) / n,
            "rates": rates, "per_difficulty": per_difficulty, "verdict": verdict(pass1)}
    return core, rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--probe" or a.startswith("--probe=") for a in argv):  # the probe for selection: ocaml_grpo/probe.py
        return probe.main(argv, generate_hf, generate_vllm, lambda cfg: RewardScorer(RewardConfig.from_settings(cfg)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="hub id or local dir; `demo` = the tiny offline demo model")
    ap.add_argument("--adapter", default=None, help="a LoRA adapter dir (e.g. grpo_runs/final_adapter)")
    ap.add_argument("--dataset", default="bundled", help="bundled, a local .jsonl/.json/.csv/.parquet, or a hub id")
    ap.add_argument("--n", type=int, default=10, help="problems sampled (reproducibly, by --seed)")
    ap.add_argument("--k", type=int, default=1, help="the k of pass@k")
    ap.add_argument("--samples", type=int, default=0, help="completions per problem (default k; >= k)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=None, help="default 0 (greedy) for one sample, else 0.8")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8, help="problems per generate() call")
    ap.add_argument("--vllm", action="store_true", help="generate with vLLM (must be installed)")
    ap.add_argument("--out", default=None, help="report directory (default eval_runs/<time>)")
    args = ap.parse_args(argv)
    samples = args.samples or args.k
    errors = [m for bad, m in [(args.n < 1, "--n must be >= 1"), (args.k < 1, "--k must be >= 1"),
                               (samples < args.k, f"--samples {samples} must be >= --k {args.k}"),
                               (args.max_new_tokens < 1, "--max-new-tokens must be >= 1")] if bad]
    if errors:
        ap.error("; ".join(errors))
    temperature = args.temperature if args.temperature is not None else (0.0 if samples == 1 else 0.8)
    if samples > 1 and temperature == 0:
        ap.error("several samples per problem need --temperature > 0")

    # Data and grader first: a bad path or a missing toolchain costs seconds, not a model load.
    if note := go_offline_unless_needed([] if args.model == "demo" else [args.model], args.dataset, os.environ):
        print(note)  # before the libraries are imported: they read HF_HUB_OFFLINE once
    try:
        problems = load_problems(args.dataset)
    except DatasetError as e:
        print(f"dataset error: {e}", file=sys.stderr)
        return 2
    if args.model != "demo" and (error := model_error("--model", args.model, os.environ)):
        print(f"error: {error}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    chosen: list[Problem] = rng.sample(problems, min(args.n, len(problems)))
    env_cfg = RewardConfig.from_env()
    # Grade every completion (no line gate) so pass@k is about correctness; the training reward,
    # gate included, is reported as mean_reward.
    scorer = RewardScorer(replace(env_cfg, min_lines=0))
    model_id = args.model
    if model_id == "demo":
        model_id = str(ensure_demo_model())
    out = Path(args.out or f"eval_runs/{time.strftime('%Y%m%d-%H%M%S')}")  # created once there is a report

    prompts = [chat_messages(p.prompt) for p in chosen]
    t0 = time.time()
    if args.vllm:
        texts, lens = generate_vllm(model_id, args.adapter, prompts, samples, args.max_new_tokens, temperature, args.seed)
    else:
        texts, lens = generate_hf(model_id, args.adapter, prompts, samples, args.max_new_tokens, temperature,
                                  args.batch_size, args.seed)
    t_gen = time.time() - t0
    try:
        core, rows = grade_completions(chosen, texts, lens, args.k, args.max_new_tokens, scorer, env_cfg.min_lines)
    finally:
        scorer.close()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "completions.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    report = {"model": args.model, "adapter": args.adapter, "dataset": args.dataset, "n_problems": len(chosen),
              "k": args.k, "samples_per_problem": samples, "temperature": temperature, "seed": args.seed, **core,
              "generation_seconds": round(t_gen, 1), "problem_ids": [p.id for p in chosen]}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    print(render_markdown(report))
    print(f"report: {out / 'report.md'}")
    return 0


def render_markdown(r: dict) -> str:
    title = f"# Evaluation: {r['model']}" + (f" + adapter {r['adapter']}" if r["adapter"] else "")
    lines = [title, "",
             f"Dataset `{r['dataset']}`, {r['n_problems']} problems (seed {r['seed']}), "
             f"{r['samples_per_problem']} sample(s) each at temperature {r['temperature']}.", "",
             "| metric | value |", "|---|---:|",
             f"| pass@1 | {r['pass@1']:.1%} |"] + ([f"| pass@{r['k']} | {r['pass@k']:.1%} |"] if r["k"] > 1 else []) + [
             f"| mean training reward | {r['mean_reward']:.3f} |"]
    lines += [f"| `{name}` rate: {RATES[name]} | {v:.1%} |" for name, v in r["rates"].items()]
    lines += ["", "| difficulty | problems | pass@1 | mean reward |", "|---|---:|---:|---:|"]
    lines += [f"| {d} | {v['n_problems']} | {v['pass@1']:.1%} | {v['mean_reward']:.3f} |"
              for d, v in r["per_difficulty"].items()]
    lines += ["", f"**Verdict:** {r['verdict']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
