"""The GRPO run's settings (train.py): model, data, optimisation, LoRA, generation engines,
problem tracking and selection, and the dataset audit's cache. The reward's are in
ocaml_grpo/config/scoring.py, the sandbox's in isolation.py, SFT's in warm_start.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ocaml_grpo.config.settings import (AdapterDir, Auto, Choice, Flag, Float, Int, ModuleList, Resume, Text, cache_dir,
                                        default_torch_threads, section, setting, settings_of)

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # trl 1.16 GRPOConfig.loss_type
ENGINES = ("default", "compiled", "paged", "vllm", "llamacpp")  # training/engines.py
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                 "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay")


def StatsFile(s: str) -> str:
    if s and not Path(s).is_file():
        raise ValueError
    return s
StatsFile.accepts = "empty, or an existing JSONL file written by `python evaluate.py --probe`"


@dataclass
class LoRA:
    """The adapter GRPO (and `train.py sft` with SFT_LORA=1) trains."""
    r: int = setting("LORA_R", "32", Int(1), "LoRA rank")
    alpha: int = setting("LORA_ALPHA", "64", Int(1), "LoRA alpha (scale = alpha / r)")
    dropout: float = setting("LORA_DROPOUT", "0.05", Float(0, 1, hi_open=True), "LoRA dropout")
    bias: str = setting("LORA_BIAS", "none", Choice("none", "all", "lora_only"), "which biases LoRA trains")
    target_modules: str = setting("LORA_TARGET_MODULES", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                                  ModuleList, "modules LoRA adapts")


@dataclass
class SelectionConfig:
    """Which problems are learnable: ocaml_grpo/training/selection.py (before the run, from a
    probe) and group_kinds.py (during it, from each problem's last group)."""
    stats_file: str = setting(
        "GRPO_PROBLEM_STATS", "", StatsFile,
        "the probe's per-problem statistics (python evaluate.py --probe FILE): train only on the problems whose "
        "groups will have reward variance (GRPO_LEARNABLE_*); empty: every problem")
    min_std: float = setting(
        "GRPO_LEARNABLE_MIN_STD", "0.05", Float(0),
        "a problem teaches when its rewards' std is at least this: below it, the selection drops it (its probe "
        "samples), the tracker draws it less (its last group) and dynamic sampling drops the group; too_hard when "
        "none passed a test, identical "
        "otherwise. GRPO divides advantages by the group std, so smaller differences teach noise; 0: any difference")
    max_solved: float = setting(
        "GRPO_LEARNABLE_MAX_SOLVED", "0.9", Float(0, 1, lo_open=True),
        "a problem is too_easy when at least this share of its completions pass every test (most of its groups "
        "would all pass): the selection drops it, the tracker draws it less; 1: only when every one passed")


@dataclass
class TrainConfig:
    base_model: str = setting("BASE_MODEL_ID", "Qwen/Qwen2.5-Coder-1.5B-Instruct", Text,
                              "hub id or local dir of the base (instruct) model; offline: qwen2.5-coder-0.5b-instruct, "
                              "qwen2.5-coder-1.5b-instruct (make model-qwen05 / model-qwen15), smollm2-135m-instruct "
                              "(make model) or a .gguf file (converted once into the cache)")
    dataset: str = setting("TRAINING_DATASET", "kiranpg/ocaml-training-problems", Text,
                           "hub id, local .jsonl/.json/.csv/.parquet, or 'bundled'")
    output_dir: str = setting("GRPO_OUTPUT_DIR", "grpo_runs", Text, "where logs, checkpoints and the adapter go")
    batch_size: int = setting("GRPO_BATCH_SIZE", "4", Int(1),
                              "prompts per optimizer step per device (TRL batch = this x generations)")
    grad_accum_steps: int = setting("GRPO_GRAD_ACCUM_STEPS", "1", Int(1), "gradient accumulation steps")
    num_generations: int = setting("GRPO_NUM_GENERATIONS", "6", Int(2), "completions sampled per prompt (the GRPO group)")
    max_prompt: int = setting("GRPO_MAX_PROMPT", "1024", Int(16),
                              "max prompt tokens; longer prompts are dropped (counted at start)")
    prompt_examples: int = setting("GRPO_PROMPT_EXAMPLES", "3", Int(0, 3),
                                   "worked examples in the prompt (ocaml_grpo/prompting.py; ~200 tokens each): 0 for a model "
                                   "the SFT warm start taught the answer format; SFT, GRPO and evaluate.py must agree")
    max_completion: int = setting("GRPO_MAX_COMPLETION", "512", Int(8),
                                  "max completion tokens; hitting it without END is penalized")
    num_epochs: float = setting("GRPO_NUM_EPOCHS", "1.0", Float(0, lo_open=True), "epochs over the problem set")
    learning_rate: float = setting("GRPO_LEARNING_RATE", "5e-6", Float(0, 1, lo_open=True), "peak learning rate")
    temperature: float = setting("GRPO_TEMPERATURE", "0.9", Float(0, 5, lo_open=True),
                                 "sampling temperature (diversity within a group)")
    max_grad_norm: float = setting("GRPO_MAX_GRAD_NORM", "1.0", Float(0, lo_open=True), "gradient clipping norm")
    logging_steps: int = setting("GRPO_LOGGING_STEPS", "1", Int(1), "optimizer steps between learning.log lines")
    lora: LoRA = section(LoRA)
    max_steps: int = setting("GRPO_MAX_STEPS", "-1", Int(-1), "stop after this many optimizer steps (-1: run the epochs)")
    save_steps: int = setting("GRPO_SAVE_STEPS", "50", Int(1), "optimizer steps between checkpoints")
    save_total_limit: int = setting("GRPO_SAVE_TOTAL_LIMIT", "3", Int(1), "checkpoints kept")
    keep_adapters: int = setting("GRPO_KEEP_ADAPTERS", "0", Int(0),
                                 "every this many optimizer steps (a multiple of GRPO_SAVE_STEPS), the checkpoint's "
                                 "adapter is also copied to adapters/step-N/, which checkpoint rotation never deletes: "
                                 "a curve of evaluations along the run (evaluate.py --adapter); 0: none")
    seed: int = setting("GRPO_SEED", "42", Int(0), "random seed")
    beta: float = setting("GRPO_BETA", "0.0", Float(0), "KL coefficient (0: no reference model, less memory)")
    loss_type: str = setting("GRPO_LOSS_TYPE", "dapo", Choice(*LOSS_TYPES), "TRL loss aggregation")
    scale_rewards: str = setting(
        "GRPO_SCALE_REWARDS", "group", Choice("group", "batch", "none"),
        "advantage = (reward - group mean) / std of: the group, the whole batch, or none (learning.log's "
        "frac_zero_std is the per-group share under all three)")
    warmup_ratio: float = setting("GRPO_WARMUP_RATIO", "0.0", Float(0, 1, hi_open=True),
                                  "fraction of steps spent warming up the LR")
    lr_scheduler: str = setting("GRPO_LR_SCHEDULER", "linear", Choice(*LR_SCHEDULERS), "learning-rate schedule")
    top_entropy_quantile: float = setting("GRPO_TOP_ENTROPY_QUANTILE", "1.0", Float(0, 1, lo_open=True),
                                          "train only on the top-entropy tokens (1.0: all)")
    stop_at_end: bool = setting(
        "GRPO_STOP_AT_END", "0", Flag,
        "1: an answer ends where it writes the END marker (training, evaluate.py and the probe), so text after it "
        "costs no time and earns nothing (not with GRPO_CONTINUOUS_BATCHING=1); 0: it runs until the model ends its "
        "turn or GRPO_MAX_COMPLETION")
    mask_truncated: bool = setting("GRPO_MASK_TRUNCATED", "0", Flag, "1: truncated completions get no loss")
    report_to: str = setting("GRPO_REPORT_TO", "tensorboard", Choice("tensorboard", "wandb", "none"),
                             "metric sink besides learning.log")
    curriculum: bool = setting("REWARD_CURRICULUM", "0", Flag,
                               "1: syntax-first reward weights that shift to tests by epoch 1.0")
    auto_stop: bool = setting("GRPO_AUTO_STOP", "1", Flag,
                              "1: at epoch >= 1.0 save and stop when the stop criteria hold; 0: only warn")
    resume: str = setting("GRPO_RESUME", "auto", Resume,
                          "auto: resume from the last checkpoint-* in the output dir; never; or a path")
    engine: str = setting(
        "GRPO_ENGINE", "default", Choice(*ENGINES),
        "what generates the answers: default (transformers' generate), compiled (the same with a static KV cache and a "
        "compiled decode step), paged (transformers' continuous batching), vllm (TRL's vLLM; CUDA), llamacpp (llama.cpp "
        "from the model's GGUF file with the trainer's LoRA adapter swapped in each step; CPU; `make engine`). "
        "GRPO_USE_VLLM=1, GRPO_CONTINUOUS_BATCHING=1 and GRPO_COMPILED_GENERATION=1 are aliases")
    shared_prefix: bool = setting(
        "GRPO_SHARED_PREFIX", "auto",
        Auto(Flag, lambda env: env.get("GRPO_ENGINE", "").strip() == "llamacpp", "1 with GRPO_ENGINE=llamacpp, else 0"),
        "1: the loss's forward and backward and TRL's other log-probability passes encode each group's prompt once "
        "(a shared-prefix forward: the same values and gradients, fewer tokens, no padding); 0: TRL's forward, each "
        "prompt G times")
    use_vllm: bool = setting("GRPO_USE_VLLM", "0", Flag,
                             "1: generate with vLLM through TRL (pip install -r requirements-vllm.txt; CUDA only)")
    vllm_mode: str = setting("GRPO_VLLM_MODE", "colocate", Choice("colocate", "server"),
                             "colocate: vLLM shares the training GPUs; server: a separate `trl vllm-serve` process")
    vllm_gpu_memory: float = setting("GRPO_VLLM_GPU_MEMORY", "0.3", Float(0, 1, lo_open=True),
                                     "colocate: share of GPU memory vLLM may take")
    vllm_server_url: str = setting("GRPO_VLLM_SERVER_URL", "http://localhost:8000", Text,
                                   "server mode: where `trl vllm-serve` listens")
    continuous_batching: bool = setting("GRPO_CONTINUOUS_BATCHING", "0", Flag,
                                        "1: transformers' paged continuous-batching generation (no vLLM needed)")
    compiled_generation: bool = setting("GRPO_COMPILED_GENERATION", "0", Flag,
                                        "1: transformers' generate with a static KV cache and a compiled decode "
                                        "step (CUDA graphs on a GPU: the first step pays the compilation once; "
                                        "figures in bench/BENCHMARKS.md)")
    audit_dataset: bool = setting("AUDIT_DATASET", "1", Flag,
                                  "1: drop problems whose tests cannot compile (cached); 0: only the prompt-length filter")
    torch_threads: int = setting("GRPO_TORCH_THREADS", "auto",
                                 Auto(Int(1), default_torch_threads, "OMP_NUM_THREADS when exported, else half the cores"),
                                 "torch's CPU threads: fewer than the cores leaves room for the grader and other jobs, "
                                 "which torch's threads would otherwise spin-wait against")
    steady_memory: bool = setting("GRPO_STEADY_MEMORY", "1", Flag,
                                  "1: glibc's malloc gives freed blocks back (a fixed mmap threshold, 2 arenas): a CPU "
                                  "run peaks the same from one run to the next, up to 20% lower; 0: glibc's defaults")
    memory_check: bool = setting("GRPO_MEMORY_CHECK", "1", Flag,
                                 "1: a run whose estimated peak memory (python train.py --check) exceeds 90% of the free "
                                 "RAM (CPU) or GPU memory stops before the model loads, naming settings that fit; 0: only warn")
    plumbing: bool = setting("GRPO_PLUMBING", "0", Flag,
                             "1: the plumbing run: offline, CPU, a tiny random model, bundled problems, "
                             "~20 steps (proves the machinery runs; `train.py demo` is the one that learns)")
    track_problems: bool = setting("GRPO_TRACK_PROBLEMS", "1", Flag,
                                   "1: judge each problem by its last group (GRPO_LEARNABLE_*) and draw the ones "
                                   "whose last group taught nothing less often (GRPO_TRACK_WEIGHT); 0: TRL's order")
    track_weight: float = setting("GRPO_TRACK_WEIGHT", "0.2", Float(0, 1),
                                  "with GRPO_TRACK_PROBLEMS=1: the draw weight of a problem whose last "
                                  "group taught nothing, against 1 for the others (0: never again)")
    repair_turns: int = setting("GRPO_REPAIR_TURNS", "0", Int(0),
                                "repair turns: after an answer that does not compile or fails the prompt's examples, the "
                                "model reads the compiler's diagnosis and the failing examples and answers again, up to "
                                "this many more times (0: one answer, as before)")
    repair_discount: float = setting("GRPO_REPAIR_DISCOUNT", "0.8", Float(0, 1, lo_open=True, hi_open=True),
                                     "with repair turns: the final answer's reward x this per extra turn it took, so "
                                     "a right first answer is worth the most")
    dynamic_sampling: bool = setting(
        "GRPO_DYNAMIC_SAMPLING", "0", Flag,
        "1: a step drops the groups that teach nothing (rewards all equal, or a std below GRPO_LEARNABLE_MIN_STD) "
        "and generates groups for newly drawn problems until its batch holds only groups that teach, or "
        "GRPO_DYNAMIC_SAMPLING_ROUNDS is reached (DAPO's dynamic sampling; ocaml_grpo/training/dynamic_sampling.py); "
        "0: every generated group is trained on")
    dynamic_rounds: int = setting(
        "GRPO_DYNAMIC_SAMPLING_ROUNDS", "3", Int(0),
        "with GRPO_DYNAMIC_SAMPLING=1: extra generation rounds a step may take, each as large as the first; at the "
        "cap the step trains on what it has, the short places filled with groups that teach nothing")
    selection: SelectionConfig = section(SelectionConfig)
    init_adapter: str = setting("GRPO_INIT_ADAPTER", "", AdapterDir,
                                "a LoRA adapter to continue (python train.py sft with SFT_LORA=1); "
                                "its own LoRA settings replace LORA_*")


PLUMBING_DEFAULTS = {  # GRPO_PLUMBING=1 replaces defaults and .envrc values, never the process environment
    "TRAINING_DATASET": "bundled", "GRPO_OUTPUT_DIR": "grpo_runs/plumbing", "GRPO_BATCH_SIZE": "2",
    "GRPO_NUM_GENERATIONS": "4", "GRPO_MAX_PROMPT": "4096", "GRPO_MAX_COMPLETION": "64", "GRPO_MAX_STEPS": "20",
    "GRPO_SAVE_STEPS": "10", "GRPO_LEARNING_RATE": "1e-4", "GRPO_TEMPERATURE": "1.0", "MIN_NON_EMPTY_LINES": "0",
    "GRPO_REPORT_TO": "none", "LORA_R": "8", "LORA_ALPHA": "16",
}


@dataclass
class AuditConfig:
    """The dataset audit's (ocaml_grpo/grading/audit.py): train.py's with AUDIT_DATASET=1, and `rewards.py audit`."""
    cache_dir: str = setting("AUDIT_CACHE_DIR", "auto", Auto(Text, lambda env: str(cache_dir(env)), "$XDG_CACHE_HOME/ocaml-grpo"),
                             "where audit results are cached by content hash")


AUDIT_SETTINGS = settings_of(AuditConfig)
