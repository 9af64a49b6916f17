"""The run's machine-readable record: metrics.jsonl in the output directory, one `StepRecord` per
log step, appended by the trainer's callback (callbacks.LearningLog) through jsonl.py.

A log step has this one type: learning.log's lines are rendered from it (learning_log.py), a bare
learning.log's [Epoch] lines are read back into it (with the line as shown), and the live health
monitor, analyze.py's report and its plots read it. The values are
TRL's and the reward function's as logged (unrounded; a NaN stays NaN, a metric not logged is
null). pandas reads the file as it is: `pd.read_json(path, lines=True)`, a column per field, the
group kinds as `groups_<kind>` and the reward's parts as `part_<name>`; `stub`, the share of
answers whose tests ran and whose calls never returned a value (grader.Grade.stub), `constant`, of
those whose calls all gave back one value for different arguments (grader.Grade.constant);
`step_time`, the seconds a step took (generation, grading, forward and backward); with dynamic sampling, its
figures under their own names (`groups_generated`, `frac_zero_std_trained`, ...: dynamic_sampling.DYNAMIC_KEYS);
with the llama.cpp engine, its agreement with the trainer as `engine_is_ratio`, `engine_clipped_share`
and `engine_logp_gap`. `rss_gb` and `peak_rss_gb` are the training process's resident memory at the
log step and its peak so far (Linux; null elsewhere): a leak shows as a climb over a long run.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from ocaml_grpo.reward.parts import (METRIC_COMPILED, METRIC_CRASHED, METRIC_END_MARKER, METRIC_PASSED_ANY,
                                     METRIC_STUB, METRIC_CONSTANT, METRIC_REPAIR_PASS_FINAL, METRIC_REPAIR_PASS_FIRST, METRIC_REPAIR_RESCUED,
                                     METRIC_REPAIR_TOO_HARD_FIRST, METRIC_REPAIR_TURNS, METRIC_SOLVED, PARTS)
from ocaml_grpo.training.dynamic_sampling import DYNAMIC_KEYS, METRIC_DYNAMIC
from ocaml_grpo.reward.group_kinds import KINDS, METRIC_FRAC_ZERO_STD, METRIC_GROUP

METRICS_FILE = "metrics.jsonl"

# A record's field: the key TRL's logs (or the reward function's log_metric) give it under.
FROM_LOGS = {
    "loss": "loss", "grad_norm": "grad_norm", "learning_rate": "learning_rate",
    "reward": "reward", "reward_std": "reward_std",
    "syntax_rew": "rewards/syntax_aware_reward/mean", "syntax_rew_std": "rewards/syntax_aware_reward/std",
    "entropy": "entropy", "kl": "kl",
    "clip_ratio": "clip_ratio/region_mean",             # tokens whose probability ratio was clipped
    "clipped_ratio": "completions/clipped_ratio",       # completions cut at GRPO_MAX_COMPLETION
    "completion_length": "completions/mean_length",
    "compiled": METRIC_COMPILED, "solved": METRIC_SOLVED, "end_marker": METRIC_END_MARKER,
    "passed_any": METRIC_PASSED_ANY, "crashed": METRIC_CRASHED, "stub": METRIC_STUB,
    "constant": METRIC_CONSTANT,
    "step_time": "step_time",
}

# Repair turns' metrics (GRPO_REPAIR_TURNS > 0), as `repair_<key>` columns.
REPAIR_FROM_LOGS = {"pass_turn1": METRIC_REPAIR_PASS_FIRST, "pass_final": METRIC_REPAIR_PASS_FINAL,
                    "turns": METRIC_REPAIR_TURNS, "too_hard_turn1": METRIC_REPAIR_TOO_HARD_FIRST,
                    "too_hard_to_mixed": METRIC_REPAIR_RESCUED}
REPAIR_KEYS = tuple(REPAIR_FROM_LOGS)

# The llama.cpp engine's agreement with the trainer (GRPO_ENGINE=llamacpp), as `engine_<key>` columns:
# TRL's mean importance-sampling ratio and mean per-token |log-probability gap|, and the share of
# ratios its bound masked or clipped (trainer.clipped_share).
METRIC_IS_CLIPPED = "sampling/importance_sampling_ratio/clipped_share"
ENGINE_FROM_LOGS = {"is_ratio": "sampling/importance_sampling_ratio/mean", "clipped_share": METRIC_IS_CLIPPED,
                    "logp_gap": "sampling/sampling_logp_difference/mean"}
ENGINE_KEYS = tuple(ENGINE_FROM_LOGS)


def process_memory(status: str = "/proc/self/status") -> tuple[float | None, float | None]:
    """This process's resident memory now and its peak, in GB, from the kernel (VmRSS, VmHWM);
    (None, None) where there is no /proc."""
    try:
        fields_kb = dict(line.split(":", 1) for line in open(status, encoding="ascii") if ":" in line)
        gb = lambda key: int(fields_kb[key].split()[0]) * 1024 / 1e9  # noqa: E731
        return gb("VmRSS"), gb("VmHWM")
    except (OSError, KeyError, ValueError):
        return None, None


@dataclass
class StepRecord:
    """One log step. Shares (compiled ... crashed, the groups) are of the step's completions and groups.
    None: not logged."""
    step: int                           # 0: read back from a bare learning.log line, which shows no step
    epoch: float
    session: str | int = ""             # the training session (start or resume) that logged it; read back
                                        # from learning.log: the sessions before its line
    loss: float | None = None
    grad_norm: float | None = None
    learning_rate: float | None = None
    reward: float | None = None
    reward_std: float | None = None
    syntax_rew: float | None = None     # the reward function's own mean and std (TRL's per-function metrics)
    syntax_rew_std: float | None = None
    entropy: float | None = None
    frac_zero_std: float | None = None  # share of groups with identical rewards (learning_log.frac_zero_std)
    kl: float | None = None
    clip_ratio: float | None = None
    clipped_ratio: float | None = None
    completion_length: float | None = None
    compiled: float | None = None
    solved: float | None = None
    end_marker: float | None = None
    passed_any: float | None = None
    crashed: float | None = None
    stub: float | None = None           # answers whose tests ran and whose calls never returned a value
    constant: float | None = None       # answers whose calls gave back one value for different arguments
    step_time: float | None = None      # seconds a step took: generation, grading, forward and backward (TRL's)
    groups: dict[str, float] | None = None  # group kind -> share (group_kinds.KINDS); None: not logged
    parts: dict[str, float] = field(default_factory=dict)  # reward part -> its mean (reward/parts.py)
    repair: dict[str, float | None] | None = None  # REPAIR_KEYS -> value; None: no repair turns
    # dynamic_sampling.DYNAMIC_KEYS -> value (GRPO_DYNAMIC_SAMPLING=1); None: every generated group trained on
    dynamic: dict[str, float | None] | None = None
    engine: dict[str, float | None] | None = None  # ENGINE_KEYS -> value (GRPO_ENGINE=llamacpp); None: not logged
    rss_gb: float | None = None         # the training process's resident memory at the log step, GB
    peak_rss_gb: float | None = None    # and its peak so far (the kernel's high-water mark)
    notes: list[str] = field(default_factory=list)  # the monitor's lines after the metrics ([Health] ...)
    # Read back from a bare learning.log only (not in metrics.jsonl): the [Epoch] line as it was
    # shown, and the fields it shows that no other field holds (numbers, or text kept as written).
    line: str = ""
    extra: dict[str, float | str] = field(default_factory=dict)

    @property
    def logp_gap(self) -> float | None:
        """The llama.cpp engine's mean per-token |log-probability gap| to the trainer (ENGINE_KEYS)."""
        return (self.engine or {}).get("logp_gap")

    @property
    def clipped_share(self) -> float | None:
        """The share of the engine's importance ratios its bound masked or clipped (ENGINE_KEYS)."""
        return (self.engine or {}).get("clipped_share")

    @classmethod
    def from_logs(cls, step: int, epoch: float, logs: Mapping[str, Any], session: str = "") -> "StepRecord | None":
        """The record of a log step from the trainer's logs; None for a log that is not a training
        step (the end-of-training summary, an eval log)."""
        if "loss" not in logs or "reward" not in logs:
            return None
        value = lambda key: None if logs.get(key) is None else float(logs[key])  # noqa: E731
        groups = {k: value(METRIC_GROUP[k]) for k in KINDS} if all(METRIC_GROUP[k] in logs for k in KINDS) else None
        # the reward function's per-group count, else TRL's (per group only under scale_rewards="group"/"none")
        fzs = value(METRIC_FRAC_ZERO_STD) if METRIC_FRAC_ZERO_STD in logs else value("frac_reward_zero_std")
        return cls(int(step), float(epoch), session, **{f: value(k) for f, k in FROM_LOGS.items()},
                   frac_zero_std=fzs, groups=groups,
                   parts={p.name: value(p.metric) for p in PARTS if p.metric in logs},
                   repair={k: value(m) for k, m in REPAIR_FROM_LOGS.items()} if METRIC_REPAIR_TURNS in logs else None,
                   dynamic={k: value(m) for k, m in METRIC_DYNAMIC.items()}
                   if METRIC_DYNAMIC["generation_rounds"] in logs else None,
                   engine={k: value(m) for k, m in ENGINE_FROM_LOGS.items()}
                   if ENGINE_FROM_LOGS["is_ratio"] in logs else None)

    def to_json(self) -> dict[str, Any]:
        """One metrics.jsonl line: flat, so that each group kind and each part is a column."""
        out = {k: v for k, v in asdict(self).items() if k not in ("groups", "parts", "repair", "dynamic", "engine", "notes", "line", "extra")}
        out |= {f"groups_{k}": v for k, v in (self.groups or {}).items()}
        out |= {f"part_{k}": v for k, v in self.parts.items()}
        out |= {f"repair_{k}": v for k, v in (self.repair or {}).items()}
        out |= self.dynamic or {}  # as they are named: groups_generated, frac_zero_std_trained, ...
        out |= {f"engine_{k}": v for k, v in (self.engine or {}).items()}
        return out | {"notes": self.notes}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "StepRecord":
        known = {f.name for f in fields(cls)} - {"groups", "parts", "repair", "dynamic", "engine", "line", "extra"}
        groups = {k: d[f"groups_{k}"] for k in KINDS} if all(f"groups_{k}" in d for k in KINDS) else None
        repair = {k: d.get(f"repair_{k}") for k in REPAIR_KEYS} if "repair_turns" in d else None
        dynamic = {k: d.get(k) for k in DYNAMIC_KEYS} if "generation_rounds" in d else None
        engine = {k: d.get(f"engine_{k}") for k in ENGINE_KEYS} if "engine_is_ratio" in d else None
        return cls(**{k: v for k, v in d.items() if k in known}, groups=groups,
                   parts={p.name: d[f"part_{p.name}"] for p in PARTS if f"part_{p.name}" in d}, repair=repair,
                   dynamic=dynamic, engine=engine)
