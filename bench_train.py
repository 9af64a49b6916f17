"""Trainer speed per GRPO step, side by side for each generation engine.

    python bench_train.py                                  # CUDA: seed config, Qwen2.5-1.5B-shaped model
    python bench_train.py --engines default,paged,vllm --steps 3 --warmup 1
    python bench_train.py --tiny                           # the tiny demo model (what CI runs, on CPU)

On CUDA the model has Qwen2.5-Coder-1.5B's shape (28 layers, hidden 1536, vocab 151936) with
random weights in bf16 and LoRA r=32, the seed's config: 4 prompts x 6 generations, prompts
<= 704 tokens, completions of 512 tokens (random weights never stop early). Engines: `default`
(TRL's transformers generate), `paged` (transformers continuous batching), `vllm` (colocated,
when installed). Per step, after warm-up: total time, generation time and tokens/s, reward
scoring time and its share, the rest (log-probs, loss, backward, optimizer), peak GPU memory.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

os.environ.setdefault("MIN_NON_EMPTY_LINES", "0")

import torch  # noqa: E402

from demo_model import DEMO_MODEL_DIR, ensure_demo_model  # noqa: E402
from problems import load_problems  # noqa: E402
from prompting import chat_messages  # noqa: E402
from rewards import RewardScorer, make_syntax_aware_reward  # noqa: E402

QWEN_15B_SHAPE = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                      num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                      tie_word_embeddings=True)


def qwen_shaped_model_dir() -> Path:
    """Random-weight Qwen2.5-1.5B-shaped model with the demo tokenizer (ids it does not know decode to '')."""
    path = DEMO_MODEL_DIR.parent / "bench-qwen2.5-1.5b-shape"
    if not (path / "config.json").exists():
        from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
        tok = AutoTokenizer.from_pretrained(ensure_demo_model())
        cfg = Qwen2Config(**QWEN_15B_SHAPE, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
        tok.save_pretrained(path)
    return path


def run_engine(engine: str, model_dir: Path, a, scorer: RewardScorer, on_gpu: bool) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = load_problems("bundled")
    rows = []
    for p in problems:
        msgs = chat_messages(p.prompt)
        n = len(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
        if n <= a.max_prompt:
            rows.append({"prompt": msgs, **p.to_row()})
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if on_gpu else torch.float32)
    reward_fn = make_syntax_aware_reward(None, a.completion, scorer=scorer)
    reward_times: list[float] = []

    async def syntax_aware_reward(**kw):
        t0 = time.perf_counter()
        out = await reward_fn(**kw)
        reward_times.append(time.perf_counter() - t0)
        return out

    args = GRPOConfig(
        output_dir=str(Path(a.out) / engine), per_device_train_batch_size=a.prompts * a.generations,
        num_generations=a.generations, max_completion_length=a.completion, max_steps=a.warmup + a.steps,
        learning_rate=5e-6, temperature=0.9, beta=0.0, logging_steps=1, save_strategy="no", report_to=[],
        bf16=on_gpu, use_cpu=not on_gpu, gradient_checkpointing=on_gpu, remove_unused_columns=False,
        use_vllm=engine == "vllm", vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
        use_transformers_continuous_batching=engine == "paged", seed=0)
    peft = LoraConfig(r=32, lora_alpha=64, lora_dropout=0.05, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM")
    step_times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, *args, **kw):
            step_times.append(time.perf_counter() - self.t0)

    trainer = GRPOTrainer(model=model, reward_funcs=[syntax_aware_reward], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=peft,
                          callbacks=[StepTimer()])
    gen_times: list[float] = []
    gen_tokens: list[int] = []
    generate = trainer._generate

    def timed_generate(prompts):
        if on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = generate(prompts)
        if on_gpu:
            torch.cuda.synchronize()
        gen_times.append(time.perf_counter() - t0)
        gen_tokens.append(sum(len(c) for c in out[1]))  # out[1]: completion ids per sample
        return out

    trainer._generate = timed_generate
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    w = a.warmup
    steps, gens, toks, rews = step_times[w:], gen_times[w:], gen_tokens[w:], reward_times[w:]
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    step, gen, rew = mean(steps), mean(gens), mean(rews)
    return {"engine": engine, "steps": len(steps), "step_s": step, "generation_s": gen,
            "generation_tok_per_s": sum(toks) / max(1e-9, sum(gens)), "reward_s": rew,
            "reward_share": rew / step if step else 0.0, "train_s": step - gen - rew,
            "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default=None, help="comma list of default,paged,vllm (default: all available)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="the tiny demo model even on CUDA")
    ap.add_argument("--out", default="grpo_runs/bench_train")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    on_gpu = torch.cuda.is_available()
    full = on_gpu and not a.tiny
    a.prompts, a.generations = (4, 6) if full else (2, 2)
    a.completion, a.max_prompt = (512, 704) if full else (32, 4096)
    engines = (a.engines or ("default,paged" + (",vllm" if importlib.util.find_spec("vllm") else ""))).split(",")
    model_dir = qwen_shaped_model_dir() if full else ensure_demo_model()
    device = torch.cuda.get_device_name(0) if on_gpu else f"CPU ({os.cpu_count()} cores), no CUDA device"
    print(f"device: {device}; model: {'Qwen2.5-1.5B-shaped, random, bf16' if full else 'tiny demo model'}; "
          f"{a.prompts} prompts x {a.generations} generations, completion {a.completion} tokens, LoRA r=32; "
          f"{a.warmup} warm-up + {a.steps} measured steps")
    scorer = RewardScorer()
    results = []
    for engine in engines:
        if engine == "vllm" and importlib.util.find_spec("vllm") is None:
            print("vllm: not installed (pip install vllm), skipped")
            continue
        try:
            results.append(run_engine(engine, model_dir, a, scorer, on_gpu))
        except Exception as e:  # an engine that cannot run here is a result, not a crash of the others
            print(f"{engine}: failed: {type(e).__name__}: {str(e)[:300]}")
    scorer.close()
    base = next((r for r in results if r["engine"] == "default"), None)
    print(f"{'engine':<9}{'step s':>8}{'gen s':>8}{'gen tok/s':>11}{'vs default':>11}{'reward s':>10}"
          f"{'reward %':>10}{'train s':>9}{'peak GB':>9}")
    for r in results:
        ratio = r["generation_tok_per_s"] / base["generation_tok_per_s"] if base else float("nan")
        peak = f"{r['peak_gpu_gb']:.1f}" if r["peak_gpu_gb"] is not None else "-"
        print(f"{r['engine']:<9}{r['step_s']:>8.2f}{r['generation_s']:>8.2f}{r['generation_tok_per_s']:>11.1f}"
              f"{ratio:>10.2f}x{r['reward_s']:>10.3f}{100 * r['reward_share']:>9.1f}%{r['train_s']:>9.2f}{peak:>9}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device, "results": results}, indent=2))


if __name__ == "__main__":
    main()
