"""What each GRPO group can teach: the kind of a group of completions for one problem, and the
problem tracker that remembers each problem's last kind.

GRPO's advantage is a completion's reward minus its group's mean: a group whose rewards are all
equal teaches nothing. Which way they are equal says what to do about it, so every group gets a
kind (the same words name a problem's state in the tracker, a dropped problem's reason in
selection.py, and the remedies in analyze.py):

    too_easy   identical rewards, every completion passed every test
    too_hard   identical rewards, no completion passed any test
    identical  identical rewards otherwise (e.g. all compile, all fail the same test)
    mixed      the rewards differ: the group teaches

Rewards are partial credit, so "learnable" means "the rewards differ", not "some pass, some fail"
(a group where none passes but some compile is mixed, and teaches). How much they must differ is
a setting (GRPO_LEARNABLE_MIN_STD, `learnable`): GRPO divides each advantage by the group's std,
so a group whose rewards differ by a stray END marker (std 0.01) pushes as hard as one where half
the answers pass, and teaches only noise. The logs count the kinds exactly (std 0, as TRL's
frac_reward_zero_std does); the selection and the tracker judge with the threshold.

Pure Python, no torch: the reward function, the trainer's sampler, the probe and analyze.py share it.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence


KINDS = ("too_easy", "too_hard", "identical", "mixed")
ZERO_VARIANCE = KINDS[:3]
UNSEEN = "unseen"  # a problem's state before its first group
STATES = (UNSEEN,) + KINDS
TRACKING_FILE = "problem_tracking.jsonl"  # under <output dir>/reward_logs/, archived with the other reward logs

# What the reward function reports per step through TRL's log_metric (shares of the step's groups).
METRIC_FRAC_ZERO_STD = "ocaml/frac_zero_std"  # per-group share with identical rewards, whatever the reward scaling
METRIC_GROUP = {kind: f"ocaml/groups_{kind}" for kind in KINDS}
TITLES = {"too_hard": "Zero-variance groups: problems too hard", "too_easy": "Zero-variance groups: problems too easy",
          "identical": "Mode collapse: identical rewards", None: "Zero-variance groups"}


@dataclass(frozen=True)
class GroupStat:
    """One group: the completions of one problem in one step."""
    problem_id: str
    kind: str
    size: int                           # completions with a reward (grading crashes left out, as TRL does)
    reward_mean: float
    reward_std: float                   # population std of the scored rewards
    solved: float                       # share passing every test
    passed_any: float                   # share passing at least one test


def has_spread(rewards: Sequence[float]) -> bool:
    """Whether a group's scored rewards differ: its completions get advantages. Fewer than 2 scored
    completions: no advantage either."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > 1e-9


def group_kind(rewards: Sequence[float], solved: Sequence[bool], passed_any: Sequence[bool]) -> str:
    """The kind of one group (the module docstring)."""
    if has_spread(rewards):
        return "mixed"
    if solved and all(solved):
        return "too_easy"
    if not any(passed_any):
        return "too_hard"
    return "identical"


def learnable(reward_std: float, solved: float, passed_any: float, min_std: float, max_solved: float) -> str:
    """'mixed' when a problem's rewards (a probe's k samples, or its last group) differ enough to
    teach, else the reason they do not: too_easy (solved share >= max_solved), too_hard (std
    below min_std, no test passed), identical (std below min_std otherwise)."""
    if solved >= max_solved:
        return "too_easy"
    if reward_std < max(min_std, 1e-9):
        return "too_hard" if passed_any == 0 else "identical"
    return "mixed"


def group_stat(problem_id: str, rewards: Sequence[float | None], solved: Sequence[bool],
               passed_any: Sequence[bool]) -> GroupStat:
    scored = [i for i, r in enumerate(rewards) if r is not None]
    rs = [float(rewards[i]) for i in scored]
    sv, pa = [solved[i] for i in scored], [passed_any[i] for i in scored]
    n = max(1, len(scored))
    return GroupStat(problem_id, group_kind(rs, sv, pa), len(scored), round(statistics.fmean(rs), 6) if rs else 0.0,
                     round(statistics.pstdev(rs), 6) if len(rs) > 1 else 0.0, sum(sv) / n, sum(pa) / n)


def kind_shares(groups: Sequence[GroupStat]) -> dict[str, float]:
    counts = Counter(g.kind for g in groups)
    return {kind: counts[kind] / max(1, len(groups)) for kind in KINDS}


def states_over_time(events: Sequence[dict], problem_ids: Iterable[str] = ()) -> list[tuple[int, dict[str, int]]]:
    """(step, problems in each state after that step) from a tracking file's events, in step
    order; `problem_ids` adds problems never drawn (they stay unseen)."""
    states: dict[str, str] = {}  # each problem's verdict on its last group (a line's own, else learnable's)
    out = []
    known = set(problem_ids) | {str(e["problem_id"]) for e in events}
    by_step: dict[int, list[dict]] = {}
    for e in events:
        by_step.setdefault(int(e["step"]), []).append(e)
    for step in sorted(by_step):
        for e in by_step[step]:
            g = event_stat(e)
            states[g.problem_id] = e.get("state") or learnable(g.reward_std, g.solved, g.passed_any, 0.0, 1.0)
        c = Counter(states.get(p, UNSEEN) for p in known)
        out.append((step, {s: c[s] for s in STATES}))
    return out


def event_stat(event: dict) -> GroupStat:
    """A tracking file's line back into its group."""
    return GroupStat(**{k: event[k] for k in GroupStat.__dataclass_fields__})
