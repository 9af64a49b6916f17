"""Each problem's state in a run (ProblemTracker): the verdict on its last group, which the trainer's
sampler (tracking.py) draws by, kept in reward_logs/problem_tracking.jsonl so a resumed run keeps it.
Pure Python, no torch: train.py builds it before any model loads."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from ocaml_grpo.jsonl import JsonlWriter, read_jsonl
from ocaml_grpo.reward.group_kinds import STATES, UNSEEN, ZERO_VARIANCE, GroupStat, event_stat, learnable


@dataclass
class ProblemTracker:
    """Each problem's state (`learnable`'s verdict on its last group). The trainer's sampler asks it how
    likely a problem is to be drawn (`keep_probability`): 1 for a problem not seen yet or whose
    last group taught (`learnable` with min_std and max_solved), `low_weight` for one whose last
    group did not. Such a problem is not dropped: it is drawn less often, and one group that
    teaches restores it (a too-hard problem may become learnable as the policy improves).

    Every group is appended to the file given to `open` (one JSON line each, whole-line writes),
    and a resumed run replays that file (`load`): the states survive a crash and a resume."""
    low_weight: float = 0.2
    min_std: float = 0.0
    max_solved: float = 1.0
    states: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        self._log: JsonlWriter | None = None

    def load(self, path: Path) -> int:
        """Replay the groups of an earlier session; returns how many were read. A torn last line
        (a crash mid-write) is skipped."""
        events = read_jsonl(path)[0] if path.is_file() else []
        for event in events:
            self.record(event_stat(event), event.get("state"))
        return len(events)

    def open(self, path: Path) -> None:
        """Append every later group to `path` (rank 0 only; the other ranks keep their states in memory)."""
        self._log = JsonlWriter(path)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def record(self, g: GroupStat, state: str | None = None) -> str:
        """Judge a group (`state`: the verdict a replayed line carries, judged with that run's settings)."""
        self.states[g.problem_id] = state or learnable(g.reward_std, g.solved, g.passed_any, self.min_std,
                                                       self.max_solved)
        return self.states[g.problem_id]

    def update(self, step: int, groups: Iterable[GroupStat]) -> None:
        records = [{"step": step, **asdict(g), "state": self.record(g)} for g in groups]
        if self._log is not None:
            self._log.write_many(records)

    def state(self, problem_id: str) -> str:
        return self.states.get(problem_id, UNSEEN)

    def keep_probability(self, problem_id: str) -> float:
        return self.low_weight if self.state(problem_id) in ZERO_VARIANCE else 1.0

    def counts(self, problem_ids: Iterable[str]) -> dict[str, int]:
        c = Counter(self.state(p) for p in problem_ids)
        return {s: c[s] for s in STATES}
