"""TRL generation-engine settings sized for a trainer that shares its GPU (train.py, bench_train.py).

TRL's defaults size KV caches for an inference server: transformers' continuous batching takes
half of the free GPU memory and colocated vLLM plans for the model's full 32k context. A GRPO step
only ever holds `sequences` requests of at most prompt + completion tokens, so the caches are sized
to exactly that and the memory stays with training.

The `compiled` engine is transformers' static KV cache with its decode step under torch.compile
(CUDA graphs on a GPU), reached through TRL's and transformers' own controls. The cache has one
size for the whole run (`max_cache_len`), so every decode step of every training step has the same
shapes whatever the prompts' lengths, and the graph is compiled once; the prefill runs eager. The
optimizer updates the LoRA weights in place, where the captured graph reads them.

Prompts are not padded to length buckets: decode shapes do not depend on the prompt length, and
TRL's `pad_to_multiple_of` (which pads the training batch too) gave NaN gradients in the first step
on an H200 in bf16, with or without compilation (bench/BENCHMARKS.md, "Generation on a GPU").
"""
from __future__ import annotations

import math

from ocaml_grpo.config.grpo import ENGINES
PAGE_TOKENS = 256  # transformers' continuous-batching page size (its default)


ALIASES = (("GRPO_USE_VLLM", "use_vllm", "vllm"), ("GRPO_CONTINUOUS_BATCHING", "continuous_batching", "paged"),
           ("GRPO_COMPILED_GENERATION", "compiled_generation", "compiled"))


def choose_engine(train) -> tuple[str, str | None]:
    """The engine a TrainConfig asks for, GRPO_ENGINE or one of the flags that name an engine, and
    why that is contradictory (None: it is not)."""
    flagged = [(var, name) for var, attr, name in ALIASES if getattr(train, attr)]
    if len(flagged) > 1:
        return train.engine, f"{'=1 and '.join(v for v, _ in flagged)}=1: choose one generation engine (GRPO_ENGINE)"
    if flagged and train.engine not in ("default", flagged[0][1]):
        return train.engine, f"GRPO_ENGINE={train.engine} and {flagged[0][0]}=1: choose one generation engine"
    return (flagged[0][1] if flagged else train.engine), None


def engine_variable(train, engine: str) -> str:
    """The setting that chose `engine`, as the user wrote it (for messages)."""
    return next((f"{var}=1" for var, attr, name in ALIASES if name == engine and getattr(train, attr)),
                f"GRPO_ENGINE={engine}")


def engine_kwargs(engine: str, sequences: int, max_prompt: int, max_completion: int, *,
                  vllm_mode: str = "colocate", vllm_gpu_memory: float = 0.3,
                  vllm_server_url: str | None = None, stop: str | None = None) -> dict:
    """GRPOConfig keyword arguments for `engine` (default: transformers generate, compiled: the same
    with a static cache and a compiled decode step (also call `enable_compiled_generation` on the
    trainer), paged: transformers continuous batching, vllm: TRL's vLLM integration).
    `sequences`: completions generated at once (per-device batch x steps per generation).
    `stop`: a text that ends an answer (the END marker), kept in it; the trainer must then be an
    OcamlGRPOTrainer made with the same `stop`, which gives generate the tokenizer it needs for it."""
    if engine not in ENGINES:
        raise ValueError(f"unknown generation engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if stop and engine == "paged":
        raise ValueError("the paged engine (continuous batching) cannot stop an answer at a text")
    max_len = max_prompt + max_completion
    kw: dict = {"use_vllm": engine == "vllm", "use_transformers_continuous_batching": engine == "paged"}
    generation: dict = {}
    if stop:
        generation.update({"stop": [stop], "include_stop_str_in_output": True} if engine == "vllm"
                          else {"stop_strings": [stop]})
    if engine == "compiled":
        # Longer prompts (a repair turn's conversation) get a bigger cache, and one more compile, when they come.
        generation["max_cache_len"] = max_len
        kw["cache_implementation"] = "static"
    if generation:
        kw["generation_kwargs"] = generation
    if engine == "paged":
        kw["transformers_continuous_batching_config"] = {"num_blocks": sequences * math.ceil(max_len / PAGE_TOKENS)}
    if engine == "vllm":
        kw.update(vllm_mode=vllm_mode, vllm_gpu_memory_utilization=vllm_gpu_memory,
                  vllm_server_base_url=vllm_server_url if vllm_mode == "server" else None)
        if vllm_mode == "colocate":
            kw["vllm_max_model_length"] = max_len
    return kw


def end_turn_at_stop(ids: list[list[int]], logprobs: list[list[float]] | None, decode, stop: str,
                     end_ids: set[int], eos_id: int, unsampled_logprob: float = 0.0
                     ) -> tuple[list[list[int]], list[list[float]] | None]:
    """Answers that stopped at `stop` end their turn with `eos_id`, as if the model had written it.

    generate pads an answer that stopped early (TRL keeps the pads up to its first end-of-turn id,
    all of them when the pad is not one) and leaves the last one to stop with no end at all; vLLM
    never adds one. TRL counts an answer without an end-of-turn token as cut off at the budget
    (its clipped ratio, GRPO_MASK_TRUNCATED), and a repair turn's conversation must close the
    answer, so each answer whose text ends with `stop` gets exactly one `eos_id` after it. That
    token was not sampled: its log-probability is `unsampled_logprob` (vLLM's: 0, certain; the
    llama.cpp engine's: NaN, which TRL's importance-sampling correction leaves out). `end_ids`: the
    pad and end-of-turn ids that may trail an answer."""
    ids, logprobs = [list(x) for x in ids], None if logprobs is None else [list(x) for x in logprobs]
    for i, x in enumerate(ids):
        n = len(x)
        while n and x[n - 1] in end_ids:
            n -= 1
        if not decode(x[:n]).rstrip().endswith(stop):
            continue
        ids[i] = x[:n] + [eos_id]
        if logprobs is not None:
            logprobs[i] = logprobs[i][:n] + ([logprobs[i][n]] if len(logprobs[i]) > n else [unsampled_logprob])
    return ids, logprobs


def enable_compiled_generation(trainer, backend: str = "inductor") -> None:
    """Turn on generate's compiled decode step in a trainer built with engine_kwargs("compiled", ...).

    TRL builds its generation config with `disable_compile=True`, and transformers compiles only on
    accelerators unless the compile config says otherwise; both are switched here, on the config
    TRL passes to every `generate`. On CUDA the compile mode is `reduce-overhead` (CUDA graphs).
    `backend`: torch.compile's (bench_train's --compile-backend: `cudagraphs` needs no Triton)."""
    from transformers import CompileConfig

    on_gpu = trainer.accelerator.device.type == "cuda"
    mode = "reduce-overhead" if on_gpu and backend == "inductor" else None
    config = CompileConfig(fullgraph=False, dynamic=False, backend=backend, mode=mode)
    config._compile_all_devices = True  # transformers' own switch for compiling on CPU too
    trainer.generation_config.disable_compile = False
    trainer.generation_config.compile_config = config


def compile_problem() -> str | None:
    """Why torch.compile cannot build a kernel here, on CUDA when there is one (None: it can).

    Inductor needs a C compiler (its CPU kernels, Triton's launchers on a GPU). A one-line function
    is compiled, with the graph cache off so that a cached kernel cannot hide a missing compiler,
    before any model loads: a machine without one is a config error, not a crash in the first step."""
    import torch
    from torch._inductor import config as inductor_config

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        with inductor_config.patch(fx_graph_cache=False):
            torch.compile(lambda x: x * 2 + 1, fullgraph=True, dynamic=False)(torch.ones(4, device=device))
    except Exception as e:  # whatever stops inductor is the reason to report
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    return None


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far (each recompilation adds one)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def drop_orphaned_input_hooks(model) -> int:
    """Remove the input-embedding hooks that gradient checkpointing left behind; returns how many.

    TRL turns gradient checkpointing off for each generation and on again after it; each time on,
    transformers' `enable_input_require_grads` registers a new hook on the input embeddings and
    forgets the handle of the last one, so hooks pile up (7 per step here, all doing the same
    thing). Every forward runs them all, and the compiled engine's graph guards on their number:
    it would recompile every step. The hooks whose handles the model still holds are kept."""
    live = {h.id for m in model.modules() for h in (getattr(m, "_require_grads_hooks", None) or [])}
    embeddings = model.get_input_embeddings()
    orphans = [k for k, fn in embeddings._forward_hooks.items()
               if k not in live and getattr(fn, "__qualname__", "").endswith(".make_inputs_require_grads")]
    for k in orphans:
        for hooks in (embeddings._forward_hooks, embeddings._forward_hooks_with_kwargs,
                      embeddings._forward_hooks_always_called):
            hooks.pop(k, None)
    return len(orphans)
