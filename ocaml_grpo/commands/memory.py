"""A GRPO run's peak memory, estimated before any model loads, and what the device has free.

    read_shape(folder or .gguf) -> ModelShape   # from config.json, or a GGUF file's metadata
    estimate(shape, run) -> Estimate            # the parts in bytes, from the shape and the settings
    available(on_gpu) -> (bytes, what)          # free RAM (MemAvailable) or the GPU's free memory
    fits(estimate, free), suggestions(...)      # whether it fits; else the settings that would

The model's shape comes from its config.json (a named GGUF model: its converted folder's, or the
GGUF file's metadata); no weight is read. The estimate is a sum of the parts a GRPO step holds at
its peak, the training forward and backward:
- the weights (fp32 on a CPU, bf16 on a GPU), the LoRA weights with their gradients and Adam states;
- the activations the backward pass needs: per token and layer, the tensors a decoder layer with
  LoRA on every projection saves (x a factor measured on each kind of device), for the
  per-device batch (GRPO_BATCH_SIZE x GRPO_NUM_GENERATIONS sequences of the longest prompt plus
  GRPO_MAX_COMPLETION: a random or runaway answer runs to the limit). With gradient checkpointing
  (on a GPU) only each layer's input is kept, plus one layer's activations while it is recomputed;
- the KV cache of the generation batch (x GRPO_GRAD_ACCUM_STEPS), alive until its step is scored;
- the runtime: the libraries' own memory on a CPU; on a GPU the CUDA context and what PyTorch's
  caching allocator reserves beyond its allocations.
TRL 1.16 computes log-probabilities through a tiled LM head, so (batch, tokens, vocabulary) logits
are never held: the vocabulary costs only its weights. The constants are fitted to peaks measured
by bench/bench_memory.py (bench/BENCHMARKS.md, "Memory before it is spent").

Nothing here imports torch: `python train.py --check` answers without a GPU.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

GB = 1e9
CPU_RUNTIME_GB = 0.95  # torch, transformers, TRL and datasets imported, the tokenizer and dataset loaded (measured: 0.93 in all for the tiny model's smallest run)
# Measured peaks / the count of saved values (bench/bench_memory.py), with GRPO_STEADY_MEMORY=1 and
# torch on one thread (GRPO_TORCH_THREADS=auto on 2 cores), each run's one step drawing the longest
# prompts. The count itself is right (torch's saved-tensor hooks: 2-4% over, bench/
# saved_activations.py); the rest is the backward pass's transient tensors. 1.35 keeps every run
# measured within -3%..+22% (bench/BENCHMARKS.md, "Memory before it is spent"); the 1.1 fitted
# before was fitted to steps that had drawn shorter prompts, and fell 17% under on the longest.
CPU_ACTIVATION_FACTOR = 1.35
# GRPO_STEADY_MEMORY=0: with glibc's defaults the same runs peaked 0-30% above the steady allocator's,
# and up to 25% apart from one run to the next; 1.8 keeps the largest measured within 3% under (the
# smallest are then 29-40% over: no factor fits both)
CPU_ACTIVATION_FACTOR_GLIBC = 1.8
GPU_ACTIVATION_FACTOR = 1.0  # the H200 run on record: 12.1 GB allocated
GPU_CONTEXT_GB = 0.5  # the CUDA context, outside PyTorch's allocations
GPU_RESERVE = 0.15  # PyTorch's caching allocator reserves more than it allocates (H200: 14.1 GB used for 12.1 allocated)
EXAMPLE_TOKENS = 150  # a worked example's share of a prompt, at the least (ocaml_grpo/prompting.py: ~200 in Qwen's tokenizer)
# glibc's malloc under GRPO_STEADY_MEMORY (steady_allocator): blocks from this size up are mapped
# and unmapped on their own; mallopt's parameter numbers, from malloc.h
STEADY_MMAP_THRESHOLD = 128 << 10
STEADY_ARENAS = 2
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8
HEADROOM = 0.9  # a run may plan on 90% of what is free: the grader's processes and the page cache need the rest


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a decoder-only transformer depends on, from its config."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    source: str  # the file it was read from

    @property
    def params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate + 2 * h + q + 2 * kv
        return self.vocab * h * (1 if self.tied else 2) + self.layers * per_layer + h

    def dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection, by peft's module names."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
                "up_proj": (h, i), "down_proj": (i, h)}

    def lora_params(self, r: int, modules: list[str]) -> int:
        """Trainable parameters of a LoRA of rank r on these projections."""
        return self.layers * sum(r * sum(self.dims()[m]) for m in modules if m in self.dims())

    def saved_per_token(self, modules: list[str]) -> int:
        """Values one decoder layer saves for its backward pass, per token, without checkpointing:
        the norms' inputs and outputs, q/k/v (k/v also repeated to the query heads), the
        attention's output, the MLP's four intermediates, and each LoRA module's dropped-out input."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return 6 * h + 5 * q + 3 * kv + 4 * i + sum(self.dims()[m][0] for m in modules if m in self.dims())


def read_shape(folder_or_gguf: str | Path) -> ModelShape:
    """The shape from a model folder's config.json, or from a .gguf file's metadata (the gguf
    package reads the header only). ValueError naming the file when it cannot be read."""
    path = Path(folder_or_gguf)
    if path.suffix == ".gguf":
        return gguf_shape(path)
    cfg_file = path / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{cfg_file}: cannot read the model's config ({e})") from None
    cfg = cfg.get("text_config", cfg)
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return ModelShape(layers=int(cfg["num_hidden_layers"]), hidden=hidden,
                          intermediate=int(cfg.get("intermediate_size") or 4 * hidden), heads=heads,
                          kv_heads=int(cfg.get("num_key_value_heads") or heads),
                          head_dim=int(cfg.get("head_dim") or hidden // heads), vocab=int(cfg["vocab_size"]),
                          tied=bool(cfg.get("tie_word_embeddings", False)), source=str(cfg_file))
    except KeyError as e:
        raise ValueError(f"{cfg_file}: no {e.args[0]} in the model's config: cannot estimate its memory") from None


def gguf_shape(path: Path) -> ModelShape:
    from gguf import GGUFReader  # memory-maps the file: the header is read, the tensors are not
    reader = GGUFReader(str(path))

    def value(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    arch = value("general.architecture")
    get = lambda k: value(f"{arch}.{k}")  # noqa: E731
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    tokens = value("tokenizer.ggml.tokens")
    tied = "output.weight" not in {t.name for t in reader.tensors}
    return ModelShape(layers=int(get("block_count")), hidden=hidden, intermediate=int(get("feed_forward_length")),
                      heads=heads, kv_heads=int(get("attention.head_count_kv") or heads),
                      head_dim=int(get("attention.key_length") or hidden // heads),
                      vocab=len(tokens) if tokens else int(get("vocab_size")), tied=tied, source=str(path))


@dataclass(frozen=True)
class RunShape:
    """The settings the peak depends on."""
    sequences: int  # per device and optimizer step: GRPO_BATCH_SIZE x GRPO_NUM_GENERATIONS
    grad_accum: int
    prompt_tokens: int  # the longest prompt the run will see
    completion_tokens: int  # GRPO_MAX_COMPLETION
    lora_r: int
    lora_modules: list[str]
    on_gpu: bool
    checkpointing: bool  # on a GPU (models.checkpointing_kwargs)
    cache_prompt_tokens: int = 0  # the compiled engine's static KV cache is sized to GRPO_MAX_PROMPT (0: the longest prompt)
    steady_allocator: bool = True  # GRPO_STEADY_MEMORY

    @property
    def bytes_per_value(self) -> int:
        return 2 if self.on_gpu else 4  # bf16 on a GPU, fp32 on a CPU (models.load_model)


@dataclass
class Estimate:
    parts: dict[str, float] = field(default_factory=dict)  # bytes, by part

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        return ", ".join(f"{k} {v / GB:.2f}" for k, v in self.parts.items())


def estimate(shape: ModelShape, run: RunShape) -> Estimate:
    b = run.bytes_per_value
    tokens = run.sequences * (run.prompt_tokens + run.completion_tokens)
    lora = shape.lora_params(run.lora_r, run.lora_modules)
    factor = (GPU_ACTIVATION_FACTOR if run.on_gpu else
              CPU_ACTIVATION_FACTOR if run.steady_allocator else CPU_ACTIVATION_FACTOR_GLIBC)
    layer = shape.saved_per_token(run.lora_modules) * tokens * b * factor
    if run.checkpointing:
        activations = shape.layers * shape.hidden * tokens * b + layer
    else:
        activations = shape.layers * layer
    kv = (2 * shape.layers * shape.kv_heads * shape.head_dim * b * run.sequences * run.grad_accum
          * (max(run.prompt_tokens, run.cache_prompt_tokens) + run.completion_tokens))
    parts = {"weights": float(shape.params * b), "LoRA + Adam": float(lora * 16), "activations": float(activations),
             "KV cache": float(kv)}
    allocated = sum(parts.values())
    parts["runtime"] = GPU_CONTEXT_GB * GB + GPU_RESERVE * allocated if run.on_gpu else CPU_RUNTIME_GB * GB
    return Estimate(parts)


def steady_allocator(mmap_threshold: int = STEADY_MMAP_THRESHOLD, arenas: int = STEADY_ARENAS) -> str | None:
    """Make glibc's malloc give freed blocks back (GRPO_STEADY_MEMORY): None when set, else why not.

    By default glibc raises its mmap threshold each time a large block is freed (up to 32 MB), after
    which blocks under it come from the heap and stay there when freed; and it keeps an arena per
    thread. A CPU run's tensors are such blocks, so its peak depended on the order of earlier frees:
    the same run peaked at 3.67 or 4.54 GB. A fixed threshold (which also turns the adapting off)
    and two arenas made every repeat of a run peak the same, at the low end of that spread
    (bench/BENCHMARKS.md, "Memory before it is spent"). Set before torch loads and the threads start."""
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return "not glibc (no mallopt)"
    if mallopt(M_MMAP_THRESHOLD, mmap_threshold) != 1 or mallopt(M_ARENA_MAX, arenas) != 1:
        return "mallopt refused the setting"
    return None


def available(on_gpu: bool) -> tuple[float, str]:
    """(bytes free, what was measured): the GPU's free memory (torch.cuda.mem_get_info), else
    /proc/meminfo's MemAvailable (what can be allocated without swapping)."""
    if on_gpu:
        import torch
        free, total = torch.cuda.mem_get_info()
        return float(free), f"free on {torch.cuda.get_device_name()} ({total / GB:.1f} GB in all)"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024, "RAM available (/proc/meminfo MemAvailable)"
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return float(pages), "RAM free (sysconf)"


def fits(est: Estimate, free: float) -> bool:
    return est.total <= free * HEADROOM


def suggestions(shape: ModelShape, run: RunShape, budget: float, batch_size: int, generations: int,
                examples: int = 0) -> list[str]:
    """Settings that bring the estimate under `budget` bytes, each found by halving one knob
    until it fits (the first that does, per knob)."""
    out = []
    for name, start, make in [
        ("GRPO_NUM_GENERATIONS", generations, lambda v: replace(run, sequences=batch_size * v)),
        ("GRPO_BATCH_SIZE", batch_size, lambda v: replace(run, sequences=v * generations)),
        ("GRPO_MAX_COMPLETION", run.completion_tokens, lambda v: replace(run, completion_tokens=v)),
    ]:
        lo = 2 if name == "GRPO_NUM_GENERATIONS" else 1 if name == "GRPO_BATCH_SIZE" else 8
        v = start // 2
        while v >= lo:
            if estimate(shape, make(v)).total <= budget:
                out.append(f"{name}={v}")
                break
            v //= 2
    if examples:
        shorter = replace(run, prompt_tokens=max(64, run.prompt_tokens - EXAMPLE_TOKENS * examples))
        if estimate(shape, shorter).total <= budget:
            out.append("GRPO_PROMPT_EXAMPLES=0 (each worked example is ~200 prompt tokens; after SFT taught the format)")
    return out


def report(est: Estimate, run: RunShape, free: float, what: str) -> str:
    return (f"memory: {run.sequences} sequences a step, the longest prompt {run.prompt_tokens} tokens + "
            f"{run.completion_tokens} completion tokens, {'bf16 on a GPU' if run.on_gpu else 'fp32 on a CPU'}"
            f"{', gradient checkpointing' if run.checkpointing else ''}\n"
            f"memory: the run's peak is estimated at {est.total / GB:.1f} GB ({est.describe()} GB); "
            f"{free / GB:.1f} GB {what}, of which the run may plan on {HEADROOM:.0%}")
