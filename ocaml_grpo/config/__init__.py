"""Every setting of the project, as typed records whose fields carry their definition (variable,
default, parser, meaning; ocaml_grpo/config/settings.py):

    Config.train     TrainConfig (grpo.py): the GRPO run, with .lora and .selection
    Config.reward    RewardConfig (scoring.py): the reward, with .sandbox (isolation.py: SandboxConfig, .limits)
    Config.audit     AuditConfig (grpo.py): the dataset audit's cache
    Config.sft       SftConfig (warm_start.py): `train.py sft`

`resolve(environ)` reads them all; a command that reads only some passes those (SETTINGS for
train.py, SFT_SETTINGS for `train.py sft`), and the other fields keep their defaults. Nothing here
imports a grader or torch: analyze.py reads the defaults from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ocaml_grpo.config.grpo import AUDIT_SETTINGS, PLUMBING_DEFAULTS, AuditConfig, SelectionConfig, TrainConfig  # noqa: F401
from ocaml_grpo.config.isolation import SANDBOX_SETTINGS, Limits, SandboxConfig  # noqa: F401
from ocaml_grpo.config.scoring import REWARD_SETTINGS, RewardConfig  # noqa: F401
from ocaml_grpo.config.settings import Setting, build, by_name, read, section, settings_of
from ocaml_grpo.config.warm_start import SFT_REUSES, SftConfig


@dataclass
class Config:
    train: TrainConfig = section(TrainConfig)
    reward: RewardConfig = section(RewardConfig)
    audit: AuditConfig = section(AuditConfig)
    sft: SftConfig = section(SftConfig)


# What train.py reads, validates and writes to config.json (its keys); analyze.py falls back to
# these defaults for a run directory without config.json.
SETTINGS = settings_of(TrainConfig) + settings_of(RewardConfig) + settings_of(AuditConfig)
# What `train.py sft` reads: its own, then the GRPO run's that mean the same.
SFT_SETTINGS = settings_of(SftConfig) + [s for s in settings_of(TrainConfig) if s.name in SFT_REUSES]
# Every variable the project reads: a GRPO_/LORA_/REWARD_/SFT_ name outside it is a config error.
EVERY_SETTING = settings_of(Config)
VARIABLES = tuple(s.name for s in EVERY_SETTING)
RETIRED = {"REWARD_END_MARKER": "the END marker is fixed, (* END *) (ocaml_grpo/prompting.py), so that the "
                                "prompt and the reward cannot disagree; unset it",
           "GRPO_DEMO": "renamed GRPO_PLUMBING (the plumbing run on a random model; `python train.py demo` "
                        "is the demo that learns)"}


def resolve(environ: Mapping[str, str], settings: Sequence[Setting] = EVERY_SETTING) -> tuple[Config, list[str]]:
    """The typed config from an environment, and one message per invalid value (naming the
    variable). Only `settings` are read; every other field keeps its default."""
    values, errors = read(settings, environ)
    return build(Config, values), errors


def recorded(cfg: Config, settings: Sequence[Setting] = SETTINGS) -> dict[str, Any]:
    """The values of `settings` by variable name: what config.json, the console and learning.log's
    header show."""
    values = dict(by_name(cfg))
    return {s.name: values[s.name] for s in settings}
