"""TRL generation-engine settings sized for a trainer that shares its GPU (train.py, bench_train.py).

TRL's defaults size KV caches for an inference server: transformers' continuous batching takes
half of the free GPU memory and colocated vLLM plans for the model's full 32k context. A GRPO step
only ever holds `sequences` requests of at most prompt + completion tokens, so the caches are sized
to exactly that and the memory stays with training.
"""
from __future__ import annotations

import math

ENGINES = ("default", "paged", "vllm")
PAGE_TOKENS = 256  # transformers' continuous-batching page size (its default)


def engine_kwargs(engine: str, sequences: int, max_prompt: int, max_completion: int, *,
                  vllm_mode: str = "colocate", vllm_gpu_memory: float = 0.3,
                  vllm_server_url: str | None = None) -> dict:
    """GRPOConfig keyword arguments for `engine` (default: transformers generate, paged:
    transformers continuous batching, vllm: TRL's vLLM integration). `sequences`: completions
    generated at once (per-device batch x steps per generation)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown generation engine {engine!r}: choose one of {', '.join(ENGINES)}")
    max_len = max_prompt + max_completion
    kw: dict = {"use_vllm": engine == "vllm", "use_transformers_continuous_batching": engine == "paged"}
    if engine == "paged":
        kw["transformers_continuous_batching_config"] = {"num_blocks": sequences * math.ceil(max_len / PAGE_TOKENS)}
    if engine == "vllm":
        kw.update(vllm_mode=vllm_mode, vllm_gpu_memory_utilization=vllm_gpu_memory,
                  vllm_server_base_url=vllm_server_url if vllm_mode == "server" else None)
        if vllm_mode == "colocate":
            kw["vllm_max_model_length"] = max_len
    return kw
