"""A GRPO run's phases before any model loads (`python train.py`, `--check`): the config, the OCaml
toolchain and the data, then the memory estimate. Each answers in seconds without torch's weight,
and a phase that finds the run cannot start raises `Stop` with the message for the user; nothing is
written to the output folder here. What comes after (the model, the trainer, the run) is grpo_run.py.
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from dotenv import load_dotenv

from ocaml_grpo.commands import memory
from ocaml_grpo.config import PLUMBING_DEFAULTS, RETIRED, SETTINGS, VARIABLES, Config, recorded, resolve
from ocaml_grpo.config.settings import cache_dir, unknown_variables
from ocaml_grpo.grading import audit
from ocaml_grpo.grading.toolcache import ToolchainError
from ocaml_grpo.models import named as named_models
from ocaml_grpo.models.loading import go_offline_unless_needed, load_tokenizer, model_error, quiet_library_warnings
from ocaml_grpo.models.named import converted_folder, resolve_model
from ocaml_grpo.models.tiny import ensure_plumbing_model, plumbing_model_dir
from ocaml_grpo.problems import DatasetError, Problem, load_problems
from ocaml_grpo.prompting import prompt_token_count
from ocaml_grpo.reward.group_kinds import TRACKING_FILE
from ocaml_grpo.scoring import GuardedScorer
from ocaml_grpo.training import llamacpp, run_dir
from ocaml_grpo.training.engines import choose_engine, compile_problem, engine_variable
from ocaml_grpo.training.repair import rollout_budget
from ocaml_grpo.training.selection import apply_selection
from ocaml_grpo.training.tracker import ProblemTracker


class Stop(Exception):
    """The run does not start (or has nothing left to do): `message` for the user, `status` for the
    shell (0: a finished run left as it is, printed on stdout; else the message goes to stderr)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.message, self.status = message, status


def plumbing_model_folder() -> Path:
    """The plumbing run's model (GRPO_PLUMBING=1), built on first use."""
    return plumbing_model_dir(cache_dir(os.environ))


@dataclass
class Plan:
    """The resolved config and what it decides before anything is read: the engine, the process's
    rank, the checkpoint to resume from."""
    cfg: Config
    engine: str
    asked: str  # the variable that chose the engine, for messages
    rank: int
    out_dir: Path
    plumbing_model: bool
    values: dict  # the settings by variable name: config.json, the console, learning.log's header
    resume_from: str | None

    @property
    def train(self):
        return self.cfg.train

    @property
    def is_main(self) -> bool:  # only rank 0 writes learning.log, config and checkpoints
        return self.rank == 0


@dataclass
class Data:
    """The grader, the problems kept for training and the tokenizer that measured them."""
    scorer: GuardedScorer | None  # None under --check
    model_dir: str
    tokenizer: object
    kept: list[Problem]
    audited: audit.AuditResult | None
    selection: list | None
    tracker: ProblemTracker | None
    tracking_file: Path


@dataclass
class Fit:
    """What the memory phase decided: the device, and llama.cpp's file and cache when it generates."""
    on_gpu: bool
    gguf: Path | None
    generation_batch: int
    llama_ctx: int


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
    if train.plumbing and train.base_model == str(plumbing_model_folder()):
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


def config() -> Plan:
    """The environment (over ./.envrc, over the plumbing run's defaults, over the defaults), every
    setting validated together, the engine checked, and the checkpoint to resume from."""
    # Remember what the user exported before .envrc fills gaps, so the plumbing run can tell them apart.
    user_set = set(os.environ)
    load_dotenv(".envrc", override=False)  # python-dotenv understands `export KEY=value` lines
    plumbing = os.environ.get("GRPO_PLUMBING", "0") == "1"
    if plumbing:
        for k, v in {**PLUMBING_DEFAULTS, "BASE_MODEL_ID": str(plumbing_model_folder())}.items():
            if k not in user_set:
                os.environ[k] = v
    cfg, errors = resolve(os.environ, SETTINGS)
    errors += unknown_variables(os.environ, VARIABLES, RETIRED)
    train = cfg.train
    # Asked for but missing must stop here, with the way to get it.
    engine, why = choose_engine(train)
    errors += [why] if why else []
    asked = engine_variable(train, engine)
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
    rank = int(os.environ.get("RANK", "0"))  # accelerate and torchrun set it for every process
    out_dir = Path(train.output_dir)
    plumbing_model = plumbing and train.base_model == str(plumbing_model_folder())
    if not errors:
        # A run that needs nothing from the hub says so to the libraries, which otherwise retry it for
        # 25-50 s on an offline machine; one that needs it and cannot reach it finds out in seconds.
        if note := go_offline_unless_needed([train.base_model], train.dataset, os.environ):
            print(note)
        if not plumbing_model:  # built on first use
            errors += [e for e in [model_error("BASE_MODEL_ID", train.base_model, os.environ)] if e]
        errors += [e for e in [run_dir.write_error(out_dir)] if e]
    if errors:
        raise Stop("config error:\n  " + "\n  ".join(errors) + "\nSee python train.py --help")
    if train.report_to != "none" and importlib.util.find_spec(train.report_to) is None:
        print(f"note: GRPO_REPORT_TO={train.report_to} but that package is not installed; reporting to learning.log only")
        train.report_to = "none"
    values = recorded(cfg)

    resume_from = None
    last = None
    if train.resume == "auto":
        last = run_dir.last_checkpoint(out_dir)
        resume_from = str(last) if last else None
    elif train.resume != "never":
        resume_from = train.resume
    # A checkpoint of another model (or LoRA shape) would fail to load only after the folder had
    # been changed: it is refused here, before anything is written.
    if resume_from and (why := run_dir.resume_error(Path(resume_from), train.base_model, model_folder(train.base_model),
                                                    adapter_shape(train.lora, train.init_adapter))):
        raise Stop(f"resume error: {why}")
    if train.resume == "auto" and (done := run_dir.finished(out_dir, last, values)):
        raise Stop(done, status=0)  # a finished run is left as it is: re-running the command is not a mistake
    width = max(len(k) for k in values)
    print("config:\n" + "\n".join(f"  {k.ljust(width)} = {v}" for k, v in values.items()))
    print(f"  resume from: {resume_from or '(fresh run)'}")
    return Plan(cfg, engine, asked, rank, out_dir, plumbing_model, values, resume_from)


def data(plan: Plan, check: bool) -> Data:
    """The grader (its toolchain checked), the problems, the tokenizer, then the problems a run
    keeps: the audit, the prompt length, the learnable-problem selection and the tracker. Before
    the output directory is touched and before any model loads: a missing ocamlc or bwrap costs
    seconds, not a GPU hour."""
    train, cfg = plan.train, plan.cfg
    scorer = None
    if not check:
        # before the grader's and torch's threads start their arenas
        if train.steady_memory and (why := memory.steady_allocator()):
            print(f"warning: GRPO_STEADY_MEMORY=1 but the allocator was left as it is: {why}")
        try:
            scorer = GuardedScorer(cfg.reward)  # a crash on one completion: reward None, not a dead run
        except ToolchainError as e:
            raise Stop(f"OCaml toolchain check failed, not training: {e}") from None
        print(f"reward grader: {scorer.grader.sandbox.describe()}")
    try:
        problems = load_problems(train.dataset)
    except DatasetError as e:
        raise Stop(f"dataset error: {e}") from None
    print(f"dataset: {len(problems)} problems from {train.dataset}")

    # Only now torch and the libraries built on it: every check above answered without them. Its
    # threads are set before it starts its thread pool (GRPO_TORCH_THREADS: why, in config/settings.py).
    os.environ.setdefault("OMP_NUM_THREADS", str(train.torch_threads))
    import torch
    torch.set_num_threads(train.torch_threads)
    quiet_library_warnings()
    if plan.plumbing_model:
        ensure_plumbing_model(plumbing_model_folder())
    # A named model or a .gguf file is converted once into the cache (models/named.py); the rest load as they are.
    model_dir = resolve_model(train.base_model, cache_dir(os.environ))
    tokenizer = load_tokenizer(model_dir)

    def prompt_tokens(problem) -> int:
        return prompt_token_count(tokenizer, problem.prompt, train.prompt_examples)

    # TRL has no max_prompt_length: prompts longer than GRPO_MAX_PROMPT are dropped here. The audit
    # also drops problems no answer could pass (tests that do not compile against a stub, missing
    # packages, duplicates); why goes to <output dir>/audit.jsonl once the run starts.
    audited = None
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
    # GRPO_PROBLEM_STATS keeps the problems a probe found learnable (training/selection.py); the tracker
    # then draws those whose last group taught nothing less often (reward/group_kinds.py, training/tracker.py).
    try:
        kept, selection = apply_selection(kept, cfg)
    except ValueError as e:
        raise Stop(f"selection error: {e}") from None
    tracker = None
    tracking_file = plan.out_dir / "reward_logs" / TRACKING_FILE
    if train.track_problems:
        tracker = ProblemTracker(train.track_weight, train.selection.min_std, train.selection.max_solved)
        if plan.resume_from:
            print(f"problem tracking: {tracker.load(tracking_file)} groups replayed from {tracking_file}")
    if len(kept) < train.batch_size:
        raise Stop(f"dataset error: only {len(kept)} usable problems, fewer than GRPO_BATCH_SIZE={train.batch_size}")
    return Data(scorer, model_dir, tokenizer, kept, audited, selection, tracker, tracking_file)


def memory_fit(plan: Plan, data: Data, gpu_gb: float | None, check: bool) -> Fit:
    """The run's peak memory, estimated from the model's shape, beside what the device has (or
    `gpu_gb`, --check --gpu's): a run that cannot fit stops here with the settings that would."""
    import torch  # loaded by data()
    train = plan.train
    on_gpu = torch.cuda.is_available() if gpu_gb is None else True
    lora_shape = adapter_shape(train.lora, train.init_adapter)
    completion_budget = rollout_budget(train.repair_turns, train.max_completion) if train.repair_turns else train.max_completion
    prompt_tokens = max(prompt_token_count(data.tokenizer, p.prompt, train.prompt_examples) for p in data.kept)
    run_shape = memory.RunShape(sequences=train.batch_size * train.num_generations, grad_accum=train.grad_accum_steps,
                                prompt_tokens=prompt_tokens, completion_tokens=completion_budget,
                                lora_r=lora_shape["r"], lora_modules=lora_shape["target_modules"], on_gpu=on_gpu,
                                checkpointing=on_gpu, cache_prompt_tokens=train.max_prompt if plan.engine == "compiled" else 0,
                                steady_allocator=train.steady_memory)
    try:
        shape = memory.read_shape(data.model_dir)
    except ValueError as e:
        raise Stop(f"model error: {e}") from None
    estimate = memory.estimate(shape, run_shape)
    free, where = (gpu_gb * memory.GB, "given by --gpu") if gpu_gb is not None else memory.available(on_gpu)
    if plan.engine == "vllm" and train.vllm_mode == "colocate":
        estimate.parts["vLLM"] = train.vllm_gpu_memory * free
    generation_batch = train.batch_size * train.num_generations * train.grad_accum_steps
    gguf, llama_ctx = None, 0
    if plan.engine == "llamacpp":  # generation's KV cache is llama.cpp's, beside the GGUF file it runs
        gguf = named_models.gguf_source(train.base_model, cache_dir(os.environ))
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
            raise Stop(message)
        print(f"warning (GRPO_MEMORY_CHECK=0): {message}")
    if check:
        raise Stop(f"--check: the run fits ({estimate.total / memory.GB:.1f} GB of "
                   f"{free * memory.HEADROOM / memory.GB:.1f} GB); nothing was written", status=0)
    return Fit(on_gpu, gguf, generation_batch, llama_ctx)
