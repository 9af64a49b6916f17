"""The reward's parts and the names its metrics are logged under: what every consumer of a
reward (the policy in rewards.py, the trainer's logs, analyze.py) derives from."""
from __future__ import annotations

from dataclasses import dataclass

# What the reward function reports through TRL's log_metric (averaged over the processes and the
# reward calls of a log step); the trainer's learning log reads the last two for its health rules.
METRIC_COMPILED = "ocaml/compiled"
METRIC_SOLVED = "ocaml/tests_all_passed"
METRIC_END_MARKER = "ocaml/end_marker"
METRIC_PASSED_ANY = "ocaml/tests_passed_any"  # share of completions passing at least one test
METRIC_CRASHED = "ocaml/grading_crashed"  # share of completions whose grading raised (reward None)


@dataclass(frozen=True)
class Weights:
    structural: float = 0.05
    type_check: float = 0.20
    compile: float = 0.10
    tests: float = 0.65



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
