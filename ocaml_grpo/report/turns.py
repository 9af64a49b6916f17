"""analyze.py's part on repair turns (GRPO_REPAIR_TURNS): how many completions solved their
problem at turn 1 and after the last turn, and how many groups too hard at turn 1 repair made
mixed, the groups it turned from teaching nothing into teaching something. Read from metrics.jsonl.
The verdict rests on the pass rates: a too-hard group made mixed by compile credit alone solves nothing."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ocaml_grpo.jsonl import read_jsonl
from ocaml_grpo.training.metrics import METRICS_FILE, StepRecord


@dataclass(frozen=True)
class RepairReport:
    steps: int  # log steps with repair metrics
    pass_turn1: float  # means over those steps
    pass_final: float
    turns: float
    too_hard_turn1: float
    too_hard_to_mixed: float

    @property
    def tells(self) -> bool:
        """Whether the pass rates can show repair's effect. With no answer solving its problem at
        either turn, the groups repair made mixed differ by syntax and compile credit only."""
        return self.pass_turn1 > 0 or self.pass_final > 0

    @property
    def helps(self) -> bool:
        """More completions solved their problem after repair than at turn 1."""
        return self.pass_final > self.pass_turn1

    def verdict(self) -> str:
        """Whether repair helps, with the figures it rests on."""
        figures = (f"solved: {self.pass_turn1:.1%} at turn 1, {self.pass_final:.1%} after repair; "
                   f"{self.too_hard_to_mixed:.1%} of the groups went from too hard to mixed")
        if not self.tells:
            return (f"The figures cannot tell yet whether repair helps ({figures}): no answer solved its problem at "
                    "either turn, so the groups it made mixed differ by syntax and compile credit, not by passing answers.")
        if self.helps:
            return f"It helps ({figures}): more completions solve their problem after repair; keep it."
        return f"It has not helped yet ({figures}): no more completions solve their problem after repair."


def read_repair_report(run_dir: Path) -> RepairReport | None:
    """None for a run without repair turns (or without metrics.jsonl)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return None
    reps = [r.repair for r in map(StepRecord.from_json, read_jsonl(path)[0]) if r.repair]
    if not reps:
        return None
    mean = lambda k: sum(r[k] or 0.0 for r in reps) / len(reps)  # noqa: E731
    return RepairReport(len(reps), mean("pass_turn1"), mean("pass_final"), mean("turns"), mean("too_hard_turn1"),
                        mean("too_hard_to_mixed"))


def render(r: RepairReport) -> list[str]:
    return ["## Repair Turns", "",
            f"Over {r.steps} log steps ({r.turns:.2f} turns on average), {r.too_hard_turn1:.1%} of the groups were too "
            f"hard at turn 1 (no completion passed a test). {r.verdict()}", ""]
