"""The reward's settings: its weights, the line gate, the runaway penalty, its workers, and the
sandbox it grades in. The policy that uses them, and the reward function, are in rewards.py; the
reward's parts and metric names are in ocaml_grpo/reward/parts.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from ocaml_grpo.config.isolation import SandboxConfig
from ocaml_grpo.config.settings import Auto, Float, Int, Setting, default_workers, group, section, setting, settings_of
from ocaml_grpo.reward.parts import PARTS, Weights

# Each part's weight, by Weights' field: one setting per part of the reward (reward/parts.py).
WEIGHT_SETTINGS = {p.name: Setting(p.setting, str(p.weight), Float(0), f"reward weight: {p.earned}") for p in PARTS}


@dataclass(frozen=True)
class RewardConfig:
    """The reward's settings. The END marker is not a setting: it is prompting.END_MARKER, the one
    the prompt asks for."""
    min_lines: int = setting("MIN_NON_EMPTY_LINES", "8", Int(0), "fewer code lines than this -> reward 0 (no code at all always scores 0)")
    runaway_multiplier: float = setting("RUNAWAY_PENALTY_MULTIPLIER", "0.3", Float(0, 1),
                                        "reward x this when a completion hits the max length without END")
    weights: Weights = group(Weights, WEIGHT_SETTINGS)
    workers: int = setting("REWARD_WORKERS", "auto", Auto(Int(1), default_workers, "cores / training processes on this machine"),
                           "parallel compiles per training process")
    sandbox: SandboxConfig = section(SandboxConfig)  # where and how the grader compiles and runs


REWARD_SETTINGS = settings_of(RewardConfig, sections=False)  # the reward's own: the sandbox's are SANDBOX_SETTINGS
