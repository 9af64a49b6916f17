"""One scored completion, the record syntax_aware_breakdown.jsonl holds per line (and `rewards.py
score` prints): what the grader found and what each of the reward's parts paid for it."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Mapping

from ocaml_grpo.reward.parts import PARTS, Facts, Weights, weight

# The record's head: the problem, the reward, then one field per part (PARTS' order), the order
# the JSONL lines have always had.
_Scored = make_dataclass("_Scored", [("problem_id", str),
                                     ("reward", float | None, field(default=0.0)),
                                     *((p.name, float, field(default=0.0)) for p in PARTS)])


@dataclass
class Breakdown(_Scored):
    """One scored completion. `reward` None: grading crashed (GuardedScorer); TRL leaves it out of
    the group's baseline."""
    has_end_marker: bool = False
    type_errors: int = 0
    syntax_errors: int = 0
    error_kinds: list[str] = field(default_factory=list)
    first_error: str | None = None
    compiled: bool = False
    tests_compiled: bool = False
    tests_passed: int = 0
    tests_total: int = 0
    timed_out: bool = False  # the test runs used their CPU budget
    compile_timed_out: bool = False  # the compile budget ran out: no type-check or compile credit
    runaway: bool = False
    gated_min_lines: bool = False
    forbidden: str | None = None
    unverifiable: str | None = None  # the tests cannot run outside the answer's process: no test credit
    unchecked: bool = False  # a phrase's own errors could not be checked (a failed type's constructor): no type-check credit
    stub: bool = False  # the tests ran and no call of the answer's returned a value (it only raises or loops)
    constant: bool = False  # its calls, given different arguments, all gave back the same, and an assertion failed
    code_lines: int = 0
    elapsed_ms: float = 0.0
    cached: bool = False
    isolated: bool = True
    phase: str | None = None
    group: str | None = None  # the kind of its GRPO group (group_kinds.KINDS); None outside training

    @property
    def passed_any(self) -> bool:
        """At least one test assertion passed."""
        return (self.tests_passed or 0) > 0

    @property
    def solved(self) -> bool:
        """Every test assertion passed."""
        return (self.tests_total or 0) > 0 and self.tests_passed == self.tests_total

    def credit(self, facts: Facts, weights: Weights) -> None:
        """Each part's share of the reward for what the grader found."""
        for p in PARTS:
            setattr(self, p.name, weight(weights, p) * p.credit(facts, self.has_end_marker))

    def parts_total(self) -> float:
        return sum(self.part(p.name) for p in PARTS)

    def part(self, name: str) -> float:
        return float(getattr(self, name) or 0.0)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Breakdown":
        """A breakdown log line back into its Breakdown (the line's other keys, step, rank..., left out)."""
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})
