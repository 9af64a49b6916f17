"""analyze.py's advice: the exports that address a run's findings.

Each export is computed from the run's own config (or the trainer's defaults) and states the figure
it rests on, with the threshold that figure crossed. None repeats a setting the run already has at
that value. Where the figures cannot tell which remedy fits (groups with identical rewards, their
kind unknown: too hard, too easy and identical ask for different remedies), there is no export;
the finding says what would tell.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ocaml_grpo.report.groups import GroupReport
from ocaml_grpo.report.outcomes import PASS_ANY, RUNAWAY, BreakdownStats
from ocaml_grpo.training.metrics import StepRecord
from ocaml_grpo.training.health import Finding, Thresholds, expected_reward, mean, recent, values, zero_std_rolled


DYNAMIC_MIN_MIXED = 0.25  # share of groups that teach below which dynamic sampling would mostly hit its cap


@dataclass
class Action:
    var: str
    value: str
    reason: str
    first: str = ""  # a command that must run before the export (the one that writes the file it names)

    @property
    def line(self) -> str:
        return f"export {self.var}={self.value}"


def cfg_float(config: dict, key: str) -> float | None:
    try:
        return float(config[key])
    except (KeyError, TypeError, ValueError):
        return None


def same_value(current, value: str) -> bool:
    """Whether a setting as config.json holds it (a bool, a number, a string) is `value` as exported."""
    if current is None:
        return False
    if isinstance(current, bool):
        current = int(current)
    try:
        return float(current) == float(value)
    except (TypeError, ValueError):
        return str(current) == value


def zero_std_figure(points: Sequence[StepRecord], th: Thresholds) -> str:
    """The frac_zero_std figure the zero-variance finding rests on, with the threshold it crossed."""
    win = values(recent(points, th), "frac_zero_std")
    rolled = zero_std_rolled(win, th)
    if rolled is not None and rolled >= th.zero_std_critical:
        return (f"frac_zero_std's {min(th.zero_std_smooth, len(win))}-step rolling mean reached {rolled:.2f} over the "
                f"last {len(win)} log steps (≥ {th.zero_std_critical:.2f})")
    return f"frac_zero_std {mean(win) or 0.0:.2f} over the last {len(win)} log steps (≥ {th.zero_std_healthy:.2f})"


def kind_figure(g: GroupReport) -> str:
    return (f"{g.dominant} {g.kinds[g.dominant]} of {g.zero_variance} zero-variance groups "
            f"({sum(g.kinds.values())} groups in the breakdown log)")


def actions(findings: list[Finding], config: dict, bd: BreakdownStats | None, groups: GroupReport,
            points: Sequence[StepRecord], th: Thresholds) -> list[Action]:
    """Exact exports, computed from the config in use; none for a variable the config lacks."""
    keys = {f.key: f for f in findings}
    temp, gens = cfg_float(config, "GRPO_TEMPERATURE"), cfg_float(config, "GRPO_NUM_GENERATIONS")
    lr, maxc = cfg_float(config, "GRPO_LEARNING_RATE"), cfg_float(config, "GRPO_MAX_COMPLETION")
    # Zero variance: the remedy follows its kind (report/groups.py); unknown kind: no remedy.
    zero_kind = groups.dominant if "zero_std" in keys else None
    zero = f"{zero_std_figure(points, th)}; {kind_figure(groups)}" if zero_kind else ""
    collapsed = "entropy" in keys and keys["entropy"].severity == "critical"
    acts = []
    if zero_kind == "identical" or collapsed:
        why = zero if zero_kind == "identical" else (
            f"recent mean entropy {mean(values(recent(points, th), 'entropy')):.3f} (< {th.entropy_collapse})")
        if temp is not None and temp < th.max_temperature:
            acts.append(Action("GRPO_TEMPERATURE", f"{round(temp + 0.2, 2):g}",
                               f"from {temp:g}: {why}; more diverse samples, so rewards differ within a group"))
        if gens is not None:
            acts.append(Action("GRPO_NUM_GENERATIONS", str(int(gens) + 2),
                               f"from {int(gens)}: {why}; more samples per prompt, better odds one of them differs"))
    if "reward" in keys and lr is not None and "grad" not in keys:
        epoch = points[-1].epoch
        grad = [g for g in values(points, "grad_norm") if math.isfinite(g)]
        band = (f", grad norm {min(grad):.4f} - {max(grad):.4f} (within {th.grad_low} - {th.grad_high})" if grad else "")
        acts.append(Action("GRPO_LEARNING_RATE", f"{float(f'{lr * 1.6:.2g}'):g}",
                           f"from {lr:g}: recent mean reward {mean(values(recent(points, th), 'reward')):.3f} vs "
                           f"{expected_reward(epoch, th):.3f} expected at epoch {epoch:g}{band}"))
    if "runaway" in keys and maxc is not None:
        acts.append(Action("GRPO_MAX_COMPLETION", str(int(math.ceil(maxc * 1.25 / 64) * 64)),
                           f"from {int(maxc)}: {bd.shares[RUNAWAY]:.0%} of completions hit the length limit "
                           f"(≥ {th.runaway_share_max:.0%})"))
    if bd is not None and bd.shares[PASS_ANY] == 0:
        acts.append(Action("REWARD_CURRICULUM", "1",
                           f"0 of {bd.n} scored completions passed a test: weight syntax/compile first"))
    if zero_kind in ("too_hard", "too_easy"):
        if not config.get("GRPO_PROBLEM_STATS"):
            acts.append(Action("GRPO_PROBLEM_STATS", "probe.jsonl", f"{zero}: train on the learnable problems, which "
                               "the probe finds", first="python evaluate.py --probe probe.jsonl"))
        if config.get("GRPO_TRACK_PROBLEMS") in (False, 0, "0"):
            acts.append(Action("GRPO_TRACK_PROBLEMS", "1", f"{zero}: draw the problems whose last group taught "
                               "nothing less often"))
    if zero_kind == "too_hard":
        if not config.get("GRPO_REPAIR_TURNS"):
            acts.append(Action("GRPO_REPAIR_TURNS", "1", f"{zero}: let the model read the compiler's diagnosis and the "
                               "prompt's examples and answer again (repair turns)"))
        if not any(a.var == "REWARD_CURRICULUM" for a in acts):
            acts.append(Action("REWARD_CURRICULUM", "1", f"{zero}: partial credit first"))
    # Dynamic sampling replaces a step's groups that teach nothing with new ones: worth it where
    # enough groups teach that a few rounds fill a batch (a share p needs about 1/p rounds; the cap's
    # default allows 4), and where the run does not already have it.
    total = sum(groups.kinds.values())
    mixed = groups.kinds.get("mixed", 0) / total if total else 0.0
    if "zero_std" in keys and groups.dominant and mixed >= DYNAMIC_MIN_MIXED:
        acts.append(Action("GRPO_DYNAMIC_SAMPLING", "1",
                           f"{zero_std_figure(points, th)}; {groups.kinds['mixed']} of {total} groups had rewards that "
                           f"differ ({mixed:.0%} ≥ {DYNAMIC_MIN_MIXED:.0%}): each step can drop its groups that teach "
                           f"nothing and generate new ones, about {1 / mixed:.1f} rounds of generation per batch"))
    # What the run already has is no advice (a too-hard run with repair turns on keeps them, say).
    return [a for a in acts if not same_value(config.get(a.var), a.value)]
