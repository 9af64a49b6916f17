"""The SFT warm start's settings (`python train.py sft`, ocaml_grpo/commands/sft.py): its own, and
the GRPO run's that mean the same there (SFT_REUSES)."""
from __future__ import annotations

from dataclasses import dataclass

from ocaml_grpo.config.grpo import LR_SCHEDULERS
from ocaml_grpo.config.settings import Choice, Flag, Float, Holdout, Int, Text, setting


@dataclass
class SftConfig:
    output_dir: str = setting("SFT_OUTPUT_DIR", "sft_runs", Text, "where the SFT model/adapter, the split and the log go")
    lora: bool = setting("SFT_LORA", "1", Flag,
                         "1: train a LoRA adapter (LORA_* settings; GRPO continues it with GRPO_INIT_ADAPTER); "
                         "0: full fine-tune (GRPO starts from it with BASE_MODEL_ID)")
    epochs: float = setting("SFT_EPOCHS", "3.0", Float(0, lo_open=True), "epochs over the training split")
    max_steps: int = setting("SFT_MAX_STEPS", "-1", Int(-1), "stop after this many optimizer steps (-1: run the epochs)")
    batch_size: int = setting("SFT_BATCH_SIZE", "4", Int(1), "examples per optimizer step per device")
    grad_accum_steps: int = setting("SFT_GRAD_ACCUM_STEPS", "1", Int(1), "gradient accumulation steps")
    learning_rate: float = setting("SFT_LEARNING_RATE", "1e-4", Float(0, 1, lo_open=True), "peak learning rate")
    lr_scheduler: str = setting("SFT_LR_SCHEDULER", "cosine", Choice(*LR_SCHEDULERS), "learning-rate schedule")
    warmup_ratio: float = setting("SFT_WARMUP_RATIO", "0.0", Float(0, 1, hi_open=True),
                                  "fraction of steps spent warming up the LR")
    holdout: float | int | list[str] = setting(
        "SFT_HOLDOUT", "0.1", Holdout, "problems never trained on (their loss is reported): a fraction, a count, "
                                       "or ids; chosen with GRPO_SEED")
    stop_loss: float = setting("SFT_STOP_LOSS", "0", Float(0), "stop once a logged training loss is below this (0: off); "
                                                               "stopping at partial memorisation leaves GRPO groups with mixed rewards")


# The GRPO run's variables (TrainConfig's) that mean the same in `train.py sft`: it reads them too.
SFT_REUSES = ("BASE_MODEL_ID", "TRAINING_DATASET", "GRPO_MAX_PROMPT", "GRPO_PROMPT_EXAMPLES", "GRPO_MAX_COMPLETION", "GRPO_SEED",
              "GRPO_LOGGING_STEPS", "GRPO_MAX_GRAD_NORM", "GRPO_REPORT_TO", "LORA_R", "LORA_ALPHA", "LORA_DROPOUT",
              "LORA_BIAS", "LORA_TARGET_MODULES")
