"""Loading the models the commands train and sample, and folding an adapter into its base: one
way to pick the dtype, pad the tokenizer, configure LoRA and merge (train.py, `train.py sft`,
`train.py merge`, evaluate.py, the demo).

torch, transformers and peft are imported inside the functions, so importing this module costs
nothing (`train.py --help` and config errors answer in a second).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping


def load_tokenizer(path: str | Path, padding_side: str | None = None):
    """The tokenizer, with the end-of-sequence token as padding when it has none."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if padding_side:
        tokenizer.padding_side = padding_side
    return tokenizer


def load_model(path: str | Path, fp32: bool = False):
    """A causal LM in bf16 on a GPU, in fp32 on a CPU (or when asked): TRL's bf16 default runs
    ~5x slower on CPUs without bf16 units."""
    import torch
    from transformers import AutoModelForCausalLM
    dtype = torch.bfloat16 if torch.cuda.is_available() and not fp32 else torch.float32
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)


def lora_config(cfg: Mapping[str, Any]):
    """The LoRA adapter the LORA_* settings describe."""
    from peft import LoraConfig
    return LoraConfig(r=cfg["LORA_R"], lora_alpha=cfg["LORA_ALPHA"], lora_dropout=cfg["LORA_DROPOUT"],
                      bias=cfg["LORA_BIAS"], target_modules=cfg["LORA_TARGET_MODULES"].split(","),
                      task_type="CAUSAL_LM")


def adapter_base(adapter_dir: str | Path) -> str | None:
    """The base model an adapter was trained on, as its adapter_config.json records it."""
    return json.loads((Path(adapter_dir) / "adapter_config.json").read_text()).get("base_model_name_or_path")


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path, fp32: bool = False) -> Path:
    """Fold a LoRA adapter into its base model and save the result with its tokenizer (the
    adapter's when it was saved with one), so it loads without peft (vLLM, llama.cpp export)."""
    from peft import PeftModel
    from transformers import AutoTokenizer
    base = adapter_base(adapter_dir)
    merged = PeftModel.from_pretrained(load_model(base, fp32), str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out_dir))
    has_tokenizer = (Path(adapter_dir) / "tokenizer_config.json").exists()
    AutoTokenizer.from_pretrained(str(adapter_dir) if has_tokenizer else base).save_pretrained(str(out_dir))
    return Path(out_dir)
