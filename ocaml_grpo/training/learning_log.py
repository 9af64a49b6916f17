"""The learning.log format, written by the trainer (callbacks.LearningLog) and read by analyze.py
for a run without metrics.jsonl: `#` header lines, one metric line per log step in the format of
the hand-written training analysis this project grew out of

    [Epoch 0.28]  loss=-0.0469  grad=0.0838  lr=3.58e-06  reward=0.102±0.077  syntax_rew=0.102±0.078  entropy=0.155  frac_zero_std=0.00

and [Health], [Stop], [Curriculum], [Groups], [Repair], [Dynamic] and [Engine] lines. `frac_zero_std` is the share of GRPO groups
whose rewards were all equal (the reward function's own count, group_kinds.py), whatever
GRPO_SCALE_REWARDS is; TRL's `frac_reward_zero_std` is the fallback (batch-wide under "batch").
A [Groups] line follows each metric line with the share of groups of each kind:

    [Groups] epoch 0.28  too_easy=0.00  too_hard=0.25  identical=0.00  mixed=0.75

Every line after the `#` lines is rendered from the run's records (metrics.py's StepRecord, kept
in metrics.jsonl): `render` rebuilds them from that file byte for byte. The live monitor and
analyze.py judge the records' unrounded values; a bare learning.log (a run older than
metrics.jsonl, or the hand-written analysis's lines) is read back here with the values it shows.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import fields, replace
from pathlib import Path

from ocaml_grpo.reward.parts import PARTS, Weights, weight
from ocaml_grpo.training.dynamic_sampling import DYNAMIC_KEYS
from ocaml_grpo.reward.group_kinds import KINDS
from ocaml_grpo.training.metrics import ENGINE_KEYS, REPAIR_KEYS, StepRecord

METRIC_RE = re.compile(r"^\[Epoch\s+([-+0-9.eE]+)\]\s+(.*)$")
FIELD_RE = re.compile(r"^([A-Za-z_][\w.]*)=(.*)$")
NUMBER_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf)", re.I)


# ----------------------------------------------------------------------------- writing

# The [Epoch] line's fields, in order: (its name in the line, the StepRecord field, format). A
# field whose record has a `<field>_std` shows as `mean±std`, read back as `<name>` and `<name>_std`.
LINE_FIELDS = (("loss", "loss", ".4f"), ("grad", "grad_norm", ".4f"), ("lr", "learning_rate", ".2e"),
               ("reward", "reward", ".3f"), ("syntax_rew", "syntax_rew", ".3f"), ("entropy", "entropy", ".3f"),
               ("frac_zero_std", "frac_zero_std", ".2f"))


def _fmt(v, spec: str) -> str:
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def metric_line(r: StepRecord) -> str:
    """The [Epoch] line of a log step."""
    def shown(name: str, attr: str, spec: str) -> str:
        std = f"±{_fmt(getattr(r, attr + '_std'), spec)}" if hasattr(r, attr + "_std") else ""
        return f"{name}={_fmt(getattr(r, attr), spec)}{std}"
    return f"[Epoch {r.epoch:.2f}]  " + "  ".join(shown(*f) for f in LINE_FIELDS)


def groups_line(r: StepRecord) -> str | None:
    """The [Groups] line of a log step; None when the reward function logged no group kinds."""
    if r.groups is None:
        return None
    return f"[Groups] epoch {r.epoch:.2f}  " + "  ".join(f"{k}={r.groups[k]:.2f}" for k in KINDS)


def repair_line(r: StepRecord) -> str | None:
    """The [Repair] line of a log step (GRPO_REPAIR_TURNS > 0): the share of completions solving
    every test at turn 1 and after the last turn, the mean turns, and the share of groups too hard
    at turn 1 and of those repair turned mixed. None without repair turns."""
    if r.repair is None:
        return None
    return f"[Repair] epoch {r.epoch:.2f}  " + "  ".join(f"{k}={_fmt(r.repair.get(k), '.2f')}" for k in REPAIR_KEYS)


def dynamic_line(r: StepRecord) -> str | None:
    """The [Dynamic] line of a log step (GRPO_DYNAMIC_SAMPLING=1): groups generated and kept (they
    teach), generation rounds, the trained batch's frac_zero_std (above 0 only at the cap), the
    groups dropped by kind (surplus: teaching groups beyond the batch's need), the share of the
    generated tokens in the trained batch. None without dynamic sampling."""
    if r.dynamic is None:
        return None
    return f"[Dynamic] epoch {r.epoch:.2f}  " + "  ".join(f"{k}={_fmt(r.dynamic.get(k), '.2f')}" for k in DYNAMIC_KEYS)


def engine_line(r: StepRecord) -> str | None:
    """The [Engine] line of a log step (GRPO_ENGINE=llamacpp): the mean importance-sampling ratio of
    the trainer's to the engine's probabilities, the share of ratios masked or clipped by its bound,
    and the mean per-token |log-probability gap|. None with another engine."""
    if r.engine is None:
        return None
    return f"[Engine] epoch {r.epoch:.2f}  " + "  ".join(
        f"{k}={_fmt(r.engine.get(k), '.3f')}" for k in ENGINE_KEYS)


def metric_lines(r: StepRecord) -> list[str]:
    """A log step's metrics as learning.log shows them: its [Epoch] line, its [Groups] line and,
    with repair turns, its [Repair] line, with dynamic sampling its [Dynamic] line, with the
    llama.cpp engine its [Engine] line."""
    return [metric_line(r)] + [g for g in [groups_line(r), repair_line(r), dynamic_line(r), engine_line(r)] if g]


def render(records: list[StepRecord]) -> list[str]:
    """learning.log's lines after its `#` lines, from metrics.jsonl's records: each step's metric
    lines, then what the monitor wrote about it (the record's notes)."""
    return [line for r in records for line in metric_lines(r) + r.notes]


# ----------------------------------------------------------------------------- reading

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


def curriculum_line(phase: str, epoch: float, w: Weights) -> str:
    return f"[Curriculum] phase {phase} from epoch {epoch:.2f}: " + "  ".join(
        f"{p.short} {weight(w, p):.2f}" for p in PARTS)


def stop_line(reasons: str, epoch: float) -> str:
    return f"[Stop] {reasons} at epoch {epoch:.2f}; checkpoint saved, training stopped (GRPO_AUTO_STOP=0 to only warn)"


def end_line(ended: str, step: int, epoch: float) -> str:
    return f"# {ended} at step {step}, epoch {epoch:.2f}, {time.strftime('%Y-%m-%d %H:%M:%S')}"


def parse_learning_log(path: Path) -> tuple[list[str], list[StepRecord], int]:
    """Return (header lines, the [Epoch] lines read back as records, skipped malformed/truncated
    metric lines)."""
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


# A line's field name -> the record's field (LINE_FIELDS' names where they differ; a `name±std`
# field fills `<field>` and `<field>_std`).
LINE_NAMES = {name: attr for name, attr, _ in LINE_FIELDS}
RECORD_FIELDS = {f.name for f in fields(StepRecord)} - {"step", "epoch", "session", "notes", "line", "extra", "groups",
                                                        "parts", "repair", "dynamic", "engine"}


def parse_metric_line(raw: str) -> StepRecord:
    """One `[Epoch ...]` line as a record with the values it shows (rounded as shown; "nan": a
    metric the trainer did not log); ValueError when it is malformed (e.g. cut in half)."""
    m = METRIC_RE.match(raw.strip())
    if not m:
        raise ValueError(raw)
    shown: dict[str, float] = {}
    extra: dict[str, float | str] = {}
    for tok in m.group(2).split():
        if not (fm := FIELD_RE.match(tok)):
            raise ValueError(tok)   # e.g. a token cut in half
        key, val = fm.groups()
        attr = LINE_NAMES.get(key, key)
        if "±" in val:
            mean, std = val.split("±", 1)
            pairs = [(attr, float(mean)), (attr + "_std", float(std))]
        elif NUMBER_RE.fullmatch(val):
            pairs = [(attr, float(val))]
        else:
            extra[key] = val
            continue
        for name, v in pairs:
            if name in RECORD_FIELDS:
                shown[name] = v
            else:
                extra[name] = v
    return StepRecord(0, float(m.group(1)), line=raw, extra=extra, **shown)


def series(records: list[StepRecord], attr: str) -> list[float]:
    """The values of `attr` (a StepRecord field or property) where logged, as logged (NaN kept)."""
    return [v for r in records if (v := getattr(r, attr)) is not None]
