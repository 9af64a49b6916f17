"""The reward's settings and vocabulary: its weights and curriculum, its settings table, and the
names its metrics are logged under. The policy that uses them, and the reward function, are in
rewards.py; the trainer's callbacks and configuration read them from here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ocaml_grpo.reward.parts import PARTS, Weights
from ocaml_grpo.config.settings import Auto, Float, Int, Setting, default_workers, resolve
from ocaml_grpo.config.sandbox import SANDBOX_SETTINGS
from ocaml_grpo.config.sandbox import SandboxConfig

@dataclass(frozen=True)
class RewardConfig:
    """The reward's settings. The field defaults are the only copy of the default values: the
    environment table below and --help read them from here. The END marker is not a setting: it is
    prompting.END_MARKER, the one the prompt asks for."""
    weights: Weights = field(default_factory=Weights)
    runaway_multiplier: float = 0.3
    min_lines: int = 8
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  # REWARD_WORKERS resolves per process
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # where and how the grader compiles and runs

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> "RewardConfig":
        """From values already validated by settings.resolve over REWARD_SETTINGS and
        SANDBOX_SETTINGS (train.py resolves them together with its own and passes its config here)."""
        return cls(Weights(**{p.name: values[p.setting] for p in PARTS}),
                   values["RUNAWAY_PENALTY_MULTIPLIER"], values["MIN_NON_EMPTY_LINES"], values["REWARD_WORKERS"],
                   SandboxConfig.from_settings(values))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "RewardConfig":
        """For the commands that read only the reward's and the sandbox's settings (rewards.py,
        evaluate.py, bench): the one place these are read from an environment."""
        values, errors = resolve(REWARD_SETTINGS + SANDBOX_SETTINGS, environ)
        if errors:
            raise ValueError("; ".join(errors))
        return cls.from_settings(values)


REWARD_SETTINGS = [
    Setting("MIN_NON_EMPTY_LINES", str(RewardConfig.min_lines), Int(0), "fewer code lines than this -> reward 0"),
    Setting("RUNAWAY_PENALTY_MULTIPLIER", str(RewardConfig.runaway_multiplier), Float(0, 1),
            "reward x this when a completion hits the max length without END"),
    *(Setting(p.setting, str(p.weight), Float(0), f"reward weight: {p.earned}") for p in PARTS),
    Setting("REWARD_WORKERS", "auto", Auto(Int(1), default_workers, "cores / training processes on this machine"),
            "parallel compiles per training process"),
]
