"""What one decoder layer saves for its backward pass, counted, against the estimate's count.

    python -m bench.saved_activations qwen2.5-coder-0.5b-instruct      # a named model (converted once)
    python -m bench.saved_activations MODEL_FOLDER --tokens 256,512

memory.py's activation term is ModelShape.saved_per_token (values a layer with LoRA saves per
token) x tokens x layers x a factor fitted to measured peaks. This checks the count itself: the
model's config with 1 and then 2 layers, random weights, LoRA r 8 on the 7 projections (dropout
0.05, training mode, as a GRPO run), one forward of 2 sequences under torch's saved-tensor hooks;
the bytes of the distinct storages saved, 2 layers minus 1, is one layer's. A layer also saves its
frozen weights (F.linear keeps them for the input's gradient), a constant the estimate counts
under "weights"; two token counts separate it from the per-token slope. Light: seconds on a CPU.
"""
from __future__ import annotations

import argparse
import os
import sys

from ocaml_grpo.config.grpo import LoRA
from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.models.named import resolve_model
from ocaml_grpo.commands import memory

MODULES = LoRA().target_modules.split(",")  # the default LORA_TARGET_MODULES


def saved_bytes(folder: str, layers: int, tokens: int, sequences: int = 2) -> int:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(folder)
    cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=MODULES, task_type="CAUSAL_LM"))
    model.train()
    storages: dict[int, int] = {}

    def keep(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    ids = torch.randint(0, cfg.vocab_size, (sequences, tokens))
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(input_ids=ids, output_hidden_states=True)
    return sum(storages.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a named model or a model folder")
    ap.add_argument("--tokens", default="256,512", help="two sequence lengths")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    folder = str(resolve_model(args.model, cache_dir(os.environ)))
    t1, t2 = (int(t) for t in args.tokens.split(","))
    per_layer = {t: saved_bytes(folder, 2, t) - saved_bytes(folder, 1, t) for t in (t1, t2)}
    slope = (per_layer[t2] - per_layer[t1]) / (2 * (t2 - t1)) / 4  # fp32 values per token
    constant = per_layer[t1] - slope * 4 * 2 * t1
    counted = memory.read_shape(folder).saved_per_token(MODULES)
    print(f"{args.model}: one layer saves {slope:,.0f} values per token (+ {constant / 1e6:.1f} MB whatever the "
          f"length: its frozen weights); the estimate counts {counted:,} ({counted / slope - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
