"""The SFT warm start: `python train.py sft`.

A base model that cannot yet produce the answer format hands GRPO groups whose completions all
score the same (frac_zero_std near 1): no advantage, no signal. The standard fix is a short
supervised stage on problems that carry reference solutions (the bundled set does), so GRPO
starts from a policy that is sometimes right.

- Prompt: exactly what GRPO sees (`prompting.chat_messages`, the chat template's generation
  prompt); answer: the reference solution in an ```ocaml block, then the END marker, then the
  template's end of turn. TRL's SFTTrainer trains on the answer tokens only (completion-only loss).
- A held-out split (SFT_HOLDOUT) is never trained on: its loss is reported before and after,
  and its problems are written to heldout_problems.jsonl so GRPO and evaluate.py can leave them out.
- Problems whose prompt or answer does not fit GRPO_MAX_PROMPT / GRPO_MAX_COMPLETION tokens are
  skipped: GRPO could not use them either.
- Output (SFT_OUTPUT_DIR): final_adapter/ (SFT_LORA=1; continue it in GRPO with
  GRPO_INIT_ADAPTER=that dir) or final_model/ (SFT_LORA=0; a full model, GRPO starts from it with
  BASE_MODEL_ID=that dir), both with the tokenizer; train_problems.jsonl, heldout_problems.jsonl,
  split.json, sft_log.jsonl (one line per log step) and config.json.

This module imports torch/TRL only inside `run`, so `--help` and config errors cost no import.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

from dotenv import load_dotenv

from ocaml_grpo.models.loading import quiet_library_warnings
from ocaml_grpo.jsonl import append
from ocaml_grpo.models.loading import go_offline_unless_needed, load_model, load_tokenizer, lora_config, model_error
from ocaml_grpo.problems import DatasetError, load_problems
from ocaml_grpo.prompting import answer_text, chat_messages, prompt_token_count
from ocaml_grpo.config import RETIRED, SFT_SETTINGS, VARIABLES, Config, recorded, resolve
from ocaml_grpo.config.settings import cache_dir, describe, unknown_variables
from ocaml_grpo.models.named import resolve_model
from ocaml_grpo.training.run_dir import write_adapter_readme


def split_problems(problems: list, holdout, seed: int) -> tuple[list, list]:
    """(train, held out) among problems with a reference solution; the held-out draw uses `seed`."""
    if isinstance(holdout, list):
        unknown = sorted(set(holdout) - {p.id for p in problems})
        if unknown:
            raise ValueError(f"SFT_HOLDOUT names problems that have no reference solution or are not in the set: "
                             f"{unknown[:5]}")
        held = set(holdout)
    else:
        n = holdout if isinstance(holdout, int) else (max(1, round(holdout * len(problems))) if holdout > 0 else 0)
        if n >= len(problems):
            raise ValueError(f"SFT_HOLDOUT={holdout} leaves no problem to train on ({len(problems)} with solutions)")
        held = {p.id for p in random.Random(seed).sample(problems, n)}
    return [p for p in problems if p.id not in held], [p for p in problems if p.id in held]


def write_problems(path: Path, problems: list) -> None:
    path.write_text("".join(json.dumps({**asdict(p)}, ensure_ascii=False) + "\n" for p in problems), encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.rsplit("\n\n", 1)[0] + "\n\nEnvironment variables (default: meaning; accepted values):")
        print(describe(SFT_SETTINGS))
        return 0
    if argv:
        print(f"unknown argument {argv[0]!r}; see python train.py sft --help", file=sys.stderr)
        return 2
    load_dotenv(".envrc", override=False)  # environment > ./.envrc > defaults, as train.py resolves its own
    cfg, errors = resolve(os.environ, SFT_SETTINGS)
    errors += unknown_variables(os.environ, VARIABLES, RETIRED)
    if errors:
        print("config error:\n  " + "\n  ".join(errors) + "\nSee python train.py sft --help", file=sys.stderr)
        return 2
    if note := go_offline_unless_needed([cfg.train.base_model], cfg.train.dataset, os.environ):
        print(note)  # before the libraries are imported: they read HF_HUB_OFFLINE once
    try:
        problems = load_problems(cfg.train.dataset)
    except DatasetError as e:
        print(f"dataset error: {e}", file=sys.stderr)
        return 2
    with_solution = [p for p in problems if p.solution.strip()]
    if not with_solution:
        print(f"dataset error: {cfg.train.dataset} has no `solution` column with reference solutions; "
              "SFT needs them (the bundled set has them: TRAINING_DATASET=bundled)", file=sys.stderr)
        return 2
    if error := model_error("BASE_MODEL_ID", cfg.train.base_model, os.environ):
        print(f"config error:\n  {error}\nSee python train.py sft --help", file=sys.stderr)
        return 2
    try:
        train, held = split_problems(with_solution, cfg.sft.holdout, cfg.train.seed)
    except ValueError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    return run(cfg, train, held, skipped_no_solution=len(problems) - len(with_solution))


def run(cfg: Config, train: list, held: list, skipped_no_solution: int) -> int:

    import torch
    quiet_library_warnings()
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer


    out = Path(cfg.sft.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    values = recorded(cfg, SFT_SETTINGS)
    width = max(map(len, values))
    print("sft config:\n" + "\n".join(f"  {k.ljust(width)} = {v}" for k, v in values.items()))
    (out / "config.json").write_text(json.dumps(values, indent=2) + "\n")
    # A named model or a .gguf file is converted once into the cache (models/named.py).
    model_dir = resolve_model(cfg.train.base_model, cache_dir(os.environ))
    tokenizer = load_tokenizer(model_dir)

    def fits(p) -> str | None:
        if prompt_token_count(tokenizer, p.prompt, cfg.train.prompt_examples) > cfg.train.max_prompt:
            return f"prompt longer than GRPO_MAX_PROMPT={cfg.train.max_prompt} tokens"
        # +1: the end-of-turn token the model must also learn to emit
        if len(tokenizer(answer_text(p.solution), add_special_tokens=False)["input_ids"]) + 1 > cfg.train.max_completion:
            return f"answer longer than GRPO_MAX_COMPLETION={cfg.train.max_completion} tokens"
        return None

    skipped = {p.id: why for p in train + held if (why := fits(p))}
    train = [p for p in train if p.id not in skipped]
    held = [p for p in held if p.id not in skipped]
    write_problems(out / "train_problems.jsonl", train)
    write_problems(out / "heldout_problems.jsonl", held)
    (out / "split.json").write_text(json.dumps({"train": [p.id for p in train], "heldout": [p.id for p in held],
                                                "skipped": skipped}, indent=2) + "\n")
    print(f"sft data: {len(train)} problems to train on, {len(held)} held out (never trained on), "
          f"{len(skipped)} skipped (too long for GRPO), {skipped_no_solution} without a reference solution")
    if not train:
        print("dataset error: no problem left to train on", file=sys.stderr)
        return 2

    def rows(ps):
        return Dataset.from_list([{"prompt": chat_messages(p.prompt, cfg.train.prompt_examples),
                                   "completion": [{"role": "assistant", "content": answer_text(p.solution)}]}
                                  for p in ps])

    on_gpu = torch.cuda.is_available()
    model = load_model(model_dir)
    peft_config = lora_config(cfg.train.lora) if cfg.sft.lora else None
    # The held-out evaluation logs before training begins, when TensorBoard's writer would still
    # default to ./runs/ in the working directory: keep its events in the output directory.
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(out / "tensorboard"))
    args = SFTConfig(
        output_dir=str(out / "trainer"),
        num_train_epochs=cfg.sft.epochs, max_steps=cfg.sft.max_steps,
        per_device_train_batch_size=cfg.sft.batch_size, per_device_eval_batch_size=cfg.sft.batch_size,
        gradient_accumulation_steps=cfg.sft.grad_accum_steps, learning_rate=cfg.sft.learning_rate,
        lr_scheduler_type=cfg.sft.lr_scheduler, warmup_steps=cfg.sft.warmup_ratio,
        max_grad_norm=cfg.train.max_grad_norm, logging_steps=cfg.train.logging_steps, seed=cfg.train.seed,
        completion_only_loss=True, max_length=None,  # lengths were checked against the GRPO budgets above
        save_strategy="no", eval_strategy="no",
        report_to=[] if cfg.train.report_to == "none" else [cfg.train.report_to],
        bf16=on_gpu, use_cpu=not on_gpu,  # TRL defaults to bf16, which CPUs without bf16 units run ~5x slower
        disable_tqdm=True)
    log_path = out / "sft_log.jsonl"

    class Log(TrainerCallback):
        """One JSON line per log step, a readable line on stdout, and SFT_STOP_LOSS."""
        def on_train_begin(self, args, state, control, **kw):
            log_path.write_text("")

        def on_log(self, args, state, control, logs=None, **kw):
            logs = dict(logs or {})
            if "loss" not in logs:
                return control
            rec = {"step": state.global_step, "epoch": round(state.epoch or 0.0, 4), **logs}
            append(log_path, [rec])
            print(f"[SFT step {state.global_step}]  loss={float(logs['loss']):.4f}  "
                  f"token_acc={float(logs.get('mean_token_accuracy', float('nan'))):.3f}  "
                  f"lr={float(logs.get('learning_rate', 0)):.2e}", flush=True)
            if cfg.sft.stop_loss and float(logs["loss"]) < cfg.sft.stop_loss:
                print(f"[SFT] loss {float(logs['loss']):.4f} < SFT_STOP_LOSS={cfg.sft.stop_loss}: stopping at step "
                      f"{state.global_step}", flush=True)
                control.should_training_stop = True
            return control

    trainer = SFTTrainer(model=model, args=args, train_dataset=rows(train),
                         eval_dataset=rows(held) if held else None, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[Log()])
    trainer.remove_callback(PrinterCallback)  # Log prints a readable line per step instead of the raw dict
    held_before = trainer.evaluate()["eval_loss"] if held else None
    t0 = time.time()
    result = trainer.train()
    held_after = trainer.evaluate()["eval_loss"] if held else None
    final = out / ("final_adapter" if cfg.sft.lora else "final_model")
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    write_adapter_readme(final, f"Trained by `python train.py sft` in {out.resolve()} (sft_summary.json, sft_log.jsonl).")
    summary = {"steps": result.global_step, "train_loss": result.training_loss, "seconds": round(time.time() - t0, 1),
               "heldout_loss_before": held_before, "heldout_loss_after": held_after, "output": str(final)}
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"sft done: {result.global_step} steps in {summary['seconds']}s -> {final}")
    if held:
        print(f"held-out loss ({len(held)} problems, never trained on): {held_before:.4f} before, {held_after:.4f} after")
    start = (f"GRPO_INIT_ADAPTER={final} BASE_MODEL_ID={cfg.train.base_model}" if cfg.sft.lora
             else f"BASE_MODEL_ID={final}")
    if cfg.train.prompt_examples != 3:  # GRPO must build the prompt SFT trained on
        start += f" GRPO_PROMPT_EXAMPLES={cfg.train.prompt_examples}"
    print(f"GRPO from here: {start} TRAINING_DATASET={out / 'train_problems.jsonl'} python train.py")
    return 0
