"""GRPO + LoRA training of a small code model to write OCaml, rewarded by compiling and testing.

Modes:
    python train.py                        # train (GRPO) with the config below (env vars / .envrc override)
    python train.py --help                 # every variable, its default and meaning (no torch import)
    python train.py --check [--gpu GB]     # the run's peak memory, estimated, beside what the device has; no training
    python train.py sft                    # SFT warm start on reference solutions (python train.py sft --help)
    python train.py demo                   # offline demo that learns: SFT warm start, GRPO, before/after table
    python train.py merge grpo_runs/final_adapter merged_model   # fold the LoRA adapter into a standalone model
    python train.py model qwen2.5-coder-0.5b-instruct          # verify and convert a named model once (make model-qwen05)

    GRPO_PLUMBING=1 python train.py        # the plumbing run: tiny random Qwen2, bundled problems, CPU, ~1 min
    GRPO_RESUME=never python train.py      # start over even if the output dir has checkpoints
    accelerate launch train.py             # several GPUs; only the main process writes logs

Outputs (GRPO_OUTPUT_DIR, default grpo_runs/):
    config.json                              resolved config, keys = env var names
    metrics.jsonl                            the record of every log step (pandas: pd.read_json(path, lines=True))
    learning.log                             the same as text: a metric line per log step + [Health]/[Stop] lines (also on the console)
    reward_logs/completions.jsonl            every completion with its reward
    reward_logs/syntax_aware_breakdown.jsonl the reward split into structural/type/compile/tests
    reward_logs/problem_tracking.jsonl       each GRPO group's kind and its problem's state (GRPO_TRACK_PROBLEMS)
    problem_selection.jsonl                  kept/dropped problems with the reason (GRPO_PROBLEM_STATS)
    checkpoint-*/                            every GRPO_SAVE_STEPS; GRPO_RESUME=auto picks up the last
    final_adapter/                           the LoRA adapter (+ tokenizer) at the end
    finished.json                            where and why the run ended; the same command then trains nothing
    previous_runs/<time>/                    an earlier run's logs and config.json, moved aside by a fresh run

Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint and stops; run the same command
to resume from it. A second Ctrl-C stops at once (the last checkpoint is kept).

Config precedence: process environment > GRPO_PLUMBING defaults > ./.envrc > the defaults defined in
ocaml_grpo/config/ (grpo.py the trainer's, scoring.py the reward's, isolation.py the sandbox's);
`--help` lists them.
"""
import atexit
import gc
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from dotenv import load_dotenv

# None of these imports torch: --help, a config error or a missing toolchain answer in a second.
import rewards
from ocaml_grpo.config import (AUDIT_SETTINGS, PLUMBING_DEFAULTS, REWARD_SETTINGS, RETIRED, SANDBOX_SETTINGS, SETTINGS,
                               VARIABLES, SftConfig, TrainConfig, recorded, resolve)
from ocaml_grpo.config.settings import cache_dir, describe, settings_of, unknown_variables
from ocaml_grpo.grading import audit
from ocaml_grpo.grading.toolcache import ToolchainError
from ocaml_grpo.problems import DatasetError, load_problems
from ocaml_grpo.prompting import END_MARKER, chat_messages, prompt_token_count
from ocaml_grpo.training import demo as demo_command
from ocaml_grpo.training import run_dir
from ocaml_grpo.training import sft as sft_command
from ocaml_grpo.training import llamacpp
from ocaml_grpo.training.engines import choose_engine, compile_problem, engine_variable, enable_compiled_generation, engine_kwargs
from ocaml_grpo.reward.group_kinds import TRACKING_FILE
from ocaml_grpo.training.tracker import ProblemTracker
from ocaml_grpo.training.learning_log import header_lines
from ocaml_grpo.training import memory
from ocaml_grpo.training.repair import RepairRollout, rollout_budget
from ocaml_grpo.models.loading import adapter_base, checkpointing_kwargs, go_offline_unless_needed, load_model, load_tokenizer, \
    lora_config, merge_adapter, model_error, quiet_library_warnings
from ocaml_grpo.models import named as named_models
from ocaml_grpo.models.named import converted_folder, resolve_model
from ocaml_grpo.training.selection import apply_selection, write_choices
from ocaml_grpo.models.tiny import ensure_plumbing_model, plumbing_model_dir

# The interpreter's last garbage collections walk torch's, transformers' and datasets' object graphs
# for ~1.7 s at exit. Nothing needs them: our logs are written with os.write, the libraries save
# with `with` blocks. Freezing the heap at exit skips them.
atexit.register(gc.freeze)
PLUMBING_MODEL_DIR = plumbing_model_dir(cache_dir(os.environ))  # the plumbing run's model (GRPO_PLUMBING=1)


def fail(message: str) -> int:
    """sys.exit(message) as main's return value: the message on stderr, status 1."""
    print(message, file=sys.stderr)
    return 1


def model_folder(model_id: str) -> str:
    """The folder `model_id` loads from, found without converting anything (named_models.resolve_model's rule)."""
    folder = converted_folder(model_id, cache_dir(os.environ))
    return str(folder) if folder else model_id


def adapter_shape(lora, init_adapter: str) -> dict:
    """The adapter a run trains, as peft's adapter_config.json records it: GRPO_INIT_ADAPTER's own, else LORA_*'s."""
    if init_adapter:
        saved = json.loads((Path(init_adapter) / "adapter_config.json").read_text())
        return {"r": saved.get("r"), "lora_alpha": saved.get("lora_alpha"),
                "target_modules": sorted(saved.get("target_modules") or []), "bias": saved.get("bias")}
    return {"r": lora.r, "lora_alpha": lora.alpha, "target_modules": sorted(lora.target_modules.split(",")), "bias": lora.bias}


def llamacpp_errors(train) -> list[str]:
    """Why GRPO_ENGINE=llamacpp cannot run this config (before any model loads): what llamacpp.run_errors
    finds, the plumbing model (no GGUF file), LoRA on a module llama.cpp's adapter has no tensor for."""
    if train.plumbing and train.base_model == str(PLUMBING_MODEL_DIR):
        return ["GRPO_ENGINE=llamacpp: the plumbing run's tiny model has no GGUF file; set BASE_MODEL_ID to a "
                "GGUF model (e.g. smollm2-135m-instruct, `make model`)"]
    if why := llamacpp.missing():
        return [f"GRPO_ENGINE=llamacpp but {why}; or choose another engine (GRPO_ENGINE=default)"]
    errors = [f"GRPO_ENGINE=llamacpp: {e}" for e in llamacpp.run_errors(train.base_model, train.init_adapter or None,
                                                                          cache_dir(os.environ))]
    modules = adapter_shape(train.lora, train.init_adapter)["target_modules"]
    if odd := sorted(set(modules) - set(llamacpp.GGUF_MODULES)):
        errors.append(f"GRPO_ENGINE=llamacpp: LoRA on {', '.join(odd)}, which llama.cpp's adapter has no tensor for "
                      f"(LORA_TARGET_MODULES: any of {','.join(llamacpp.GGUF_MODULES)})")
    return errors


def main(argv: list[str]) -> int:
    # ------------------------------------------------------------------------- modes
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print("Environment variables (default: meaning; accepted values):")
        print("The trainer's (ocaml_grpo/config/grpo.py):")
        print(describe(settings_of(TrainConfig)))
        print(f"  GRPO_PLUMBING=1 sets: {' '.join(f'{k}={v}' for k, v in PLUMBING_DEFAULTS.items())} "
              f"BASE_MODEL_ID={PLUMBING_MODEL_DIR}")
        print("The reward's (ocaml_grpo/config/scoring.py):")
        print(describe(REWARD_SETTINGS))
        print("The dataset audit's (ocaml_grpo/config/grpo.py):")
        print(describe(AUDIT_SETTINGS))
        print("The sandbox's (ocaml_grpo/config/isolation.py):")
        print(describe(SANDBOX_SETTINGS))
        print("python train.py sft also reads (python train.py sft --help): "
              + " ".join(s.name for s in settings_of(SftConfig)))
        return 0
    if argv and argv[0] == "sft":  # the SFT warm start: ocaml_grpo/training/sft.py
        return sft_command.main(argv[1:])
    if argv and argv[0] == "demo":  # SFT warm start + GRPO + before/after table: ocaml_grpo/training/demo.py
        return demo_command.main(argv[1:])
    if argv and argv[0] == "model":  # a named model, installed, verified and converted once: ocaml_grpo/models/named.py
        return named_models.main(argv[1:], cache_dir(os.environ))
    if argv and argv[0] == "merge":
        # Fold a LoRA adapter into its base model so it loads without peft (e.g. for vLLM / llama.cpp export).
        if len(argv) != 3:
            return fail("usage: python train.py merge ADAPTER_DIR OUT_DIR")
        adapter_dir, merged_dir = argv[1], argv[2]
        if not (Path(adapter_dir) / "adapter_config.json").is_file():
            return fail(f"merge: {adapter_dir} is not a LoRA adapter (no adapter_config.json there); "
                        "e.g. python train.py merge grpo_runs/final_adapter merged_model")
        merge_adapter(adapter_dir, merged_dir)
        print(f"merged {adapter_dir} into {adapter_base(adapter_dir)} -> {merged_dir}")
        return 0
    # --check: everything up to the memory estimate, then stop (nothing written to the output folder).
    # --gpu GB sizes a GPU run on a machine without that GPU: bf16, checkpointing, GB free.
    check, gpu_gb = bool(argv) and argv[0] == "--check", None
    if check:
        argv = argv[1:]
        if argv[:1] == ["--gpu"]:
            try:
                gpu_gb, argv = float(argv[1]), argv[2:]
            except (IndexError, ValueError):
                return fail("usage: python train.py --check [--gpu GB]  (GB: the GPU's free memory, e.g. 80)")
    if argv:
        return fail(f"unknown argument {argv[0]!r}; see python train.py --help")

    # ------------------------------------------------------------------------- config
    # Every variable is defined once, in ocaml_grpo/config/, with its default, parser and meaning.
    # Remember what the user exported before .envrc fills gaps, so the plumbing run can tell them apart.
    user_set = set(os.environ)
    load_dotenv(".envrc", override=False)  # python-dotenv understands `export KEY=value` lines
    plumbing = os.environ.get("GRPO_PLUMBING", "0") == "1"
    if plumbing:
        for k, v in {**PLUMBING_DEFAULTS, "BASE_MODEL_ID": str(PLUMBING_MODEL_DIR)}.items():
            if k not in user_set:
                os.environ[k] = v
    # The trainer's, the reward's, the sandbox's and the audit's settings, validated together;
    # config.json records them all.
    cfg, errors = resolve(os.environ, SETTINGS)
    errors += unknown_variables(os.environ, VARIABLES, RETIRED)
    train = cfg.train
    # The generation engine: GRPO_ENGINE, or one of its older flags. Asked for but missing must stop here,
    # with the way to get it.
    engine, why = choose_engine(train)
    errors += [why] if why else []
    asked = engine_variable(train, engine)  # the variable that chose it, for the messages
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        errors.append(f"{asked} but vLLM is not installed: `pip install -r requirements-vllm.txt` on a CUDA machine "
                      "(server mode also needs `trl vllm-serve --model $BASE_MODEL_ID` running), or choose another engine")
    if train.stop_at_end and engine == "paged":
        errors.append(f"GRPO_STOP_AT_END=1 and {asked}: continuous batching cannot stop an answer at "
                      "the END marker; set GRPO_STOP_AT_END=0, or choose another engine")
    if engine == "llamacpp":
        errors += llamacpp_errors(train)
    if train.keep_adapters % train.save_steps:
        errors.append(f"GRPO_KEEP_ADAPTERS={train.keep_adapters} copies a checkpoint's adapter, so it must be a multiple "
                      f"of GRPO_SAVE_STEPS={train.save_steps}")
    # (the one check here that loads torch: compiling a one-line function, only when asked for)
    if engine == "compiled" and not errors and (problem := compile_problem()):
        errors.append(f"{asked} but torch.compile cannot build kernels here ({problem}): install a "
                      "C compiler (apt-get install -y gcc g++), or choose another engine")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and importlib.util.find_spec("deepspeed") is None:
        errors.append("the accelerate config asks for DeepSpeed (configs/zero*.yaml) but it is not installed: "
                      "`pip install deepspeed`, or launch without --config_file configs/zero*.yaml")
    # Only rank 0 writes learning.log, config and checkpoints; each rank logs the completions it
    # scored. accelerate/torchrun set RANK for every process.
    rank = int(os.environ.get("RANK", "0"))
    is_main = rank == 0
    out_dir = Path(train.output_dir)
    plumbing_model = plumbing and train.base_model == str(PLUMBING_MODEL_DIR)
    if not errors:
        # A run that needs nothing from the hub says so to the libraries, which otherwise retry it for
        # 25-50 s on an offline machine; one that needs it and cannot reach it finds out in seconds.
        if note := go_offline_unless_needed([train.base_model], train.dataset, os.environ):
            print(note)
        if not plumbing_model:  # built on first use, below
            errors += [e for e in [model_error("BASE_MODEL_ID", train.base_model, os.environ)] if e]
        errors += [e for e in [run_dir.write_error(out_dir)] if e]
    if errors:
        return fail("config error:\n  " + "\n  ".join(errors) + "\nSee python train.py --help")
    if train.report_to != "none" and importlib.util.find_spec(train.report_to) is None:
        print(f"note: GRPO_REPORT_TO={train.report_to} but that package is not installed; reporting to learning.log only")
        train.report_to = "none"
    values = recorded(cfg)  # by variable name: config.json, the console, learning.log's header

    resume_from = None
    if train.resume == "auto":
        last = run_dir.last_checkpoint(out_dir)
        resume_from = str(last) if last else None
    elif train.resume != "never":
        resume_from = train.resume
    # A checkpoint of another model (or LoRA shape) would fail to load only after the folder had
    # been changed: it is refused here, before anything is written.
    if resume_from and (why := run_dir.resume_error(Path(resume_from), train.base_model, model_folder(train.base_model),
                                                    adapter_shape(train.lora, train.init_adapter))):
        return fail(f"resume error: {why}")
    if train.resume == "auto" and (done := run_dir.finished(out_dir, last, values)):
        print(done)  # a finished run is left as it is: re-running the command is not a mistake
        return 0
    width = max(len(k) for k in values)
    print("config:\n" + "\n".join(f"  {k.ljust(width)} = {v}" for k, v in values.items()))
    print(f"  resume from: {resume_from or '(fresh run)'}")

    # ------------------------------------------------------------------------- toolchain and data
    # Every check comes before the output directory is touched (a failed start must not move or
    # overwrite the previous run's files), and before any model loads: a missing ocamlc/bwrap should
    # cost seconds, not a GPU hour.
    scorer = None
    if not check:
        # before the grader's and torch's threads start their arenas
        if train.steady_memory and (why := memory.steady_allocator()):
            print(f"warning: GRPO_STEADY_MEMORY=1 but the allocator was left as it is: {why}")
        try:
            scorer = rewards.GuardedScorer(cfg.reward)  # a crash on one completion: reward None, not a dead run
        except ToolchainError as e:
            return fail(f"OCaml toolchain check failed, not training: {e}")
        print(f"reward grader: {scorer.grader.sandbox.describe()}")
    try:
        problems = load_problems(train.dataset)
    except DatasetError as e:
        return fail(f"dataset error: {e}")
    print(f"dataset: {len(problems)} problems from {train.dataset}")

    # Only now torch, TRL and the modules built on them: every check above answered without them.
    # Its threads are set before it starts its thread pool (GRPO_TORCH_THREADS: why, in config/settings.py).
    os.environ.setdefault("OMP_NUM_THREADS", str(train.torch_threads))
    import torch
    torch.set_num_threads(train.torch_threads)
    quiet_library_warnings()
    from accelerate import PartialState
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig

    from ocaml_grpo.training.callbacks import GracefulStop, KeepAdapters, LearningLog
    from ocaml_grpo.training.dynamic_sampling import GroupLog
    from ocaml_grpo.training.tracking import shared_update
    from ocaml_grpo.training.trainer import OcamlGRPOTrainer

    if plumbing_model:
        ensure_plumbing_model(PLUMBING_MODEL_DIR)
    # A named model or a .gguf file is converted once into the cache (models/named.py); the rest load as they are.
    model_dir = resolve_model(train.base_model, cache_dir(os.environ))
    tokenizer = load_tokenizer(model_dir)

    # ------------------------------------------------------------------------- prompts (text: prompting.py)
    def prompt_tokens(problem) -> int:
        return prompt_token_count(tokenizer, problem.prompt, train.prompt_examples)

    # TRL 1.16 has no max_prompt_length: prompts longer than GRPO_MAX_PROMPT are dropped here. The audit
    # also drops problems no answer could pass (tests that do not compile against a stub, missing
    # packages, duplicates); why goes to <output dir>/audit.jsonl once the run starts.
    if train.audit_dataset and not check:
        audited = audit.audit_problems(problems, None, cache_dir=cfg.audit.cache_dir, prompt_tokens=prompt_tokens,
                                       max_prompt_tokens=train.max_prompt, grader=scorer.grader)
        kept = audited.kept
        too_long = sum(r.reason == "prompt_too_long" for r in audited.records)
    else:
        print("--check: dataset audit skipped; only the prompt length filter applies" if check else
              "AUDIT_DATASET=0: dataset audit skipped; only the prompt length filter applies")
        kept = [p for p in problems if prompt_tokens(p) <= train.max_prompt]
        too_long = len(problems) - len(kept)
    print(f"prompts: dropped {too_long} longer than GRPO_MAX_PROMPT={train.max_prompt} tokens")
    # ------------------------------------------------------------------------- learnable problems
    # GRPO_PROBLEM_STATS keeps the problems a probe found learnable (ocaml_grpo/training/selection.py); the tracker
    # then draws those whose last group taught nothing less often (ocaml_grpo/reward/group_kinds.py, tracking.py).
    try:
        kept, selection = apply_selection(kept, cfg)
    except ValueError as e:
        return fail(f"selection error: {e}")
    tracker = None
    tracking_file = out_dir / "reward_logs" / TRACKING_FILE
    if train.track_problems:
        tracker = ProblemTracker(train.track_weight, train.selection.min_std, train.selection.max_solved)
        if resume_from:
            print(f"problem tracking: {tracker.load(tracking_file)} groups replayed from {tracking_file}")
    if len(kept) < train.batch_size:
        return fail(f"dataset error: only {len(kept)} usable problems, fewer than GRPO_BATCH_SIZE={train.batch_size}")

    # ------------------------------------------------------------------------- memory (ocaml_grpo/training/memory.py)
    # A run that cannot fit stops here, before the model loads, with the settings that would fit.
    on_gpu = torch.cuda.is_available() if gpu_gb is None else True
    lora_shape = adapter_shape(train.lora, train.init_adapter)
    completion_budget = rollout_budget(train.repair_turns, train.max_completion) if train.repair_turns else train.max_completion
    run_shape = memory.RunShape(sequences=train.batch_size * train.num_generations, grad_accum=train.grad_accum_steps,
                                prompt_tokens=max(prompt_tokens(p) for p in kept), completion_tokens=completion_budget,
                                lora_r=lora_shape["r"], lora_modules=lora_shape["target_modules"], on_gpu=on_gpu,
                                checkpointing=on_gpu, cache_prompt_tokens=train.max_prompt if engine == "compiled" else 0,
                                steady_allocator=train.steady_memory)
    try:
        shape = memory.read_shape(model_dir)
    except ValueError as e:
        return fail(f"model error: {e}")
    estimate = memory.estimate(shape, run_shape)
    free, where = (gpu_gb * memory.GB, "given by --gpu") if gpu_gb is not None else memory.available(on_gpu)
    if engine == "vllm" and train.vllm_mode == "colocate":
        estimate.parts["vLLM"] = train.vllm_gpu_memory * free
    if engine == "llamacpp":  # generation's KV cache is llama.cpp's, beside the GGUF file it runs
        gguf = named_models.gguf_source(train.base_model, cache_dir(os.environ))
        generation_batch = train.batch_size * train.num_generations * train.grad_accum_steps
        llama_ctx = llamacpp.context_tokens(generation_batch // train.num_generations, generation_batch,
                                            run_shape.prompt_tokens, completion_budget)
        del estimate.parts["KV cache"]
        estimate.parts["llama.cpp"] = llamacpp.memory_bytes(gguf, llama_ctx, generation_batch,
                                                            shape.lora_params(run_shape.lora_r, run_shape.lora_modules))
    print(memory.report(estimate, run_shape, free, where))
    if not memory.fits(estimate, free):
        ways = memory.suggestions(shape, run_shape, free * memory.HEADROOM, train.batch_size, train.num_generations,
                                  train.prompt_examples)
        message = (f"memory error: this run needs about {estimate.total / memory.GB:.1f} GB at its peak and "
                   f"{free / memory.GB:.1f} GB is {where}: it would be killed, or swap, before its first step. "
                   f"It would fit with {' or '.join(ways) if ways else 'a smaller model'}"
                   + ("" if on_gpu else "; a GPU holds it in bf16 with gradient checkpointing (python train.py --check --gpu GB)")
                   + ". GRPO_MEMORY_CHECK=0 starts it anyway.")
        if check or train.memory_check:
            return fail(message)
        print(f"warning (GRPO_MEMORY_CHECK=0): {message}")
    if check:
        print(f"--check: the run fits ({estimate.total / memory.GB:.1f} GB of {free * memory.HEADROOM / memory.GB:.1f} GB); nothing was written")
        return 0

    # `prompt` (chat messages) is what TRL generates from; the other columns go to the reward as kwargs.
    train_dataset = Dataset.from_list([{"prompt": chat_messages(p.prompt, train.prompt_examples), **p.to_row()} for p in kept])

    # ------------------------------------------------------------------------- model
    model = load_model(model_dir)
    peft_config = lora_config(train.lora)
    if train.init_adapter:  # continue the SFT adapter instead of starting a fresh one
        from peft import PeftModel
        trained_on = adapter_base(train.init_adapter)
        if trained_on and trained_on not in (train.base_model, model_dir):
            print(f"warning: GRPO_INIT_ADAPTER was trained on {trained_on}, BASE_MODEL_ID is {train.base_model}")
        model = PeftModel.from_pretrained(model, train.init_adapter, is_trainable=True)
        peft_config = None
        print(f"starting from the adapter {train.init_adapter} (its LoRA settings apply, not LORA_*)")

    # ------------------------------------------------------------------------- output directory and reward
    # Every check has passed: only now is the output directory created, an earlier run's files moved
    # aside (a fresh run) and config.json written, by rank 0 before any other process opens its
    # reward logs there (a fresh run would move them aside too). cpu= as the trainer will set it: without
    # it a CPU launch looks single-process and nobody waits.
    with PartialState(cpu=not on_gpu).main_process_first():
        if is_main:
            if archive := run_dir.prepare(out_dir, values, resumed=resume_from is not None):
                print(f"  the earlier run's logs and config moved to {archive}")
            if train.audit_dataset:
                audit.write_records(audited, out_dir)
            if selection:
                write_choices(out_dir, selection)
            if tracker:
                tracker.open(tracking_file)
        # Every process's groups, gathered: the tracker's states, and the kinds of the groups dynamic sampling drops
        group_log = GroupLog() if train.dynamic_sampling else None
        consumers = [c for c in (tracker.update if tracker else None, group_log) if c]
        reward_fn = rewards.make_reward_function(out_dir, max_completion_tokens=train.max_completion,
                                                 curriculum=train.curriculum, scorer=scorer,
                                                 rank=rank, group_size=train.num_generations,
                                                 on_groups=shared_update(*consumers) if consumers else None,
                                                 repair_discount=train.repair_discount)
    # Repair turns: TRL's rollout_func generates every turn with the trainer's own engine
    # (ocaml_grpo/training/repair.py); the feedback comes from the same grader as the reward.
    rollout = None
    if train.repair_turns:
        rollout = RepairRollout(kept, scorer.feedback, train.repair_turns, train.max_completion, tokenizer,
                                scorer.pool, train.prompt_examples)
        if is_main:
            print(f"repair turns: up to {train.repair_turns} more answer(s) after feedback; reward x "
                  f"{train.repair_discount:g} per extra turn; episode budget {rollout.budget} completion tokens")
    if train.dynamic_sampling and is_main:
        print(f"dynamic sampling: groups whose rewards' std is below GRPO_LEARNABLE_MIN_STD="
              f"{train.selection.min_std:g} are dropped and replaced, up to {train.dynamic_rounds} more generation "
              "round(s) per step")

    # ------------------------------------------------------------------------- trainer
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
        bf16=on_gpu,
        use_cpu=not on_gpu,
        **checkpointing_kwargs(GRPOConfig, on_gpu),  # trades compute for memory; pointless for CPU-sized models
        remove_unused_columns=False,  # the reward needs id/problem/tests/requires/entry_point
        log_completions=False,  # completions go to reward_logs/completions.jsonl instead
        disable_tqdm=True,  # the console shows learning.log's lines and a progress bar (LearningLog) instead
        **engine_kwargs(engine,
                        sequences=train.batch_size * G * train.grad_accum_steps,
                        max_prompt=train.max_prompt, max_completion=train.max_completion,
                        vllm_mode=train.vllm_mode, vllm_gpu_memory=train.vllm_gpu_memory,
                        vllm_server_url=train.vllm_server_url, stop=END_MARKER if train.stop_at_end else None),
    )

    # learning.log and the live health monitor (the rules analyze.py reports with: ocaml_grpo/training/health.py)
    header = header_lines(resume_from, values, len(kept), scorer.grader.sandbox.describe())
    stop = GracefulStop()
    callback = LearningLog(out_dir / "learning.log", header, resumed=resume_from is not None,
                           auto_stop=train.auto_stop, echo=is_main, stop=stop,
                           curriculum=cfg.reward.weights if train.curriculum else None)
    llama = None
    if engine == "llamacpp":  # the rollouts' engine, over the GGUF file the trainer's weights came from
        llama = llamacpp.LlamaEngine(gguf, threads=len(os.sched_getaffinity(0)), sequences=generation_batch,
                                     context=llama_ctx)
        print(f"generation: llama.cpp over {gguf} ({llama.shape['arch']}, {llama.threads} threads, "
              f"a {llama.n_ctx}-token KV cache shared by {generation_batch} sequences)")
    trainer = OcamlGRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=train_dataset,
                               processing_class=tokenizer, peft_config=peft_config, callbacks=[callback, stop, *([KeepAdapters(train.keep_adapters)] if train.keep_adapters else [])],
                               tracker=tracker, rollout_func=rollout, stop=END_MARKER if train.stop_at_end else None,
                               dynamic_rounds=train.dynamic_rounds if train.dynamic_sampling else None,
                               group_log=group_log, min_std=train.selection.min_std, llama=llama,
                               share_prompts=train.shared_prefix)
    if engine == "compiled":
        enable_compiled_generation(trainer)
    trainer.remove_callback(PrinterCallback)  # its ~1,000-character metrics dict per step: LearningLog prints instead

    # ------------------------------------------------------------------------- train
    if is_main:
        trainer.model.print_trainable_parameters()
    t0 = time.time()
    stop.install()
    try:
        trainer.train(resume_from_checkpoint=resume_from)
    finally:
        scorer.close()
        if llama:
            llama.close()
        if tracker:
            tracker.close()
    if tracker and is_main:
        print("problem states at the end: " + "  ".join(f"{k}={n}" for k, n in tracker.counts(train_dataset["id"]).items()))
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
        tokenizer.save_pretrained(str(final_dir))
        why = ("the stop criteria" if callback.stopped_by_rule
               else f"GRPO_MAX_STEPS={train.max_steps}" if train.max_steps > 0
               else f"GRPO_NUM_EPOCHS={train.num_epochs}")
        run_dir.mark_finished(out_dir, state.global_step, state.epoch or 0.0, why, values)
        print(f"done in {time.time() - t0:.0f}s: finished at step {state.global_step} ({why}); adapter in {final_dir}; "
              f"logs in {out_dir / 'learning.log'}")
        print(f"merge with: python train.py merge {final_dir} {out_dir / 'merged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
