"""The trainer's settings (train.py, and `train.py sft`'s): every variable they read, with its
default, parser and meaning. The reward's own settings (weights, MIN_NON_EMPTY_LINES, ...) are defined in
ocaml_grpo/config/reward.py, the sandbox's in ocaml_sandbox.py, the audit's in dataset_audit.py; SETTINGS
is all of them, as train.py resolves them and writes them to config.json.
analyze.py falls back to these defaults for a run directory without config.json.
"""
from __future__ import annotations

from ocaml_grpo.config.reward import REWARD_SETTINGS
from ocaml_grpo.config.sandbox import SANDBOX_SETTINGS
from ocaml_grpo.grading.audit import AUDIT_SETTINGS
from ocaml_grpo.training.selection import SELECTION_SETTINGS
from ocaml_grpo.config.settings import AdapterDir, Choice, Flag, Float, Holdout, Int, ModuleList, Resume, Setting, Text

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # trl 1.16 GRPOConfig.loss_type
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                 "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay")

CONFIG = [
    Setting("BASE_MODEL_ID", "Qwen/Qwen2.5-Coder-1.5B-Instruct", Text, "hub id or local dir of the base (instruct) model"),
    Setting("TRAINING_DATASET", "kiranpg/ocaml-training-problems", Text, "hub id, local .jsonl/.json/.csv/.parquet, or 'bundled'"),
    Setting("GRPO_OUTPUT_DIR", "grpo_runs", Text, "where logs, checkpoints and the adapter go"),
    Setting("GRPO_BATCH_SIZE", "4", Int(1), "prompts per optimizer step per device (TRL batch = this x generations)"),
    Setting("GRPO_GRAD_ACCUM_STEPS", "1", Int(1), "gradient accumulation steps"),
    Setting("GRPO_NUM_GENERATIONS", "6", Int(2), "completions sampled per prompt (the GRPO group)"),
    Setting("GRPO_MAX_PROMPT", "1024", Int(16), "max prompt tokens; longer prompts are dropped (counted at start)"),
    Setting("GRPO_MAX_COMPLETION", "512", Int(8), "max completion tokens; hitting it without END is penalized"),
    Setting("GRPO_NUM_EPOCHS", "1.0", Float(0, lo_open=True), "epochs over the problem set"),
    Setting("GRPO_LEARNING_RATE", "5e-6", Float(0, 1, lo_open=True), "peak learning rate"),
    Setting("GRPO_TEMPERATURE", "0.9", Float(0, 5, lo_open=True), "sampling temperature (diversity within a group)"),
    Setting("GRPO_MAX_GRAD_NORM", "1.0", Float(0, lo_open=True), "gradient clipping norm"),
    Setting("GRPO_LOGGING_STEPS", "1", Int(1), "optimizer steps between learning.log lines"),
    Setting("LORA_R", "32", Int(1), "LoRA rank"),
    Setting("LORA_ALPHA", "64", Int(1), "LoRA alpha (scale = alpha / r)"),
    Setting("LORA_DROPOUT", "0.05", Float(0, 1, hi_open=True), "LoRA dropout"),
    Setting("LORA_BIAS", "none", Choice("none", "all", "lora_only"), "which biases LoRA trains"),
    Setting("LORA_TARGET_MODULES", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", ModuleList, "modules LoRA adapts"),
    Setting("GRPO_MAX_STEPS", "-1", Int(-1), "stop after this many optimizer steps (-1: run the epochs)"),
    Setting("GRPO_SAVE_STEPS", "50", Int(1), "optimizer steps between checkpoints"),
    Setting("GRPO_SAVE_TOTAL_LIMIT", "3", Int(1), "checkpoints kept"),
    Setting("GRPO_SEED", "42", Int(0), "random seed"),
    Setting("GRPO_BETA", "0.0", Float(0), "KL coefficient (0: no reference model, less memory)"),
    Setting("GRPO_LOSS_TYPE", "dapo", Choice(*LOSS_TYPES), "TRL loss aggregation"),
    Setting("GRPO_SCALE_REWARDS", "group", Choice("group", "batch", "none"),
     "advantage = (reward - group mean) / std of: the group, the whole batch, or none (learning.log's "
     "frac_zero_std is the per-group share under all three)"),
    Setting("GRPO_WARMUP_RATIO", "0.0", Float(0, 1, hi_open=True), "fraction of steps spent warming up the LR"),
    Setting("GRPO_LR_SCHEDULER", "linear", Choice(*LR_SCHEDULERS), "learning-rate schedule"),
    Setting("GRPO_TOP_ENTROPY_QUANTILE", "1.0", Float(0, 1, lo_open=True), "train only on the top-entropy tokens (1.0: all)"),
    Setting("GRPO_MASK_TRUNCATED", "0", Flag, "1: truncated completions get no loss"),
    Setting("GRPO_REPORT_TO", "tensorboard", Choice("tensorboard", "wandb", "none"), "metric sink besides learning.log"),
    Setting("REWARD_CURRICULUM", "0", Flag, "1: syntax-first reward weights that shift to tests by epoch 1.0"),
    Setting("GRPO_AUTO_STOP", "1", Flag, "1: at epoch >= 1.0 save and stop when the stop criteria hold; 0: only warn"),
    Setting("GRPO_RESUME", "auto", Resume, "auto: resume from the last checkpoint-* in the output dir; never; or a path"),
    Setting("GRPO_USE_VLLM", "0", Flag, "1: generate with vLLM through TRL (pip install -r requirements-vllm.txt; CUDA only)"),
    Setting("GRPO_VLLM_MODE", "colocate", Choice("colocate", "server"),
     "colocate: vLLM shares the training GPUs; server: a separate `trl vllm-serve` process"),
    Setting("GRPO_VLLM_GPU_MEMORY", "0.3", Float(0, 1, lo_open=True), "colocate: share of GPU memory vLLM may take"),
    Setting("GRPO_VLLM_SERVER_URL", "http://localhost:8000", Text, "server mode: where `trl vllm-serve` listens"),
    Setting("GRPO_CONTINUOUS_BATCHING", "0", Flag, "1: transformers' paged continuous-batching generation (no vLLM needed)"),
    Setting("AUDIT_DATASET", "1", Flag, "1: drop problems whose tests cannot compile (cached); 0: only the prompt-length filter"),
    Setting("GRPO_PLUMBING", "0", Flag, "1: the plumbing run: offline, CPU, a tiny random model, bundled problems, "
                                        "~20 steps (proves the machinery runs; `train.py demo` is the one that learns)"),
    Setting("GRPO_TRACK_PROBLEMS", "1", Flag, "1: judge each problem by its last group (GRPO_LEARNABLE_*) and draw the ones "
                                       "whose last group taught nothing less often (GRPO_TRACK_WEIGHT); 0: TRL's order"),
    Setting("GRPO_TRACK_WEIGHT", "0.2", Float(0, 1), "with GRPO_TRACK_PROBLEMS=1: the draw weight of a problem whose last "
                                              "group taught nothing, against 1 for the others (0: never again)"),
    *SELECTION_SETTINGS,
    Setting("GRPO_INIT_ADAPTER", "", AdapterDir, "a LoRA adapter to continue (python train.py sft with SFT_LORA=1); "
                                          "its own LoRA settings replace LORA_*"),
]
PLUMBING_DEFAULTS = {  # GRPO_PLUMBING=1 replaces defaults and .envrc values, never the process environment
    "TRAINING_DATASET": "bundled", "GRPO_OUTPUT_DIR": "grpo_runs/demo", "GRPO_BATCH_SIZE": "2",
    "GRPO_NUM_GENERATIONS": "4", "GRPO_MAX_PROMPT": "4096", "GRPO_MAX_COMPLETION": "64", "GRPO_MAX_STEPS": "20",
    "GRPO_SAVE_STEPS": "10", "GRPO_LEARNING_RATE": "1e-4", "GRPO_TEMPERATURE": "1.0", "MIN_NON_EMPTY_LINES": "0",
    "GRPO_REPORT_TO": "none", "LORA_R": "8", "LORA_ALPHA": "16",
}

SETTINGS = CONFIG + REWARD_SETTINGS + SANDBOX_SETTINGS + AUDIT_SETTINGS

SFT_CONFIG = [
    Setting("SFT_OUTPUT_DIR", "sft_runs", Text, "where the SFT model/adapter, the split and the log go"),
    Setting("SFT_LORA", "1", Flag, "1: train a LoRA adapter (LORA_* settings; GRPO continues it with GRPO_INIT_ADAPTER); "
                                   "0: full fine-tune (GRPO starts from it with BASE_MODEL_ID)"),
    Setting("SFT_EPOCHS", "3.0", Float(0, lo_open=True), "epochs over the training split"),
    Setting("SFT_MAX_STEPS", "-1", Int(-1), "stop after this many optimizer steps (-1: run the epochs)"),
    Setting("SFT_BATCH_SIZE", "4", Int(1), "examples per optimizer step per device"),
    Setting("SFT_GRAD_ACCUM_STEPS", "1", Int(1), "gradient accumulation steps"),
    Setting("SFT_LEARNING_RATE", "1e-4", Float(0, 1, lo_open=True), "peak learning rate"),
    Setting("SFT_LR_SCHEDULER", "cosine", Choice(*LR_SCHEDULERS), "learning-rate schedule"),
    Setting("SFT_WARMUP_RATIO", "0.0", Float(0, 1, hi_open=True), "fraction of steps spent warming up the LR"),
    Setting("SFT_HOLDOUT", "0.1", Holdout, "problems never trained on (their loss is reported): a fraction, a count, "
                                           "or ids; chosen with GRPO_SEED"),
    Setting("SFT_STOP_LOSS", "0", Float(0), "stop once a logged training loss is below this (0: off); stopping at "
                                            "partial memorisation leaves GRPO groups with mixed rewards"),
]

RETIRED = {"REWARD_END_MARKER": "the END marker is fixed, (* END *) (ocaml_grpo/prompting.py), so that the "
                                "prompt and the reward cannot disagree; unset it",
           "GRPO_DEMO": "renamed GRPO_PLUMBING (the plumbing run on a random model; `python train.py demo` "
                        "is the demo that learns)"}
# Every variable train.py's commands read: a GRPO_/LORA_/REWARD_/SFT_ name outside it is a config error.
VARIABLES = tuple(s[0] for s in SETTINGS + SFT_CONFIG + AUDIT_SETTINGS)
