"""Trainer speed per GRPO step, side by side for each generation engine.

    python -m bench.bench_train                                   # CUDA: the seed config; CPU: the tiny model
    python -m bench.bench_train --engines default,paged,vllm --steps 3 --warmup 1 --json bench.json
    python -m bench.bench_train --model /models/Qwen2.5-Coder-1.5B-Instruct   # real weights, its own answers graded
    python -m bench.bench_train --model qwen1.5b-shape --prompts 1 --generations 2 --completion 4   # GPU model on CPU

Models: `qwen1.5b-shape` (the CUDA default) has Qwen2.5-Coder-1.5B's shape (28 layers, hidden
1536, vocab 151936) with random weights and the plumbing tokenizer; `tiny` (the CPU default) is the
plumbing model; a path loads a local model. Random-weight models get every prompt cut to the prompt
budget (the plumbing tokenizer is less compact than Qwen's); a real model's prompts are filtered by
length as train.py does. Seed config on CUDA: 4 prompts x 6 generations, prompts <= 704 tokens,
512-token completions (random weights never stop early), bf16, LoRA r=32.

Engines: `default` (TRL's transformers generate), `compiled` (the same with a static KV cache and
a compiled decode step: engines.py), `paged` (transformers continuous batching),
`vllm` (TRL's colocated vLLM, when installed), `llamacpp` (llama.cpp from the model's GGUF file with
the live LoRA adapter: training/llamacpp.py; a named model or a .gguf file). Each engine runs in a fresh process, so its peak
memory is its own and one engine's failure is reported without stopping the others (the exit
status is then non-zero).

Per step, after warm-up: total time, generation time and tokens/s, reward scoring time and its
share of the step, the rest (log-probs, loss, backward, optimizer), the warm-up step's time (the
compiled engine compiles in it) and the graphs torch.compile built after it (`recompiles`: 0 when
every step reuses the warm-up's graph), peak GPU memory as PyTorch
allocated it and as the device saw it (CUDA context and vLLM's pool included; every process on the
GPU counts, so run it on an idle one — the parent process never touches CUDA).

Random weights write noise, which the grader rejects in microseconds, so for random-weight models
every completion is graded as a stand-in answer of the kind a training batch holds (the batch
cycles through correct, failing tests, type error, correct, syntax error, failing tests, built
from the problem's reference solution): the reward time is a real grading of a realistic batch.
A model loaded from a path has its own completions graded.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import resource
import importlib.util
import json
import multiprocessing
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench.corpus import variants
from ocaml_grpo.models.loading import quiet_library_warnings
from ocaml_grpo.models.tiny import ensure_plumbing_model, ensure_shaped_model, plumbing_model_dir
from ocaml_grpo.models.loading import checkpointing_kwargs
from ocaml_grpo.models import named as named_models
from ocaml_grpo.models.named import NAMED, named_model_error
from ocaml_grpo.config.settings import cache_dir, from_env
from ocaml_grpo.training.engines import ENGINES, compiled_graphs, enable_compiled_generation, engine_kwargs
from ocaml_grpo.training.metrics import METRIC_IS_CLIPPED
from ocaml_grpo.problems import Problem, load_problems
from ocaml_grpo.prompting import END_MARKER, chat_messages, prompt_ids, prompt_token_count
from rewards import RewardConfig, RewardScorer, make_reward_function

STANDIN_KINDS = ["correct", "failing_tests", "type_error", "correct", "syntax_error", "failing_tests"]
SEED_CONFIG = dict(prompts=4, generations=6, completion=512, max_prompt=704)  # the seed's .envrc, on CUDA
CPU_CONFIG = dict(prompts=2, generations=2, completion=32, max_prompt=4096)


def resolve_model(name: str) -> tuple[Path, bool]:
    """(model dir, random weights?) for `tiny`, `qwen1.5b-shape`, a named model, a .gguf file or a local path."""
    if name == "tiny":
        return ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ))), True
    if name == "qwen1.5b-shape":
        return ensure_shaped_model(name, cache_dir(os.environ)), True
    if name in NAMED or name.endswith(".gguf"):
        if error := named_model_error("--model", name):
            raise SystemExit(error)
        return Path(named_models.resolve_model(name, cache_dir(os.environ))), False
    if not (Path(name) / "config.json").exists():
        raise SystemExit(f"--model {name}: not `tiny`, `qwen1.5b-shape`, a named model ({', '.join(NAMED)}), a .gguf "
                         "file, or a local model folder with config.json")
    return Path(name), False


def standin_completion(problem: Problem, i: int) -> str:
    """A realistic answer for sample i of a batch (the GRPO group cycles through STANDIN_KINDS)."""
    kind = STANDIN_KINDS[i % len(STANDIN_KINDS)]
    # The sample number keeps equal kinds textually distinct, so none is served from the grader's cache.
    return f"```ocaml\n{variants(problem)[kind]}\n(* sample {i} *)\n```\n{END_MARKER}"


def device_used_gb() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def run_engine(spec: str, model_dir: str, random_weights: bool, a: argparse.Namespace) -> dict:
    """One engine's warm-up and measured steps, in this (fresh) process. `spec`: the engine's name,
    `+prefix` after it: with the shared-prefix log-probability passes (GRPO_SHARED_PREFIX=1);
    `+oldpass` (llamacpp): the engine's importance ratio from TRL's extra no-grad pass, not the loss's forward."""
    engine, *options = spec.split("+")
    shared, old_pass = "prefix" in options, "oldpass" in options
    quiet_library_warnings()
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig

    from ocaml_grpo.training.trainer import OcamlGRPOTrainer

    on_gpu = torch.cuda.is_available()
    vllm_memory = a.vllm_gpu_memory or (
        round(min(0.3, 12 / (torch.cuda.get_device_properties(0).total_memory / 2**30)), 3) if on_gpu else 0.3)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = {p.id: p for p in load_problems("bundled") if p.solution and not p.requires}
    rows, prompt_lens = [], []
    for p in problems.values():
        if random_weights:
            # The plumbing tokenizer spends ~1.4x Qwen2.5's tokens on the same text (its 1,500-token vocabulary),
            # so few real prompts would fit the seed's budget: every templated prompt is cut to the budget
            # instead. Real prompts are 606-791 Qwen2.5 tokens (bench/BENCHMARKS.md, "Prompt length"); content is noise
            # to random weights, token counts are what cost time.
            ids = prompt_ids(tokenizer, p.prompt)[:a.max_prompt]
            rows.append({"prompt": tokenizer.decode(ids), **p.to_row()})
            prompt_lens.append(len(ids))
        elif (n := prompt_token_count(tokenizer, p.prompt, a.examples)) <= a.max_prompt:
            rows.append({"prompt": chat_messages(p.prompt, a.examples), **p.to_row()})
            prompt_lens.append(n)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if on_gpu else torch.float32)
    llama = None
    if engine == "llamacpp":
        from ocaml_grpo.training.llamacpp import LlamaEngine, context_tokens
        sequences = a.prompts * a.generations
        llama = LlamaEngine(named_models.gguf_source(a.model, cache_dir(os.environ)), threads=len(os.sched_getaffinity(0)),
                            sequences=sequences, context=context_tokens(a.prompts, sequences, max(prompt_lens), a.completion))
    scorer = RewardScorer(replace(from_env(RewardConfig, os.environ), min_lines=0))  # stand-ins are short; grade them all
    reward_fn = make_reward_function(None, a.completion, scorer=scorer)
    reward_times: list[float] = []
    reward_means: list[float] = []
    peak_used = [0.0]

    async def syntax_aware_reward(completions, **kw):
        t0 = time.perf_counter()
        if random_weights:
            completions = [standin_completion(problems[pid], i) for i, pid in enumerate(kw["id"])]
            # short, as the stand-ins are: the random model's own completions always run to the
            # limit, and a completion at the limit is a runaway whatever it holds
            kw["completion_ids"] = [[0] for _ in completions]
        out = await reward_fn(completions=completions, **kw)
        reward_times.append(time.perf_counter() - t0)
        reward_means.append(sum(out) / len(out))
        return out

    sequences = a.prompts * a.generations
    args = GRPOConfig(
        output_dir=str(Path(a.out) / engine), per_device_train_batch_size=sequences,
        num_generations=a.generations, max_completion_length=a.completion, max_steps=a.warmup + steps_of(a, spec),
        learning_rate=a.lr, temperature=0.9, beta=0.0, logging_steps=10**6, save_strategy="no", report_to=[],
        bf16=on_gpu, use_cpu=not on_gpu, **checkpointing_kwargs(GRPOConfig, on_gpu), remove_unused_columns=False, seed=0,
        **engine_kwargs(engine, sequences, a.max_prompt, a.completion, vllm_gpu_memory=vllm_memory))
    # LoRA as train.py's defaults (LORA_R, LORA_ALPHA, LORA_DROPOUT, LORA_TARGET_MODULES)
    peft = LoraConfig(r=32, lora_alpha=64, lora_dropout=a.lora_dropout, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM")
    step_times: list[float] = []
    graphs_after_warmup = [0]
    # TRL's step metrics, read at each step's end (its logs would average and clear them)
    watched = {"logp_gap": "sampling/sampling_logp_difference/mean", "is_ratio": "sampling/importance_sampling_ratio/mean",
               "clipped_share": METRIC_IS_CLIPPED, "entropy": "entropy"}
    per_step: dict[str, list] = {k: [] for k in watched}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, *args, **kw):
            step_times.append(time.perf_counter() - self.t0)
            for k, key in watched.items():
                values = trainer._metrics["train"].get(key)
                per_step[k].append(values[-1] if values else None)
            if on_gpu:
                peak_used[0] = max(peak_used[0], device_used_gb())
            # progress, for a run cut off by a time limit: what each step took so far
            kind = "warm-up" if len(step_times) <= a.warmup else "measured"
            if len(step_times) == a.warmup:
                graphs_after_warmup[0] = compiled_graphs()
            print(f"{spec}: step {len(step_times)} ({kind}) {step_times[-1]:.1f} s", flush=True)

    trainer = OcamlGRPOTrainer(model=model, reward_funcs=[syntax_aware_reward], args=args,
                               train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=peft,
                               callbacks=[StepTimer()], tracker=None, llama=llama,
                               share_prompts=shared, late_ratio=not old_pass,
                               stop=END_MARKER if a.stop_at_end else None)
    if engine == "compiled":
        enable_compiled_generation(trainer, a.compile_backend)
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
            peak_used[0] = max(peak_used[0], device_used_gb())
        gen_times.append(time.perf_counter() - t0)
        gen_tokens.append(sum(len(c) for c in out[1]))  # out[1]: completion ids per sample
        return out

    trainer._generate = timed_generate
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    scorer.close()
    if llama is not None:
        llama.close()
    w = a.warmup
    steps, gens, toks, rews = step_times[w:], gen_times[w:], gen_tokens[w:], reward_times[w:]
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    step, gen, rew = mean(steps), mean(gens), mean(rews)
    device = torch.cuda.get_device_name(0) if on_gpu else f"CPU ({os.cpu_count()} cores), no CUDA device"
    return {"engine": spec, "shared_prefix": shared, "device": device, "steps": len(steps), "step_s": step, "generation_s": gen,
            "generation_tokens_per_step": mean(toks), "generation_tok_per_s": sum(toks) / max(1e-9, sum(gens)),
            "reward_s": rew, "reward_share": rew / step if step else 0.0, "train_s": step - gen - rew,
            "reward_mean": mean(reward_means[w:]), "warmup_step_s": mean(step_times[:w]) if w else None,
            "graphs_compiled": compiled_graphs(), "recompiles_after_warmup": compiled_graphs() - graphs_after_warmup[0],
            "prompts_kept": len(rows), "prompt_tokens_max": max(prompt_lens, default=0),
            "peak_alloc_gb": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
            "peak_used_gb": peak_used[0] if on_gpu else None,
            "vllm_gpu_memory": vllm_memory if engine == "vllm" else None,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "completion_tokens_per_step": toks, "step_times_s": step_times,
            **{f"{k}_per_step": v for k, v in per_step.items()}}


def run_isolated(engine: str, model_dir: Path, random_weights: bool, a: argparse.Namespace) -> dict:
    """run_engine in a fresh spawned process: its own CUDA context, peak memory and vLLM state."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(run_engine, engine, str(model_dir), random_weights, a).result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    on_gpu = torch.cuda.is_available()
    base = SEED_CONFIG if on_gpu else CPU_CONFIG
    ap.add_argument("--engines", default=None,
                    help="comma list of default,compiled,paged,vllm,llamacpp, each optionally with +prefix (the shared-prefix "
                         "log-probability passes, GRPO_SHARED_PREFIX=1) and, for llamacpp, +oldpass (the engine's "
                         "importance ratio from TRL's extra no-grad pass), e.g. default,llamacpp+prefix (default: all "
                         "available but llamacpp)")
    ap.add_argument("--compile-backend", default="inductor", choices=["inductor", "cudagraphs"],
                    help="the compiled engine's torch.compile backend (cudagraphs: CUDA graphs without Triton)")
    ap.add_argument("--model", default="qwen1.5b-shape" if on_gpu else "tiny",
                    help="tiny | qwen1.5b-shape | a named model (smollm2-135m-instruct, qwen2.5-coder-0.5b-instruct, ...) | a .gguf file | a local model folder (default: qwen1.5b-shape on CUDA, tiny on CPU)")
    ap.add_argument("--prompts", type=int, default=base["prompts"], help="prompts per step")
    ap.add_argument("--generations", type=int, default=base["generations"], help="completions per prompt")
    ap.add_argument("--completion", type=int, default=base["completion"], help="max completion tokens")
    ap.add_argument("--max-prompt", type=int, default=base["max_prompt"],
                    help="prompt token budget: longer prompts are dropped (random weights: cut to it)")
    ap.add_argument("--steps", default="3", help="measured steps: N, or per engine (default=2,llamacpp=10)")
    ap.add_argument("--examples", type=int, default=3, help="worked examples in each prompt (GRPO_PROMPT_EXAMPLES)")
    ap.add_argument("--lr", type=float, default=5e-6, help="learning rate")
    ap.add_argument("--lora-dropout", type=float, default=0.05, help="LoRA dropout (LORA_DROPOUT)")
    ap.add_argument("--stop-at-end", action="store_true", help="answers end at the END marker (GRPO_STOP_AT_END=1)")
    ap.add_argument("--warmup", type=int, default=1, help="steps run first and not measured")
    ap.add_argument("--vllm-gpu-memory", type=float, default=None,
                    help="vLLM's share of the GPU (default: 12 GiB worth, at most 0.3)")
    ap.add_argument("--out", default="grpo_runs/bench_train", help="trainer output folders (nothing is saved)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    engines = (a.engines or ",".join(e for e in ENGINES if e not in ("vllm", "llamacpp")
                                     or (e == "vllm" and importlib.util.find_spec("vllm")))).split(",")
    for e in engines:
        name, *options = e.split("+")
        if name not in ENGINES or not set(options) <= {"prefix", "oldpass"} or ("oldpass" in options and name != "llamacpp"):
            raise SystemExit(f"--engines: unknown engine {e!r} (choose from {', '.join(ENGINES)}; +prefix, and +oldpass "
                             "for llamacpp)")
    model_dir, random_weights = resolve_model(a.model)
    graded = "random weights, stand-in answers graded" if random_weights else "own answers graded"
    print(f"device: {'CUDA' if on_gpu else 'CPU'}; model: {a.model} ({graded}, {'bf16' if on_gpu else 'fp32'}); "
          f"{a.prompts} prompts x {a.generations} generations, completion {a.completion} tokens, prompts <= "
          f"{a.max_prompt} tokens, LoRA r=32; {a.warmup} warm-up + {a.steps} measured steps", flush=True)
    header = (f"{'engine':<16}{'step s':>8}{'gen s':>8}{'gen tok/s':>11}{'vs default':>11}{'reward s':>10}"
              f"{'reward %':>10}{'train s':>9}{'alloc GB':>10}{'used GB':>9}{'warm-up s':>11}{'recompiles':>11}")
    results, failed = [], []
    for engine in engines:
        if engine == "vllm" and importlib.util.find_spec("vllm") is None:
            print("vllm: not installed (pip install -r requirements-vllm.txt), skipped")
            continue
        try:
            results.append(run_isolated(engine, model_dir, random_weights, a))
        except Exception as e:  # an engine that cannot run here is a result, not a crash of the others
            print(f"{engine}: failed: {type(e).__name__}: {str(e)[:300]}")
            failed.append(engine)
            continue
        # each engine's figures as soon as it has them: a run cut off by a time limit keeps what it measured
        print(header, row(results[-1], results), sep="\n", flush=True)
        write_json(a, results, failed)
    if len(results) > 1:  # the engines side by side
        print("\n" + header)
        for r in results:
            print(row(r, results))
    print(f"device: {results[0]['device'] if results else ('CUDA' if on_gpu else 'CPU')}")
    if results:
        print(f"prompts kept: {results[0]['prompts_kept']} (longest {results[0]['prompt_tokens_max']} tokens); "
              f"generated tokens per step: {results[0]['generation_tokens_per_step']:.0f}")
    write_json(a, results, failed)
    if failed:
        sys.exit(f"failed engines: {', '.join(failed)} (the error is printed above the table)")


def steps_of(a: argparse.Namespace, engine: str) -> int:
    """--steps for `engine`: one number for all, or engine=N pairs (an engine not named: the `default` pair's)."""
    if "=" not in a.steps:
        return int(a.steps)
    pairs = dict(kv.split("=") for kv in a.steps.split(","))
    return int(pairs.get(engine, pairs.get("default", 3)))


def row(r: dict, results: list[dict]) -> str:
    """One engine's line of the table; `vs default`: its generation speed over the default engine's."""
    base = next((b for b in results if b["engine"] == "default"), None)  # today's path
    ratio = r["generation_tok_per_s"] / base["generation_tok_per_s"] if base else float("nan")
    gb = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
    return (f"{r['engine']:<16}{r['step_s']:>8.2f}{r['generation_s']:>8.2f}{r['generation_tok_per_s']:>11.1f}"
            f"{ratio:>10.2f}x{r['reward_s']:>10.3f}{100 * r['reward_share']:>9.1f}%{r['train_s']:>9.2f}"
            f"{gb(r['peak_alloc_gb']):>10}{gb(r['peak_used_gb']):>9}"
            f"{r['warmup_step_s'] or float('nan'):>11.1f}{r['recompiles_after_warmup']:>11}")


def write_json(a: argparse.Namespace, results: list[dict], failed: list[str]) -> None:
    if a.json:
        device = results[0]["device"] if results else ("CUDA" if torch.cuda.is_available() else "CPU")
        Path(a.json).write_text(json.dumps({"device": device, "model": a.model, "config": vars(a),
                                            "results": results, "failed": failed}, indent=2))


if __name__ == "__main__":
    main()
