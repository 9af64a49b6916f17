"""Tiny random-weight models + byte-level BPE tokenizers for the offline demo and tests.

Two models, both built on first use by the command that needs them (`GRPO_PLUMBING=1 python
train.py`, `python evaluate.py --model plumbing`, `python train.py demo`) and cached under
~/.cache/ocaml-grpo/:
- the plumbing model (plumbing_model_dir, 186k parameters, Qwen2): fast random weights for the tests
  and benchmarks that exercise the machinery, never expected to write OCaml;
- the learner model (learner_model_dir, 441k parameters, Llama layout with Qwen2's module names):
  the one `python train.py demo` warm-starts with SFT and then improves with GRPO on 2 CPU cores.
  Its tokenizer is trained on the prompts and answers of the bundled set without splitting words
  (lines are its longest tokens), so the prompt's fixed instructions and worked examples cost ~112
  tokens instead of ~540 in Qwen2.5's tokenizer; whole prompts are 154-374 tokens, answers 31-460.
  A model that trains in a fraction of a second per step cannot afford 900-token prompts. The
  tokenizer has seen every bundled text, held-out answers included; the weights learn only from
  what SFT and GRPO train on.

And the shaped models (ensure_shaped_model): a real model's shape (Qwen2.5-Coder-1.5B's, SmolLM2-135M's)
with random weights and the plumbing tokenizer, for the benchmarks that measure speed and memory at
that size without its weights (bench_train, bench_memory).

Nothing is downloaded: tokenizers are trained here with the `tokenizers` library on the problem
texts in data/, then model and tokenizer are saved with save_pretrained, so train.py loads them
through the same `from_pretrained` code path as a real hub model.
"""
from __future__ import annotations

from pathlib import Path

from ocaml_grpo.problems import BUNDLED, TEXT_COLUMNS, read_rows
from ocaml_grpo.prompting import answer_text, user_message

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Same shape as Qwen2.5's template (system default, <|im_start|>role ... <|im_end|>), minus tools.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
VERSION = "1"  # bump when the recipe changes so cached copies are rebuilt
LEARNER_VERSION = "learner-1"
# The learner: hidden 96, 3 layers, 4 heads (2 key/value heads), 2,000-token vocabulary: 441k parameters.
LEARNER_SHAPE = dict(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2)
LEARNER_VOCAB = 2000
# Real models' shapes (their config.json fields the cost depends on), with random weights.
SHAPES = {
    "qwen1.5b-shape": ("Qwen2", "bfloat16", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                                 max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True)),
    "smollm2-shape": ("Llama", "float32", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                               num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                               max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True)),
}
SHAPE_DIRS = {"qwen1.5b-shape": "bench-qwen2.5-1.5b-shape", "smollm2-shape": "bench-smollm2-135m-shape"}


def _corpus() -> list[str]:
    """Problem prompts, tests and solutions from the bundled set, plus a little fixed OCaml so
    the tokenizer never starts empty."""
    texts = ["let rec f x = match x with [] -> 0 | _ :: t -> 1 + f t\n(* END *)\n```ocaml\n```\n"]
    for row in read_rows(BUNDLED):
        texts += [str(row.get(k) or "") for k in TEXT_COLUMNS]
    return texts


def plumbing_model_dir(cache: Path) -> Path:
    """Where the plumbing model is kept, under the project's cache directory (settings.cache_dir)."""
    return Path(cache) / "plumbing-qwen2-tiny"


def learner_model_dir(cache: Path) -> Path:
    return Path(cache) / "demo-learner"


def ensure_plumbing_model(path: str | Path) -> Path:
    """Build the plumbing model once; later calls reuse the cached copy."""
    if not is_built(path):
        print(f"building the plumbing model once into {path}")
        build_plumbing_model(path)
    return Path(path)


def ensure_learner_model(path: str | Path) -> Path:
    """Build the learner model once; later calls reuse the cached copy."""
    if not is_built(path, LEARNER_VERSION):
        print(f"building the demo learner model once into {path}")
        build_learner_model(path)
    return Path(path)


def is_built(path: str | Path, version: str = VERSION) -> bool:
    marker = Path(path) / "demo_version.txt"
    return marker.exists() and marker.read_text().strip() == version


def build_plumbing_model(path: str | Path, vocab_size: int = 1500, seed: int = 0) -> Path:
    """Save a random-weight Qwen2ForCausalLM (hidden 64, 2 layers, 4 heads, 2 kv heads) and
    its tokenizer to `path`. Takes a few seconds."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = _save_tokenizer(path, pre_tokenizers.ByteLevel(add_prefix_space=False), vocab_size, _corpus())
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None)
    return _save_model(path, Qwen2ForCausalLM(config), tokenizer, VERSION)


def _save_tokenizer(path: str | Path, pre_tokenizer, vocab_size: int, corpus: list[str]):
    """Train a byte-level BPE tokenizer on `corpus` with the chat template, save it to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    Path(path).mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], model_max_length=4096)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return tokenizer


def _save_model(path: str | Path, model, tokenizer, version: str) -> Path:
    """Save `model` beside its tokenizer, generation stopping at the end of a turn, then the
    version marker (last: a model without it is rebuilt)."""
    path = Path(path)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    (path / "demo_version.txt").write_text(version + "\n")
    return path


def _learner_corpus() -> list[str]:
    """What the learner will read and write: every bundled prompt as the chat template renders it
    (instructions and worked examples included), the tests, and the answers in the trained format."""
    texts = _corpus()
    for row in read_rows(BUNDLED):
        texts.append(user_message(str(row.get("prompt") or row.get("problem") or "")))
        if row.get("solution"):
            texts.append(answer_text(str(row["solution"])))
    return texts


def build_learner_model(path: str | Path, seed: int = 0) -> Path:
    """Save the random-weight learner (LEARNER_SHAPE, Llama layout) and its tokenizer to `path`.

    The tokenizer splits text only after newlines (a line is the longest token it can learn), so
    a repeated line of the prompt becomes one token, and a prompt ending in a newline (the chat
    template's `assistant` line) tokenizes the same alone and followed by an answer: what SFT
    trains on is exactly what GRPO samples from. Llama, not Qwen2: transformers 5 loads a Qwen2
    checkpoint with Qwen2's own pre-tokenizer regardless of tokenizer.json, which would undo this;
    the projections carry the same names (q_proj ... down_proj), so the LoRA targets are Qwen2's."""
    import torch
    from tokenizers import Regex, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _save_tokenizer(path, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n"), behavior="merged_with_previous"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), LEARNER_VOCAB, _learner_corpus())
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), **LEARNER_SHAPE, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return _save_model(path, LlamaForCausalLM(config), tokenizer, LEARNER_VERSION)



def ensure_shaped_model(name: str, cache: Path) -> Path:
    """`name`'s shape (SHAPES) with random weights (seed 0) and the plumbing tokenizer (ids it does
    not know decode to ''), built once under `cache`."""
    import torch
    import transformers
    from transformers import AutoTokenizer
    arch, dtype, shape = SHAPES[name]
    path = Path(cache) / SHAPE_DIRS[name]
    if not (path / "config.json").exists():
        print(f"building the random {name} model once into {path}", flush=True)
        tok = AutoTokenizer.from_pretrained(ensure_plumbing_model(plumbing_model_dir(Path(cache))))
        config = getattr(transformers, f"{arch}Config")(**shape, bos_token_id=tok.bos_token_id if arch == "Qwen2" else None,
                                                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        getattr(transformers, f"{arch}ForCausalLM")(config).to(getattr(torch, dtype)).save_pretrained(path)
        tok.save_pretrained(path)
    return path
