"""The reward's parts, listed once, and the names its metrics are logged under: what every consumer
of a reward (the policy in rewards.py, the breakdown record, the settings, the trainer's logs,
analyze.py and its plots) derives from. A new part is one more `Part` below; tests/test_parts.py
fails if a part's name is spelled anywhere else.
"""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Callable, Protocol, Sequence

# What the reward function reports through TRL's log_metric (averaged over the processes and the
# reward calls of a log step); the trainer's learning log reads the last two for its health rules.
METRIC_COMPILED = "ocaml/compiled"
METRIC_SOLVED = "ocaml/tests_all_passed"
METRIC_END_MARKER = "ocaml/end_marker"
METRIC_PASSED_ANY = "ocaml/tests_passed_any"  # share of completions passing at least one test
METRIC_CRASHED = "ocaml/grading_crashed"  # share of completions whose grading raised (reward None)
# share of completions whose tests ran and whose calls never returned a value (grader.Grade.stub):
# `failwith` stubs earn the type-check, compile and END credit, so a run can drift toward them
METRIC_STUB = "ocaml/stub"
# share of completions whose calls, given different arguments, all gave back the same value and
# failed an assertion (grader.Grade.constant): an example's output returned whatever the call earned
# the assertions expecting it, the drift attempt 6 found with the line gate off; now paid no test credit
METRIC_CONSTANT = "ocaml/constant"
# Repair turns (GRPO_REPAIR_TURNS): shares of the completions solving every test at turn 1 and
# after the last turn, the mean turns taken, and shares of the groups too hard at turn 1 and of
# those that repair made mixed (they teach something at the end).
METRIC_REPAIR_PASS_FIRST = "ocaml/repair_pass_turn1"
METRIC_REPAIR_PASS_FINAL = "ocaml/repair_pass_final"
METRIC_REPAIR_TURNS = "ocaml/repair_turns"
METRIC_REPAIR_TOO_HARD_FIRST = "ocaml/repair_too_hard_turn1"
METRIC_REPAIR_RESCUED = "ocaml/repair_too_hard_to_mixed"


class CompileError(Protocol):
    kind: str  # "syntax", "entry", a type error's kind, ...


class Facts(Protocol):
    """What the grader found about one solution (grading.grader.Grade), as the parts read it."""
    compile_errors: Sequence[CompileError]
    phrases_total: int
    phrases_ok: int
    compiled: bool
    tests_compiled: bool
    tests_passed: int
    tests_total: int
    compile_timed_out: bool
    forbidden: str | None
    unchecked: bool

    @property
    def constant(self) -> bool: ...

    @property
    def syntax_errors(self) -> int: ...

    @property
    def compiled_as_asked(self) -> bool: ...


@dataclass(frozen=True)
class Part:
    """One share of the reward: `weight` (REWARD_WEIGHT_<NAME>, default here) x `credit` in [0, 1]."""
    name: str                           # the breakdown's field, the weight's, the settings' suffix
    weight: float                       # the default weight
    earned: str                         # what earns it (--help)
    credit: Callable[[Facts, bool], float]  # (what the grader found, END marker present) -> [0, 1]
    label: str = ""                     # its name in learning.log's [Curriculum] line, when shorter

    @property
    def setting(self) -> str:
        return f"REWARD_WEIGHT_{self.name.upper()}"

    @property
    def metric(self) -> str:
        """Its mean over a log step's scored completions, as the reward function logs it."""
        return f"ocaml/part_{self.name}"

    @property
    def short(self) -> str:
        return self.label or self.name


def _entry_missing(g: Facts) -> bool:
    """An entry point missing or not of the prompt's type (the grader checks it on every path,
    type errors or not): nothing was typed as asked, whatever else the answer holds."""
    return any(e.kind == "entry" for e in g.compile_errors)


def _type_check(g: Facts, end_marker: bool) -> float:
    # a syntax error, or no entry point as asked: nothing typed; a check stopped half-way by the
    # compile budget proves nothing, and counted no further errors; nor does a count that could not
    # check every phrase (one using a failed type's constructor)
    if g.compile_timed_out or g.syntax_errors or _entry_missing(g) or g.unchecked:
        return 0.0
    n = len(g.compile_errors)
    return 1.0 if n == 0 else 0.5 / n


def _compile(g: Facts, end_marker: bool) -> float:
    # all or nothing (a share of the phrases that compile would pay for padding, `let _ = ()`), and
    # the same verdict as the breakdown's and the feedback's `compiled`
    return 1.0 if g.compiled_as_asked else 0.0


def _tests(g: Facts, end_marker: bool) -> float:
    # a constant answer (its calls, given different arguments, all gave back one value, and an
    # assertion failed) passed only the assertions that expect that value: it computed nothing
    # (attempt 6 collapsed onto `let power b e = 1024`, paid for the assertions expecting 1024)
    if not (g.tests_compiled and g.tests_total) or g.forbidden or g.constant:
        return 0.0
    return min(max(g.tests_passed, 0), g.tests_total) / g.tests_total


PARTS: tuple[Part, ...] = (
    Part("structural", 0.05, "the END marker is in the completion", lambda g, end_marker: float(end_marker)),
    Part("type_check", 0.20, "the solution alone type-checks (graduated by error count; none without the "
                              "entry points at the prompt's types)", _type_check, "type"),
    Part("compile", 0.10, "the solution compiles, defining the entry points at the prompt's types", _compile),
    Part("tests", 0.65, "x the fraction of assertions passed, when the program links with the tests (none when "
                        "its calls gave back one value for different arguments and an assertion failed)", _tests),
)
PART_NAMES = tuple(p.name for p in PARTS)

# The weight of each part, a field each (`Weights(tests=0.8)`, or positionally in PARTS' order).
Weights = make_dataclass("Weights", [(p.name, float, field(default=p.weight)) for p in PARTS], frozen=True)
Weights.__module__ = __name__  # pickles and reprs as this module's
Weights.__doc__ = "The reward's weights, one per part (PARTS); the defaults are the parts'."


def weight(w: Weights, part: Part) -> float:
    return getattr(w, part.name)


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


def discounted(reward: float | None, turns: int, discount: float) -> float | None:
    """Repair turns (GRPO_REPAIR_TURNS): the final answer's reward, times the discount per extra
    turn it took. A right first answer is worth the most, so no first answer written to fish for
    feedback beats it."""
    return None if reward is None else round(reward * discount ** (turns - 1), 6)
