"""The learning.log format, written by the trainer (callbacks.LearningLog) and read by analyze.py:
`#` header lines, one metric line per log step in the format of the hand-written training analysis
this project grew out of

    [Epoch 0.28]  loss=-0.0469  grad=0.0838  lr=3.58e-06  reward=0.102±0.077  syntax_rew=0.102±0.078  entropy=0.155  frac_zero_std=0.00

and [Health], [Stop], [Curriculum] and [Groups] lines. `frac_zero_std` is the share of GRPO groups
whose rewards were all equal (the reward function's own count, group_stats.py), whatever
GRPO_SCALE_REWARDS is; TRL's `frac_reward_zero_std` is the fallback (batch-wide under "batch").
A [Groups] line follows each metric line with the share of groups of each kind:

    [Groups] epoch 0.28  too_easy=0.00  too_hard=0.25  identical=0.00  mixed=0.75

The live monitor judges the line it has just written, parsed back the way analyze.py parses it,
so the rules see the same (rounded) numbers live and afterwards.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ocaml_grpo.training.group_kinds import KINDS, METRIC_FRAC_ZERO_STD, METRIC_GROUP
from ocaml_grpo.training.health import Point

METRIC_RE = re.compile(r"^\[Epoch\s+([-+0-9.eE]+)\]\s+(.*)$")
FIELD_RE = re.compile(r"^([A-Za-z_][\w.]*)=(.*)$")
NUMBER_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf)", re.I)


# ----------------------------------------------------------------------------- writing

def _fmt(v, spec: str) -> str:
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def metric_line(epoch: float, logs: dict) -> str:
    """One line from the trainer's logs at a log step (TRL's metric names)."""
    return (f"[Epoch {epoch:.2f}]  loss={_fmt(logs.get('loss'), '.4f')}  grad={_fmt(logs.get('grad_norm'), '.4f')}  "
            f"lr={_fmt(logs.get('learning_rate'), '.2e')}  "
            f"reward={_fmt(logs.get('reward'), '.3f')}±{_fmt(logs.get('reward_std'), '.3f')}  "
            f"syntax_rew={_fmt(logs.get('rewards/syntax_aware_reward/mean'), '.3f')}"
            f"±{_fmt(logs.get('rewards/syntax_aware_reward/std'), '.3f')}  "
            f"entropy={_fmt(logs.get('entropy'), '.3f')}  frac_zero_std={_fmt(frac_zero_std(logs), '.2f')}")


def frac_zero_std(logs: dict) -> float | None:
    """The per-group share with identical rewards: the reward function's own, else TRL's (per group
    only under scale_rewards="group" or "none")."""
    return logs.get(METRIC_FRAC_ZERO_STD, logs.get("frac_reward_zero_std"))


def groups_line(epoch: float, logs: dict) -> str | None:
    """The [Groups] line of a log step; None when the reward function logged no group kinds."""
    if not all(METRIC_GROUP[k] in logs for k in KINDS):
        return None
    return f"[Groups] epoch {epoch:.2f}  " + "  ".join(f"{k}={logs[METRIC_GROUP[k]]:.2f}" for k in KINDS)


# ----------------------------------------------------------------------------- reading

@dataclass
class LogLine:
    epoch: float
    raw: str
    values: dict[str, float]            # reward=0.1±0.07 -> values["reward"], values["reward_std"]
    text: dict[str, str] = field(default_factory=dict)   # non-numeric extra fields, kept as-is
    session: int = 0                    # training sessions (a start or a resume) before this line
    @property
    def point(self) -> Point:
        def logged(key: str) -> float | None:
            # "nan" stands for a metric the trainer did not log; loss and grad keep it (a
            # non-finite value there is itself a finding).
            v = self.values.get(key)
            return None if v is None or math.isnan(v) else v

        return Point(self.epoch, logged("reward"), logged("reward_std"), logged("frac_zero_std"), logged("entropy"),
                     self.values.get("grad"), self.values.get("loss"))


# The other line kinds, written by the trainer's callback (ocaml_grpo/training/callbacks.py decides when).
HEADER_CONFIG = ("GRPO_BATCH_SIZE", "GRPO_GRAD_ACCUM_STEPS", "GRPO_NUM_GENERATIONS", "GRPO_MAX_PROMPT",
                 "GRPO_MAX_COMPLETION", "GRPO_NUM_EPOCHS", "GRPO_LEARNING_RATE", "GRPO_TEMPERATURE", "GRPO_BETA",
                 "GRPO_LOSS_TYPE", "LORA_R", "LORA_ALPHA", "REWARD_CURRICULUM", "MIN_NON_EMPTY_LINES",
                 "RUNAWAY_PENALTY_MULTIPLIER", "GRPO_SCALE_REWARDS", "GRPO_TRACK_PROBLEMS", "GRPO_PROBLEM_STATS")


def header_lines(resumed_from: str | None, cfg: dict, n_problems: int, grader: str) -> list[str]:
    """A session's `#` lines: `# started` or `# resumed from` (analyze.py counts sessions by them)."""
    return ["# " + h for h in (
        f"{'resumed from ' + resumed_from if resumed_from else 'started'} {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"model: {cfg['BASE_MODEL_ID']}", f"dataset: {cfg['TRAINING_DATASET']} ({n_problems} problems)",
        f"reward grader: {grader}", "config: " + "  ".join(f"{k}={cfg[k]}" for k in HEADER_CONFIG))]


def health_line(message: str) -> str:
    return f"[Health] {message}"


def curriculum_line(phase: str, epoch: float, w) -> str:
    return (f"[Curriculum] phase {phase} from epoch {epoch:.2f}: structural {w.structural:.2f}  "
            f"type {w.type_check:.2f}  compile {w.compile:.2f}  tests {w.tests:.2f}")


def stop_line(reasons: str, epoch: float) -> str:
    return f"[Stop] {reasons} at epoch {epoch:.2f}; checkpoint saved, training stopped (GRPO_AUTO_STOP=0 to only warn)"


def end_line(ended: str, step: int, epoch: float) -> str:
    return f"# {ended} at step {step}, epoch {epoch:.2f}, {time.strftime('%Y-%m-%d %H:%M:%S')}"


def parse_learning_log(path: Path) -> tuple[list[str], list[LogLine], int]:
    """Return (header lines, metric lines, skipped malformed/truncated metric lines)."""
    raw_lines = Path(path).read_text(encoding="utf-8", errors="replace").split("\n")
    # The trainer writes whole lines; text after the last "\n" is a line still being written.
    skipped = 1 if raw_lines[-1].strip() else 0
    header, out, session = [], [], 0
    for raw in raw_lines[:-1]:
        raw = raw.rstrip("\r")
        if raw.startswith("#"):
            header.append(raw)
            session += raw.startswith(("# started", "# resumed"))
            continue
        if not METRIC_RE.match(raw.strip()):  # [Health], [Stop], blank and other lines are not metrics
            continue
        try:
            out.append(replace(parse_metric_line(raw), session=session))
        except ValueError:
            skipped += 1
    return header, out, skipped


def parse_metric_line(raw: str) -> LogLine:
    """One `[Epoch ...]` line; ValueError when it is malformed (e.g. cut in half)."""
    m = METRIC_RE.match(raw.strip())
    if not m:
        raise ValueError(raw)
    values, text = {}, {}
    for tok in m.group(2).split():
        if not (fm := FIELD_RE.match(tok)):
            raise ValueError(tok)   # e.g. a token cut in half
        key, val = fm.groups()
        if "±" in val:
            mean, std = val.split("±", 1)
            values[key], values[key + "_std"] = float(mean), float(std)
        elif NUMBER_RE.fullmatch(val):
            values[key] = float(val)
        else:
            text[key] = val
    return LogLine(float(m.group(1)), raw, values, text)


def series(lines: list[LogLine], key: str) -> list[float]:
    return [l.values[key] for l in lines if key in l.values]
