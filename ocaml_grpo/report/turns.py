"""analyze.py's part on repair turns (GRPO_REPAIR_TURNS): how many completions solved their
problem at turn 1 and after the last turn, and how many groups too hard at turn 1 repair made
mixed, the groups it turned from teaching nothing into teaching something. Read from metrics.jsonl."""
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
    def helps(self) -> bool:
        """Repair gave some groups variance they would not have had, or solved more."""
        return self.too_hard_to_mixed > 0 or self.pass_final > self.pass_turn1


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
    verdict = ("It helps: keep it." if r.helps else
               "It has not helped yet: no too-hard group became mixed and no more completions solved their problem.")
    return ["## Repair Turns", "",
            f"Over {r.steps} log steps: {r.pass_turn1:.1%} of the completions solved their problem at turn 1, "
            f"{r.pass_final:.1%} after the last turn ({r.turns:.2f} turns on average). "
            f"{r.too_hard_turn1:.1%} of the groups were too hard at turn 1 (no completion passed a test); "
            f"repair made {r.too_hard_to_mixed:.1%} of all groups go from too hard to mixed. {verdict}", ""]
