"""Sampling a model and scoring its completions the way training does: pass@k, rates, the
per-difficulty table. evaluate.py (the command), its probe and the learning demo share it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from ocaml_grpo.models.loading import load_model, load_tokenizer
from ocaml_grpo.models.named import gguf_source, resolve_model
from ocaml_grpo.problems import Problem
from ocaml_grpo.prompting import END_MARKER
from ocaml_grpo.training.llamacpp import LlamaEngine, Sampling, context_tokens, saved_lora
from ocaml_grpo.training.run_dir import write_whole

CAPABILITY_THRESHOLD = 0.20  # the original training analysis: under 20% solved -> the base model is not ready for GRPO
# Share of completions with each Breakdown flag set, and what the flag means.
RATES = {
    "has_end_marker": "the END marker on its own line after the last code block",
    "compiled": "the solution alone compiles (0 type and 0 syntax errors)",
    "tests_compiled": "the solution and the tests build one program",
    "solved": "every test passed",
    "constant": "one value back for different arguments, and a test failed (an example's output returned whatever the call)",
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
                progress: bool = True, on_batch=None, stop_at_end: bool = False,
                partial: Path | None = None) -> tuple[list[list[str]], list[list[int]]]:
    """`samples` completions per prompt (top_k=0 samples as TRL's GRPO does, repetition penalty
    off; None keeps the model's generation config). `on_batch(start, texts, lens)` sees each batch as it is done.
    stop_at_end: each answer ends at the END marker, as training's do (GRPO_STOP_AT_END).
    partial: a file that holds the batches done so far and the sampler's state after them, so a
    killed run, started again with the same arguments, goes on where it stopped and samples exactly
    what one uninterrupted run would have."""
    import torch

    torch.manual_seed(seed)
    done = _read_partial(partial, prompts, samples, max_new_tokens, temperature, batch_size, seed)
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
    outs: list[list[str]] = done["outs"] if done else []
    lens: list[list[int]] = done["lens"] if done else []
    if done:
        torch.set_rng_state(torch.tensor(done["rng"], dtype=torch.uint8))
        if progress:
            print(f"resumed after {len(outs)}/{len(texts)} problems ({partial})", flush=True)
    do_sample = temperature > 0
    for start in range(len(outs), len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False).to(model.device)
        with torch.no_grad():
            gen = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                 temperature=temperature if do_sample else None, top_p=1.0 if do_sample else None,
                                 # TRL also sets repetition_penalty 1 (Qwen2.5's generation config has 1.05)
                                 **({"top_k": top_k, "repetition_penalty": 1.0} if do_sample and top_k is not None else {}),
                                 **({"stop_strings": [END_MARKER], "tokenizer": tokenizer} if stop_at_end else {}),
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
        if partial is not None and start + batch_size < len(texts):
            _write_partial(partial, prompts, samples, max_new_tokens, temperature, batch_size, seed, outs, lens,
                           torch.get_rng_state().tolist())
    if partial is not None:
        partial.unlink(missing_ok=True)
    return outs, lens


def _partial_key(prompts, samples, max_new_tokens, temperature, batch_size, seed) -> str:
    return hashlib.sha256(json.dumps([prompts, samples, max_new_tokens, temperature, batch_size, seed]).encode()).hexdigest()


def _read_partial(partial: Path | None, *args) -> dict | None:
    """The batches a killed generate_hf left in `partial`, if it sampled the same thing."""
    if partial is None or not partial.is_file():
        return None
    try:
        done = json.loads(partial.read_text())
    except ValueError:
        return None  # cut off mid-write by the kill: start over
    return done if done.get("key") == _partial_key(*args) else None


def _write_partial(partial: Path, prompts, samples, max_new_tokens, temperature, batch_size, seed, outs, lens, rng) -> None:
    write_whole(partial, json.dumps({"key": _partial_key(prompts, samples, max_new_tokens, temperature, batch_size, seed),
                                     "outs": outs, "lens": lens, "rng": rng}))


def generate_vllm(model_id: str, adapter: str | None, prompts: list[list[dict]], samples: int, max_new_tokens: int,
                  temperature: float, seed: int, stop_at_end: bool = False) -> tuple[list[list[str]], list[list[int]]]:
    try:
        from vllm import LLM, SamplingParams
    except ImportError:
        sys.exit("--vllm was asked for but vLLM is not installed (pip install -r requirements-vllm.txt on a CUDA machine), "
                 "or drop --vllm to use transformers' generate")
    llm = LLM(model=model_id, enable_lora=bool(adapter), seed=seed)
    params = SamplingParams(n=samples, temperature=temperature, max_tokens=max_new_tokens, seed=seed,
                            **({"stop": [END_MARKER], "include_stop_str_in_output": True} if stop_at_end else {}))
    lora = None
    if adapter:
        from vllm.lora.request import LoRARequest
        lora = LoRARequest("adapter", 1, adapter)
    results = llm.chat(prompts, params, lora_request=lora)
    return ([[o.text for o in r.outputs] for r in results], [[len(o.token_ids) for o in r.outputs] for r in results])


def generate_llamacpp(model_name: str, adapter: str | None, prompts: list[list[dict]], samples: int,
                      max_new_tokens: int, temperature: float, batch_size: int, seed: int, cache: Path,
                      stop_at_end: bool = False, progress: bool = True,
                      on_batch=None, partial: Path | None = None) -> tuple[list[list[str]], list[list[int]]]:
    """generate_hf's completions from the model's GGUF file through llama.cpp (training/llamacpp.py),
    with `adapter` set on it: `batch_size` problems' samples decode together, each prompt read once.
    Temperature 0: greedy. `model_name`: a named model or a .gguf file (models/named.gguf_source).
    `on_batch(start, texts, lens)` sees each batch as it is done. partial: as generate_hf's; each
    batch is seeded by its place (`seed + start`), so a resumed run samples what one run would."""
    key = ([model_name, adapter, prompts], samples, max_new_tokens, temperature, batch_size, seed)
    done = _read_partial(partial, *key)
    gguf = gguf_source(model_name, cache)
    tokenizer = load_tokenizer(adapter if adapter and (Path(adapter) / "tokenizer_config.json").exists()
                               else resolve_model(model_name, cache))
    ids = [list(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
           for m in prompts]
    sequences = min(batch_size, len(ids)) * samples
    engine = LlamaEngine(gguf, threads=len(os.sched_getaffinity(0)), sequences=sequences,
                         context=context_tokens(min(batch_size, len(ids)), sequences, max(map(len, ids)), max_new_tokens))
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    outs: list[list[str]] = done["outs"] if done else []
    lens: list[list[int]] = done["lens"] if done else []
    if done and progress:
        print(f"resumed after {len(outs)}/{len(ids)} problems ({partial})", flush=True)
    try:
        if adapter:
            shape = engine.shape
            engine.set_lora(*saved_lora(adapter, shape["arch"], shape["n_head"], shape["n_head_kv"]))
        for start in range(len(outs), len(ids), batch_size):
            batch = [p for p in ids[start:start + batch_size] for _ in range(samples)]
            answers = engine.generate(batch, max_new_tokens, Sampling(temperature), decode=decode,
                                      stop=END_MARKER if stop_at_end else None, seed=seed + start,
                                      stop_ids={tokenizer.eos_token_id, tokenizer.pad_token_id})
            for i in range(0, len(batch), samples):
                group = answers.ids[i:i + samples]
                outs.append([decode(g) for g in group])
                lens.append([len(g) - (g[-1] in (tokenizer.eos_token_id, tokenizer.pad_token_id)) for g in group])
            if progress:
                print(f"generated {min(start + batch_size, len(ids))}/{len(ids)} problems", flush=True)
            if on_batch is not None:
                on_batch(start, outs[start:], lens[start:])
            if partial is not None and start + batch_size < len(ids):
                _write_partial(partial, *key, outs, lens, None)
    finally:
        engine.close()
    if partial is not None:
        partial.unlink(missing_ok=True)
    return outs, lens


def grade_completions(chosen: list[Problem], texts: list[list[str]], lens: list[list[int]], k: int,
                      max_new_tokens: int, scorer, min_lines: int) -> tuple[dict, list[dict]]:
    """Grade every completion with `scorer` (scoring.RewardScorer) and
    aggregate: pass@1, pass@k, rates, per-difficulty table, verdict. `texts[i]` holds the
    completions of `chosen[i]`, all lists the same length (the samples)."""
    samples = len(texts[0])
    flat = [(p, t, n) for p, ts, ns in zip(chosen, texts, lens) for t, n in zip(ts, ns)]
    graded = scorer.score_batch([f[0] for f in flat], [f[1] for f in flat], [f[2] for f in flat], max_new_tokens)

    def train_reward(b) -> float:  # the training reward, line gate included
        return 0.0 if b.code_lines < max(1, min_lines) else b.reward

    rows = [{"problem_id": p.id, "completion": text, "completion_tokens": ntok, "max_completion_tokens": max_new_tokens,
             "solved": b.solved, "graded_reward": b.reward, "train_reward": train_reward(b),
             **{key: v for key, v in asdict(b).items() if key not in ("problem_id", "reward")}}
            for (p, text, ntok), b in zip(flat, graded)]
    per_problem: dict[str, list] = defaultdict(list)
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
