"""Training's floor on this CPU: the forward and backward of one GRPO step alone, fp32 against bf16
autocast, TRL's forward against the shared-prefix one (training/shared_prefix.py).

    python -m bench.bench_floor                                   # Qwen2.5-Coder-0.5B, 2 prompts x 4 answers
    python -m bench.bench_floor --model smollm2-135m-instruct --repeats 2 --json OUT.json

The batch is a GRPO step's shape: `--prompts` bundled prompts (no worked examples) x `--generations`
answers of the lengths a 0.5B step generated (bench/results/cpu_engine.json: 648 tokens a step,
some at the 256-token budget), their tokens drawn at random (content does not change the cost).
LoRA r=32 on every projection, B away from zero so every LoRA weight has a gradient, TRL's fused
LM head (temperature 0.8), a loss that weighs every answer token. Each variant runs `--repeats`
times after a warm-up; the table gives the best time and how far the loss and the LoRA gradients are
from TRL's fp32 forward (the reference), as the largest relative difference of any tensor's norm
and the cosine of the whole gradient.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.models.loading import quiet_library_warnings
from ocaml_grpo.models.named import resolve_model
from ocaml_grpo.problems import load_problems
from ocaml_grpo.prompting import chat_messages
from ocaml_grpo.training.shared_prefix import logps_and_entropies

ANSWER_LENGTHS = [256, 112, 64, 210, 96, 256, 41, 120]  # tokens: a spread like a 0.5B step's


def build_batch(tokenizer, prompts: int, generations: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """TRL's layout: prompts left-padded, answers right-padded to the longest."""
    problems = load_problems("bundled")[:prompts]
    g = torch.Generator().manual_seed(0)
    ids = [list(tokenizer.apply_chat_template(chat_messages(p.prompt, 0), add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"]) for p in problems]
    lengths = [ANSWER_LENGTHS[i % len(ANSWER_LENGTHS)] for i in range(prompts * generations)]
    width, prompt_width = max(lengths), max(map(len, ids))
    rows, masks = [], []
    for i, n in enumerate(lengths):
        p = ids[i // generations]
        row = torch.full((prompt_width + width,), tokenizer.pad_token_id)
        mask = torch.zeros_like(row)
        row[prompt_width - len(p):prompt_width], mask[prompt_width - len(p):prompt_width] = torch.tensor(p), 1
        row[prompt_width:prompt_width + n] = torch.randint(100, 20000, (n,), generator=g)
        mask[prompt_width:prompt_width + n] = 1
        rows.append(row)
        masks.append(mask)
    return torch.stack(rows), torch.stack(masks), width


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs after the warm-up (at least 1)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    quiet_library_warnings()
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.utils import add_fused_lm_head

    folder = resolve_model(a.model, cache_dir(os.environ))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.01)
    ids, mask, keep = build_batch(tokenizer, a.prompts, a.generations)
    answer = mask[:, -keep:].float()
    weights = torch.linspace(-1, 1, answer.numel()).view_as(answer)

    def standard():
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :-keep] = -100
        return model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs[:, -keep:]

    def shared():
        return logps_and_entropies(model, ids, mask, keep, tokenizer.pad_token_id)[0]

    def step(forward, bf16: bool):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logps = forward()
        loss = (logps.float() * weights * answer).sum() / answer.sum()
        loss.backward()
        return loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}

    variants = {"fp32, TRL's forward": (standard, False), "fp32, shared prefix": (shared, False),
                "bf16 autocast, TRL's forward": (standard, True), "bf16 autocast, shared prefix": (shared, True)}
    tokens = {"prompt": int(mask[:, :-keep].sum()), "answer": int(answer.sum()), "with_padding": ids.numel()}
    results, reference = {}, None
    print(f"{a.model}: {a.prompts} prompts x {a.generations} answers, {tokens['prompt']} prompt + {tokens['answer']} "
          f"answer tokens ({tokens['with_padding']} with padding); torch threads {torch.get_num_threads()}", flush=True)
    for name, (forward, bf16) in variants.items():
        step(forward, bf16)  # warm-up
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            loss, grads = step(forward, bf16)
            times.append(time.perf_counter() - t0)
        if reference is None:
            reference = (loss, grads)
        ref_loss, ref_grads = reference
        flat, ref_flat = (torch.cat([g[n].double().flatten() for n in sorted(ref_grads)]) for g in (grads, ref_grads))
        rel = max(((grads[n] - ref_grads[n]).norm() / ref_grads[n].norm()).item() for n in ref_grads)
        results[name] = {"fwd_bwd_s": min(times), "times_s": times, "loss": loss, "loss_rel_diff": abs(loss - ref_loss) / abs(ref_loss),
                         "grad_max_rel_diff": rel,
                         "grad_cosine": torch.nn.functional.cosine_similarity(flat, ref_flat, dim=0).item()}
        r = results[name]
        print(f"{name:<30} {r['fwd_bwd_s']:7.1f} s  loss {loss:+.6f} (rel diff {r['loss_rel_diff']:.1e})  "
              f"grads: max rel diff {rel:.1e}, cosine {r['grad_cosine']:.6f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "prompts": a.prompts, "generations": a.generations,
                                            "tokens": tokens, "threads": torch.get_num_threads(),
                                            "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
