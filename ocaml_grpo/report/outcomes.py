"""analyze.py's part on what the scored completions came to, from the breakdown log
(reward_logs/syntax_aware_breakdown.jsonl): the shares that compiled, passed, ran away..., the
commonest compiler errors, the problems never solved, and each part's share of the reward per step.
"""
from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from ocaml_grpo.reward.breakdown import Breakdown
from ocaml_grpo.reward.parts import PART_NAMES

RUNAWAY, GATED, PASS_ANY = "runaway (max length)", "gated (MIN_NON_EMPTY_LINES)", "passes some tests"


@dataclass
class BreakdownStats:
    n: int
    groups: int                         # GRPO groups = distinct (step, problem_id)
    problems: int
    shares: dict[str, float]            # share of completions with END marker, compiling, ...
    component_means: dict[str, float]   # the reward and each part as logged (weighted, before the penalties)
    top_errors: list[tuple[str, int]]
    error_kinds: dict[str, int]
    never_solved: list[str]             # no completion passed all tests
    never_passed_any: list[str]
    per_step: dict[int, dict[str, float]]   # step -> mean reward and each part's mean share of it (plot)
    passes_by_epoch: list[tuple[float, bool]]  # (epoch, tests_passed > 0) per completion


def normalize_error(msg: str | None) -> str:
    """Collapse a compiler message to its kind, so the same mistake on different names groups."""
    lines = [l.strip() for l in str(msg or "").splitlines() if l.strip()]
    err = next((l for l in lines if l.startswith("Error")), lines[0] if lines else "")
    err = re.sub(r'File "[^"]*", line \d+(, characters \d+-\d+)?:?', "", err)
    err = re.sub(r"(Unbound (?:value|module|constructor|type constructor|field|record field|type))\s+\S+",
                 r"\1 <name>", err)
    err = re.sub(r"has type .+? but an expression was expected of type .+",
                 "has type <t> but an expression was expected of type <t>", err)
    err = re.sub(r"\b\d+\b", "N", re.sub(r'"[^"]*"', '"<s>"', err))
    return re.sub(r"\s+", " ", err).strip()[:100]


def paid_parts(b: Breakdown) -> dict[str, float]:
    """Each part's share of the reward the completion was paid. The log holds the parts weighted but
    before the runaway penalty and the repair discount, which scale the whole reward: scaled alike
    here, they add up to the reward, and no part is drawn above the total it is part of."""
    total = b.parts_total()
    scale = float(b.reward or 0.0) / total if total > 0 else 0.0
    return {name: b.part(name) * scale for name in PART_NAMES}


def summarize_breakdown(recs: list[dict]) -> BreakdownStats:
    n = len(recs)
    bds = [Breakdown.from_record(r) for r in recs]
    share = lambda pred: sum(1 for b in bds if pred(b)) / n  # noqa: E731
    shares = {
        "END marker": share(lambda b: b.has_end_marker),
        # Of all completions, those compiled and found free of errors: one gated for too few lines
        # (MIN_NON_EMPTY_LINES) or whose grading crashed was never compiled.
        "type-checks (0 type & 0 syntax errors)":
            share(lambda b: b.type_errors == 0 and b.syntax_errors == 0 and not b.gated_min_lines
                  and b.reward is not None),
        "compiles": share(lambda b: b.compiled),
        PASS_ANY: share(lambda b: b.passed_any),
        "passes all tests": share(lambda b: b.solved),
        GATED: share(lambda b: b.gated_min_lines),
        RUNAWAY: share(lambda b: b.runaway),
        "timed out": share(lambda b: b.timed_out),
    }
    groups, by_problem, by_step = defaultdict(list), defaultdict(list), defaultdict(list)
    for r, b in zip(recs, bds):
        if b.reward is not None:  # None: grading crashed, kept out of the group's baseline by TRL
            groups[(r.get("step"), str(b.problem_id))].append(float(b.reward))
        by_problem[str(b.problem_id)].append(b)
        by_step[r.get("step")].append(b)
    errors = Counter(normalize_error(b.first_error) for b in bds if b.first_error)
    mean_reward = lambda bs: statistics.fmean(float(b.reward or 0.0) for b in bs)  # noqa: E731

    def step_means(bs: list[Breakdown]) -> dict[str, float]:
        paid = [paid_parts(b) for b in bs]
        return {"reward": mean_reward(bs), **{c: statistics.fmean(p[c] for p in paid) for c in PART_NAMES}}

    return BreakdownStats(
        n=n, groups=len(groups), problems=len(by_problem), shares=shares,
        component_means={"reward": mean_reward(bds), **{c: statistics.fmean(b.part(c) for b in bds) for c in PART_NAMES}},
        top_errors=errors.most_common(8),
        error_kinds=dict(Counter(k for b in bds for k in (b.error_kinds or [])).most_common()),
        never_solved=sorted(p for p, bs in by_problem.items() if not any(b.solved for b in bs)),
        never_passed_any=sorted(p for p, bs in by_problem.items() if not any(b.passed_any for b in bs)),
        per_step={s: step_means(bs) for s, bs in sorted(by_step.items()) if isinstance(s, int)},
        passes_by_epoch=[(float(r.get("epoch") or 0.0), b.passed_any) for r, b in zip(recs, bds)])
