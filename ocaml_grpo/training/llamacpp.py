"""Rollouts from the model's GGUF through llama.cpp, with the trainer's live LoRA adapter
(GRPO_ENGINE=llamacpp; `make engine` installs llama-cpp-python).

The GGUF file is the one the trainer's weights were dequantized from, so the engine and the trainer
run one policy in two numerical implementations: llama.cpp multiplies the quantized weights with
8-bit activations, the trainer in float. Before each generation the trainer's LoRA weights are
written as a GGUF adapter (the tensor names and layout of llama.cpp's convert_lora_to_gguf.py) and
set on the live context; the model is never reloaded. The per-token log-probabilities of what was
sampled go back to the trainer, which weighs each answer by TRL's importance-sampling ratio
(trainer.py), as it does for vLLM's rollouts.

A group's answers share their prompt: its tokens are decoded once, carrying every answer's sequence
id, into one KV cache shared by all sequences (`kv_unified`), and all the answers of all the groups
then decode together, one token each per batch. Sampling is done here in numpy, from the logits
llama.cpp returns, as transformers' sampler does it: temperature, then top-k, top-p and min-p; no
repetition penalty. The log-probability returned is the token's under the temperature-scaled full
distribution, the quantity the trainer computes. Not covered: multimodal prompts, tools.
"""
from __future__ import annotations

import ctypes
import importlib.util
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ocaml_grpo.models.loading import adapter_base
from ocaml_grpo.models.named import NamedModelError, converted_folder, gguf_source

INSTALL_HINT = "`make engine` (pip install llama-cpp-python==0.3.36; it compiles for ~15 min on 2 cores, once)"
# peft's module names -> llama.cpp's tensor names (Qwen2 and Llama share them)
GGUF_MODULES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
                "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
PREFILL_CHUNK = 512  # tokens per llama_decode call while reading prompts


def missing() -> str | None:
    """Why the engine cannot run here (None: it can), without importing it."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed: {INSTALL_HINT}"
    return None


def run_errors(model_id: str, adapter: str | None, cache: Path) -> list[str]:
    """Why llama.cpp cannot sample `model_id` with `adapter` (empty: it can), before any model
    loads: the engine missing, no GGUF file for the model, an adapter trained on another model."""
    if why := missing():
        return [why]
    errors = []
    try:
        gguf_source(model_id, cache)
    except NamedModelError as e:
        errors.append(f"{model_id}: {e}")
    trained_on = adapter_base(adapter) if adapter else None
    if trained_on and trained_on not in (model_id, str(converted_folder(model_id, cache))):
        errors.append(f"the adapter {adapter} was trained on {trained_on}, not on {model_id}: llama.cpp cannot apply "
                      "another model's adapter")
    return errors


@dataclass(frozen=True)
class Sampling:
    """transformers' sampling controls as TRL sets them (GRPOConfig)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off


@dataclass
class Answers:
    """What one generation call returns: each answer's tokens and their log-probabilities under the
    sampling distribution (temperature-scaled), one list per prompt given, in the prompts' order."""
    ids: list[list[int]]
    logprobs: list[list[float]]
    prompt_tokens: int  # tokens prefilled (each distinct prompt once)
    generated_tokens: int


# ----------------------------------------------------------------------------- the LoRA adapter as GGUF

def lora_tensors(named_parameters, arch: str, n_head: int, n_head_kv: int) -> dict[str, np.ndarray]:
    """The adapter's tensors under llama.cpp's names, from peft's parameters (name, tensor) of the
    active adapter ("default"; a saved adapter's names have no adapter name). A is (r, in), B is
    (out, r), as convert_lora_to_gguf.py writes them; for the llama architecture B's rows of q and k
    are permuted as the converter permutes the base weights (GGUF stores them in another order than
    transformers)."""
    out = {}
    for name, p in named_parameters:
        if not any(f".lora_{x}.{tail}" in name for x in "AB" for tail in ("default.", "weight")):
            continue
        parts = name.split(".")
        module = parts[parts.index("lora_A" if "lora_A" in parts else "lora_B") - 1]
        layer = int(parts[parts.index("layers") + 1])
        if module not in GGUF_MODULES:
            raise ValueError(f"LoRA on {module}: llama.cpp's adapter has no tensor for it (LORA_TARGET_MODULES: "
                             f"{', '.join(GGUF_MODULES)})")
        w = p.detach().float().cpu().numpy()
        is_b = "lora_B" in parts
        if is_b and arch == "llama" and module in ("q_proj", "k_proj"):
            heads = n_head if module == "q_proj" else n_head_kv
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        out[f"blk.{layer}.{GGUF_MODULES[module]}.weight.lora_{'b' if is_b else 'a'}"] = np.ascontiguousarray(w)
    if not out:
        raise ValueError("the model has no LoRA weights to give the engine")
    return out


def write_adapter(path: Path, tensors: dict[str, np.ndarray], arch: str, alpha: float) -> None:
    """A GGUF LoRA adapter llama.cpp loads with llama_adapter_lora_init (scale alpha / r)."""
    import gguf
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    for name, w in tensors.items():
        writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_architecture(path: Path) -> dict:
    """The GGUF file's architecture and the head counts the adapter's layout depends on."""
    import gguf
    reader = gguf.GGUFReader(str(path))

    def field(key: str):
        f = reader.fields.get(key)
        if f is None:
            return None
        value = f.parts[f.data[0]]
        return bytes(value).decode() if f.types[0] == gguf.GGUFValueType.STRING else value.tolist()[0]

    arch = field("general.architecture")
    return {"arch": arch, "n_layer": field(f"{arch}.block_count"), "n_head": field(f"{arch}.attention.head_count"),
            "n_head_kv": field(f"{arch}.attention.head_count_kv") or field(f"{arch}.attention.head_count"),
            "n_embd": field(f"{arch}.embedding_length"),
            "n_vocab": len(reader.fields["tokenizer.ggml.tokens"].data)}


def context_tokens(prompts: int, sequences: int, prompt_tokens: int, completion_tokens: int) -> int:
    """The shared KV cache a generation call fills: each distinct prompt once, each answer apart."""
    return 256 * math.ceil((prompts * prompt_tokens + sequences * completion_tokens + 1) / 256)


def memory_bytes(gguf_path: Path, n_ctx: int, sequences: int, lora_params: int) -> float:
    """What the engine adds to a run's peak: the GGUF file (mapped, and read whole), its f16 KV
    cache of `n_ctx` tokens, the logits copied out for sampling and the adapter (f32, written and loaded)."""
    a = gguf_architecture(gguf_path)
    head_dim = a["n_embd"] // a["n_head"]
    kv = 2 * a["n_layer"] * a["n_head_kv"] * head_dim * 2 * n_ctx
    logits = 3 * sequences * a["n_vocab"] * 8  # float64 working copies in sample_rows
    return float(Path(gguf_path).stat().st_size + kv + logits + 2 * 4 * lora_params)


def saved_lora(adapter_dir: str | Path, arch: str, n_head: int, n_head_kv: int) -> tuple[dict[str, np.ndarray], float]:
    """A saved peft adapter (adapter_model.safetensors) as the engine's tensors, and its alpha."""
    import json

    from safetensors.torch import load_file
    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    if config.get("use_rslora") or config.get("use_dora"):
        raise ValueError(f"{adapter_dir}: llama.cpp runs plain LoRA (scale alpha / r), not rsLoRA or DoRA")
    weights = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))  # torch tensors: bf16 too
    return lora_tensors(weights.items(), arch, n_head, n_head_kv), float(config["lora_alpha"])


# ----------------------------------------------------------------------------- sampling

def log_softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Rows of log softmax(logits / temperature), in float64 (what the trainer computes, in float)."""
    x = logits.astype(np.float64) / temperature
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def sample_rows(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One token per row of `logits` (rows x vocab) and its log-probability under softmax(logits / T).
    Temperature 0: the most likely token (greedy), its log-probability under softmax(logits)."""
    if sampling.temperature <= 0:
        logp = log_softmax(logits)
        tokens = logp.argmax(axis=1)
        return tokens, logp[np.arange(len(logp)), tokens]
    logp = log_softmax(logits, sampling.temperature)
    tokens = np.empty(len(logp), dtype=np.int64)
    for i, row in enumerate(logp):
        tokens[i] = _sample_one(row, sampling, rng)
    return tokens, logp[np.arange(len(logp)), tokens]


def _sample_one(logp: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    if s.top_k <= 0 and s.top_p >= 1.0 and s.min_p <= 0.0:
        p = np.exp(logp)
        return int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum()), len(p) - 1))
    # candidates, best first: only tokens that could survive the filters are sorted
    if s.top_k > 0:
        cand = np.argpartition(-logp, min(s.top_k, len(logp)) - 1)[:s.top_k]
    else:
        # a token below 1e-4 is kept by top-p only if the tokens above 1e-4 hold less than top_p
        cand = np.flatnonzero(logp >= math.log(1e-4))
        if np.exp(logp[cand]).sum() < s.top_p:
            cand = np.arange(len(logp))
    cand = cand[np.argsort(-logp[cand], kind="stable")]
    p = np.exp(logp[cand])
    p /= p.sum()  # transformers renormalises after top-k
    keep = len(p)
    if s.top_p < 1.0:  # the smallest prefix whose mass reaches top_p (transformers keeps at least one)
        keep = min(keep, int(np.searchsorted(np.cumsum(p), s.top_p)) + 1)
    if s.min_p > 0.0:
        keep = min(keep, max(1, int((p >= s.min_p * p[0]).sum())))
    p = p[:keep] / p[:keep].sum()
    return int(cand[min(np.searchsorted(np.cumsum(p), rng.random()), keep - 1)])


# ----------------------------------------------------------------------------- the engine

class LlamaEngine:
    """A llama.cpp model and context over one GGUF file, with a swappable LoRA adapter."""

    def __init__(self, gguf_path: str | Path, *, threads: int, sequences: int, context: int = 4096):
        import llama_cpp as lc
        self.lc, self.path = lc, Path(gguf_path)
        self.shape = gguf_architecture(self.path)
        self.threads, self.sequences = threads, sequences
        self._quiet = lc.llama_log_callback(lambda level, text, data: None)  # llama.cpp logs every load to stderr
        lc.llama_log_set(self._quiet, ctypes.c_void_p(0))
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.use_mmap = True
        self.model = lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.path}")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.ctx = None
        self.n_ctx = 0
        self.adapter = None
        self._adapter_dir = tempfile.TemporaryDirectory(prefix="ocaml-grpo-lora-")
        self.adapter_swaps = 0
        self._context(context)

    # -- context and adapter
    def _context(self, n_ctx: int) -> None:
        lc = self.lc
        if self.ctx is not None:
            lc.llama_free(self.ctx)
        params = lc.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = PREFILL_CHUNK
        params.n_seq_max = max(1, self.sequences)
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = True  # one cache: a prompt's cells are shared by its group's sequences
        params.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {n_ctx} tokens for {self.path}")
        self.n_ctx = lc.llama_n_ctx(self.ctx)
        if self.adapter is not None:
            self._apply(self.adapter)

    def _ensure(self, sequences: int, tokens: int) -> None:
        if sequences > self.sequences or tokens > self.n_ctx:
            self.sequences = max(self.sequences, sequences)
            self._context(max(self.n_ctx, 256 * math.ceil(tokens / 256)))

    def _apply(self, adapter) -> None:
        lc = self.lc
        adapters = (lc.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(1.0)
        if lc.llama_set_adapters_lora(self.ctx, adapters, 1, scales) != 0:
            raise RuntimeError("llama.cpp refused to set the LoRA adapter on its context")

    def set_lora(self, tensors: dict[str, np.ndarray], alpha: float) -> None:
        """Write `tensors` (lora_tensors) as a GGUF adapter, set it on the live context, free the last one."""
        path = Path(self._adapter_dir.name) / f"adapter-{self.adapter_swaps % 2}.gguf"
        write_adapter(path, tensors, self.shape["arch"], alpha)
        new = self.lc.llama_adapter_lora_init(self.model, str(path).encode())
        if not new:
            raise RuntimeError(f"llama.cpp could not load the LoRA adapter written for {self.path.name} (is it this "
                               "model's adapter? its tensor names and shapes must match the model's)")
        self._apply(new)
        if self.adapter is not None:
            self.lc.llama_adapter_lora_free(self.adapter)
        self.adapter = new
        self.adapter_swaps += 1
        path.unlink()

    def clear_lora(self) -> None:
        self.lc.llama_set_adapters_lora(self.ctx, None, 0, None)
        if self.adapter is not None:
            self.lc.llama_adapter_lora_free(self.adapter)
        self.adapter = None

    def close(self) -> None:
        lc = self.lc
        if self.ctx is not None:
            lc.llama_free(self.ctx)
            self.ctx = None
        if self.adapter is not None:
            lc.llama_adapter_lora_free(self.adapter)
            self.adapter = None
        if self.model is not None:
            lc.llama_model_free(self.model)
            self.model = None
        self._adapter_dir.cleanup()

    # -- decoding
    def _decode(self, entries: list[tuple[int, int, tuple[int, ...], bool]]) -> list[np.ndarray]:
        """Decode (token, position, sequence ids, wants logits) entries in chunks; the logits asked for, in order."""
        lc = self.lc
        out = []
        n_seq = max(len(e[2]) for e in entries)
        batch = lc.llama_batch_init(min(PREFILL_CHUNK, len(entries)), 0, n_seq)
        try:
            for start in range(0, len(entries), PREFILL_CHUNK):
                chunk = entries[start:start + PREFILL_CHUNK]
                batch.n_tokens = len(chunk)
                for i, (token, pos, seqs, logits) in enumerate(chunk):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, len(seqs)
                    for j, s in enumerate(seqs):
                        batch.seq_id[i][j] = s
                    batch.logits[i] = logits
                if (rc := lc.llama_decode(self.ctx, batch)) != 0:
                    raise RuntimeError(f"llama_decode failed ({rc}) on a batch of {len(chunk)} tokens "
                                       f"(context {self.n_ctx} tokens)")
                for i, e in enumerate(chunk):
                    if e[3]:
                        ptr = lc.llama_get_logits_ith(self.ctx, i)
                        out.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        finally:
            lc.llama_batch_free(batch)
        return out

    @staticmethod
    def _groups(prompts: list[list[int]]) -> list[tuple[list[int], list[int]]]:
        """Runs of equal consecutive prompts: (prompt, the indices of its answers). TRL repeats each
        prompt G times in a row."""
        groups: list[tuple[list[int], list[int]]] = []
        for i, p in enumerate(prompts):
            if groups and groups[-1][0] == p:
                groups[-1][1].append(i)
            else:
                groups.append((list(p), [i]))
        return groups

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: Sampling, *, stop_ids: set[int],
                 decode: Callable[[list[int]], str] | None = None, stop: str | None = None,
                 seed: int = 0) -> Answers:
        """One answer per entry of `prompts` (token ids). An answer ends at a token of `stop_ids`
        (kept), when its text ends with `stop` (kept; needs `decode`), or at `max_tokens`."""
        lc = self.lc
        groups = self._groups(prompts)
        n = len(prompts)
        self._ensure(n, sum(len(p) for p, _ in groups) + n * max_tokens + 1)
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        rng = np.random.default_rng(seed)
        # every prompt once, each token in all of its answers' sequences; logits at each prompt's last token
        entries = [(t, pos, tuple(idx), pos == len(p) - 1) for p, idx in groups for pos, t in enumerate(p)]
        first = self._decode(entries)
        logits = np.stack([first[g] for g, (_, idx) in enumerate(groups) for _ in idx])
        order = [i for _, idx in groups for i in idx]
        start = {i: len(p) for p, idx in groups for i in idx}
        ids: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        active = order
        generated = 0
        while active:
            tokens, lp = sample_rows(logits, sampling, rng)
            still = []
            for i, t, l in zip(active, tokens.tolist(), lp.tolist()):
                ids[i].append(t)
                logps[i].append(l)
                generated += 1
                if t in stop_ids or len(ids[i]) >= max_tokens:
                    continue
                if stop and decode(ids[i][-16:]).rstrip().endswith(stop):
                    continue
                still.append(i)
            active = still
            if active:
                logits = np.stack(self._decode([(ids[i][-1], start[i] + len(ids[i]) - 1, (i,), True) for i in active]))
        return Answers(ids, logps, sum(len(p) for p, _ in groups), generated)

    def score(self, prompts: list[list[int]], answers: list[list[int]], temperature: float) -> list[list[float]]:
        """Each answer token's log-probability under softmax(logits / temperature), teacher-forced."""
        lc = self.lc
        groups = self._groups(prompts)
        self._ensure(len(prompts), sum(len(p) for p, _ in groups) + sum(map(len, answers)) + 1)
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        entries = [(t, pos, tuple(idx), pos == len(p) - 1) for p, idx in groups for pos, t in enumerate(p)]
        first = self._decode(entries)
        out = []
        for g, (p, idx) in enumerate(groups):
            for i in idx:
                a = answers[i]
                rows = [first[g]] + (self._decode([(t, len(p) + k, (i,), True) for k, t in enumerate(a[:-1])])
                                     if len(a) > 1 else [])
                out.append(log_softmax(np.stack(rows), temperature)[np.arange(len(a)), a].tolist())
        return out
