"""A GRPO run's phases once preflight.py's checks have passed: the model, the output folder and the
reward, the trainer, then the run itself. Importing this loads torch, TRL and the trainer; train.py
does so only when every check has answered.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from accelerate import PartialState
from datasets import Dataset
from transformers import PrinterCallback
from trl import GRPOConfig

from ocaml_grpo.commands.preflight import Data, Fit, Plan
from ocaml_grpo.grading import audit
from ocaml_grpo.models.loading import adapter_base, checkpointing_kwargs, load_model, lora_config
from ocaml_grpo.prompting import END_MARKER, chat_messages
from ocaml_grpo.scoring import make_reward_function
from ocaml_grpo.training import llamacpp, run_dir
from ocaml_grpo.training.callbacks import GracefulStop, KeepAdapters, LearningLog
from ocaml_grpo.training.dynamic_sampling import GroupLog
from ocaml_grpo.training.engines import enable_compiled_generation, engine_kwargs
from ocaml_grpo.training.learning_log import header_lines
from ocaml_grpo.training.repair import RepairRollout, TurnGrades
from ocaml_grpo.training.selection import write_choices
from ocaml_grpo.training.tracking import shared_update
from ocaml_grpo.training.trainer import OcamlGRPOTrainer


@dataclass
class Run:
    """The trainer and what the run's end needs beside it."""
    trainer: OcamlGRPOTrainer
    dataset: Dataset
    log: LearningLog
    stop: GracefulStop
    llama: llamacpp.LlamaEngine | None


def build(plan: Plan, data: Data, fit: Fit) -> Run:
    """The model (with the adapter it continues), the output folder and its logs, the reward, the
    repair turns and the trainer."""
    train, is_main, out_dir, scorer = plan.train, plan.is_main, plan.out_dir, data.scorer
    # `prompt` (chat messages) is what TRL generates from; the other columns go to the reward as kwargs.
    dataset = Dataset.from_list([{"prompt": chat_messages(p.prompt, train.prompt_examples), **p.to_row()} for p in data.kept])

    model = load_model(data.model_dir)
    peft_config = lora_config(train.lora)
    if train.init_adapter:  # continue the SFT adapter instead of starting a fresh one
        from peft import PeftModel
        trained_on = adapter_base(train.init_adapter)
        if trained_on and trained_on not in (train.base_model, data.model_dir):
            print(f"warning: GRPO_INIT_ADAPTER was trained on {trained_on}, BASE_MODEL_ID is {train.base_model}")
        model = PeftModel.from_pretrained(model, train.init_adapter, is_trainable=True)
        peft_config = None
        print(f"starting from the adapter {train.init_adapter} (its LoRA settings apply, not LORA_*)")

    # Every check has passed: only now is the output directory created, an earlier run's files moved
    # aside (a fresh run) and config.json written, by rank 0 before any other process opens its
    # reward logs there (a fresh run would move them aside too). cpu= as the trainer will set it: without
    # it a CPU launch looks single-process and nobody waits.
    tracker = data.tracker
    with PartialState(cpu=not fit.on_gpu).main_process_first():
        if is_main:
            if archive := run_dir.prepare(out_dir, plan.values, resumed=plan.resume_from is not None):
                print(f"  the earlier run's logs and config moved to {archive}")
            if data.audited:
                audit.write_records(data.audited, out_dir)
            if data.selection:
                write_choices(out_dir, data.selection)
            if tracker:
                tracker.open(data.tracking_file)
        # Every process's groups, gathered: the tracker's states, and the kinds of the groups dynamic sampling drops
        group_log = GroupLog() if train.dynamic_sampling else None
        consumers = [c for c in (tracker.update if tracker else None, group_log) if c]
        turn_grades = TurnGrades() if train.repair_turns else None  # each answer's grade, for the first answer's advantage
        reward_fn = make_reward_function(out_dir, max_completion_tokens=train.max_completion,
                                         curriculum=train.curriculum, scorer=scorer,
                                         rank=plan.rank, group_size=train.num_generations,
                                         on_groups=shared_update(*consumers) if consumers else None,
                                         repair_discount=train.repair_discount, on_turn_grades=turn_grades)
    # Repair turns: TRL's rollout_func generates every turn with the trainer's own engine
    # (training/repair.py); the feedback comes from the same grader as the reward.
    rollout = None
    if train.repair_turns:
        rollout = RepairRollout(data.kept, scorer.feedback, train.repair_turns, train.max_completion, data.tokenizer,
                                scorer.pool, train.prompt_examples)
        if is_main:
            print(f"repair turns: up to {train.repair_turns} more answer(s) after feedback; reward x "
                  f"{train.repair_discount:g} per extra turn; episode budget {rollout.budget} completion tokens")
    if train.dynamic_sampling and is_main:
        print(f"dynamic sampling: groups whose rewards' std is below GRPO_LEARNABLE_MIN_STD="
              f"{train.selection.min_std:g} are dropped and replaced, up to {train.dynamic_rounds} more generation "
              "round(s) per step")

    G = train.num_generations
    args = GRPOConfig(
        output_dir=str(out_dir),
        # TRL counts completions per device; the generation batch (this x grad accum) is then a whole
        # number of groups of G, which TRL requires.
        per_device_train_batch_size=train.batch_size * G,
        gradient_accumulation_steps=train.grad_accum_steps,
        num_generations=G,
        max_completion_length=train.max_completion,
        num_train_epochs=train.num_epochs,
        max_steps=train.max_steps,
        learning_rate=train.learning_rate,
        lr_scheduler_type=train.lr_scheduler,
        warmup_steps=train.warmup_ratio,  # transformers 5: a float < 1 is a ratio of total steps
        temperature=train.temperature,
        max_grad_norm=train.max_grad_norm,
        beta=train.beta,
        loss_type=train.loss_type,
        scale_rewards=train.scale_rewards,
        importance_sampling_level="sequence" if train.loss_type == "luspo" else "token",  # luspo is sequence-level
        top_entropy_quantile=train.top_entropy_quantile,
        mask_truncated_completions=train.mask_truncated,
        logging_steps=train.logging_steps,
        save_strategy="steps",
        save_steps=train.save_steps,
        save_total_limit=train.save_total_limit,
        seed=train.seed,
        report_to=[] if train.report_to == "none" else [train.report_to],
        bf16=fit.on_gpu,
        use_cpu=not fit.on_gpu,
        **checkpointing_kwargs(GRPOConfig, fit.on_gpu),  # trades compute for memory; pointless for CPU-sized models
        remove_unused_columns=False,  # the reward needs id/problem/tests/requires/entry_point
        log_completions=False,  # completions go to reward_logs/completions.jsonl instead
        disable_tqdm=True,  # the console shows learning.log's lines and a progress bar (LearningLog) instead
        **engine_kwargs(plan.engine,
                        sequences=train.batch_size * G * train.grad_accum_steps,
                        max_prompt=train.max_prompt, max_completion=train.max_completion,
                        vllm_mode=train.vllm_mode, vllm_gpu_memory=train.vllm_gpu_memory,
                        vllm_server_url=train.vllm_server_url, stop=END_MARKER if train.stop_at_end else None),
    )

    # learning.log and the live health monitor (the rules analyze.py reports with: training/health.py)
    header = header_lines(plan.resume_from, plan.values, len(data.kept), scorer.grader.sandbox.describe())
    stop = GracefulStop()
    log = LearningLog(out_dir / "learning.log", header, resumed=plan.resume_from is not None,
                      auto_stop=train.auto_stop, echo=is_main, stop=stop,
                      curriculum=plan.cfg.reward.weights if train.curriculum else None)
    llama = None
    if plan.engine == "llamacpp":  # the rollouts' engine, over the GGUF file the trainer's weights came from
        llama = llamacpp.LlamaEngine(fit.gguf, threads=len(os.sched_getaffinity(0)), sequences=fit.generation_batch,
                                     context=fit.llama_ctx)
        print(f"generation: llama.cpp over {fit.gguf} ({llama.shape['arch']}, {llama.threads} threads, "
              f"a {llama.n_ctx}-token KV cache shared by {fit.generation_batch} sequences)")
    callbacks = [log, stop, *([KeepAdapters(train.keep_adapters)] if train.keep_adapters else [])]
    trainer = OcamlGRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=dataset,
                               processing_class=data.tokenizer, peft_config=peft_config, callbacks=callbacks,
                               tracker=tracker, rollout_func=rollout, stop=END_MARKER if train.stop_at_end else None,
                               dynamic_rounds=train.dynamic_rounds if train.dynamic_sampling else None,
                               group_log=group_log, min_std=train.selection.min_std, llama=llama,
                               share_prompts=train.shared_prefix, turn_grades=turn_grades)
    if plan.engine == "compiled":
        enable_compiled_generation(trainer)
    trainer.remove_callback(PrinterCallback)  # its ~1,000-character metrics dict per step: LearningLog prints instead
    return Run(trainer, dataset, log, stop, llama)


def run(plan: Plan, data: Data, built: Run) -> int:
    """Train to the end (or to a stop: Ctrl-C, SIGTERM, the stop rules), then save the adapter and
    mark the run finished; the shell status of a run a signal ended."""
    train, is_main, out_dir, trainer, stop = plan.train, plan.is_main, plan.out_dir, built.trainer, built.stop
    if is_main:
        trainer.model.print_trainable_parameters()
    t0 = time.time()
    stop.install()
    try:
        trainer.train(resume_from_checkpoint=plan.resume_from)
    finally:
        data.scorer.close()
        if built.llama:
            built.llama.close()
        if data.tracker:
            data.tracker.close()
    if data.tracker and is_main:
        counts = data.tracker.counts(built.dataset["id"])
        print("problem states at the end: " + "  ".join(f"{k}={n}" for k, n in counts.items()))
    state = trainer.state
    if stop.requested and state.global_step < state.max_steps:  # this step's checkpoint is saved; the adapter is not final
        if is_main:
            print(f"stopped by {stop.requested} at step {state.global_step}: checkpoint saved in "
                  f"{out_dir / f'checkpoint-{state.global_step}'}; logs in {out_dir / 'learning.log'}.\n"
                  "Resume with the same command (GRPO_RESUME=auto, the default).")
        return 128 + stop.signum  # the shell's status for a command a signal ended
    final_dir = out_dir / "final_adapter"
    trainer.save_model(str(final_dir))  # PEFT model: saves the adapter only
    if is_main:
        data.tokenizer.save_pretrained(str(final_dir))
        why = ("the stop criteria" if built.log.stopped_by_rule
               else f"GRPO_MAX_STEPS={train.max_steps}" if train.max_steps > 0
               else f"GRPO_NUM_EPOCHS={train.num_epochs}")
        run_dir.mark_finished(out_dir, state.global_step, state.epoch or 0.0, why, plan.values)
        print(f"done in {time.time() - t0:.0f}s: finished at step {state.global_step} ({why}); adapter in {final_dir}; "
              f"logs in {out_dir / 'learning.log'}")
        print(f"merge with: python train.py merge {final_dir} {out_dir / 'merged'}")
    return 0
