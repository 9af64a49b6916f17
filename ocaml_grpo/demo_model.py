"""A tiny random-weight Qwen2 model + byte-level BPE tokenizer for the offline demo and tests.

    python -m ocaml_grpo.demo_model PATH      # build it (train.py does this itself under GRPO_DEMO=1)

Nothing is downloaded: the tokenizer is trained here with the `tokenizers` library on the
problem texts in data/, then both are saved with save_pretrained, so train.py loads them
through the same `from_pretrained` code path as a real hub model.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ocaml_grpo.problems import BUNDLED, read_rows

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
DEMO_MODEL_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ocaml-grpo" / "demo-qwen2-tiny"
VERSION = "1"  # bump when the recipe changes so cached copies are rebuilt


def _corpus() -> list[str]:
    """Problem prompts, tests and solutions from the bundled set, plus a little fixed OCaml so
    the tokenizer never starts empty."""
    texts = ["let rec f x = match x with [] -> 0 | _ :: t -> 1 + f t\n(* END *)\n```ocaml\n```\n"]
    for row in read_rows(BUNDLED):
        texts += [str(row.get(k) or "") for k in ("prompt", "problem", "tests", "solution")]
    return texts


def ensure_demo_model(path: str | Path = DEMO_MODEL_DIR) -> Path:
    """Build the demo model once; later calls reuse the cached copy."""
    if not is_built(path):
        print(f"building the demo model once into {path}")
        build_demo_model(path)
    return Path(path)


def is_built(path: str | Path) -> bool:
    marker = Path(path) / "demo_version.txt"
    return marker.exists() and marker.read_text().strip() == VERSION


def build_demo_model(path: str | Path, vocab_size: int = 1500, seed: int = 0) -> Path:
    """Save a random-weight Qwen2ForCausalLM (hidden 64, 2 layers, 4 heads, 2 kv heads) and
    its tokenizer to `path`. Takes a few seconds."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], model_max_length=4096)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    (path / "demo_version.txt").write_text(VERSION + "\n")
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    print(f"demo model saved to {build_demo_model(sys.argv[1])}")
