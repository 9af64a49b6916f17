"""The reward's settings and vocabulary: its weights and curriculum, its settings table, and the
names its metrics are logged under. The policy that uses them, and the reward function, are in
rewards.py; the trainer's callbacks and configuration read them from here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ocaml_grpo.settings import Auto, Float, Int, Setting, default_workers, resolve
from ocaml_sandbox import SANDBOX_SETTINGS, SandboxConfig

# What the reward function reports through TRL's log_metric (averaged over the processes and the
# reward calls of a log step); the trainer's learning log reads the last two for its health rules.
METRIC_COMPILED = "ocaml/compiled"
METRIC_SOLVED = "ocaml/tests_all_passed"
METRIC_END_MARKER = "ocaml/end_marker"
METRIC_PASSED_ANY = "ocaml/tests_passed_any"  # share of completions passing at least one test
METRIC_CRASHED = "ocaml/grading_crashed"  # share of completions whose grading raised (reward None)


@dataclass(frozen=True)
class Weights:
    structural: float = 0.05
    type_check: float = 0.20
    compile: float = 0.10
    tests: float = 0.65



# REWARD_CURRICULUM=1: learn syntax first, then correctness (by epoch). The last phase is the
# configured weights (REWARD_WEIGHT_*), the defaults unless they are set.
CURRICULUM = [
    (0.0, "syntax", Weights(0.10, 0.40, 0.30, 0.20)),
    (0.5, "transition", Weights(0.05, 0.25, 0.20, 0.50)),
    (1.0, "correctness", None),
]


def curriculum_phase(epoch: float, final: Weights = Weights()) -> tuple[str, Weights]:
    name, weights = CURRICULUM[0][1:]
    for start, n, w in CURRICULUM:
        if epoch >= start:
            name, weights = n, w or final
    return name, weights


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
        return cls(Weights(values["REWARD_WEIGHT_STRUCTURAL"], values["REWARD_WEIGHT_TYPE_CHECK"],
                           values["REWARD_WEIGHT_COMPILE"], values["REWARD_WEIGHT_TESTS"]),
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
    *(Setting(f"REWARD_WEIGHT_{part.upper()}", str(getattr(Weights, part)), Float(0), f"reward weight: {earned}")
      for part, earned in (("structural", "the END marker is in the completion"),
                           ("type_check", "the solution alone type-checks (graduated by error count)"),
                           ("compile", "the solution compiles (else half the share of phrases that compile)"),
                           ("tests", "x the fraction of assertions passed, when the program links with the tests"))),
    Setting("REWARD_WORKERS", "auto", Auto(Int(1), default_workers, "cores / training processes on this machine"),
            "parallel compiles per training process"),
]
