"""The reward policy's door: what a TRL user imports (`make_reward_function`, `RewardScorer`, the
weights and metric names; the engine itself is ocaml_grpo/scoring/), and a CLI to re-score logs.

    python rewards.py score PROBLEMS COMPLETIONS [--workers N]   # one JSON line per completion
    python rewards.py feedback PROBLEMS COMPLETIONS              # what a repair turn would show the model
    python rewards.py audit DATASET [--json]                     # which problems can ever pass

Reward: the sum of the parts listed in ocaml_grpo/reward/parts.py (PARTS: each its weight,
REWARD_WEIGHT_<NAME> in ocaml_grpo/config/scoring.py, times the credit the grader's findings earn
it; `python train.py --help` lists them with their defaults). The record of one scored completion
is reward/breakdown.py's Breakdown.
Rules: fewer than MIN_NON_EMPTY_LINES code lines -> 0; a check that ran out of compile time earns
no type-check or compile credit; a constant answer (its calls gave back one value for different
arguments, and an assertion failed) earns no test credit; a completion that reached the maximum completion length is
multiplied by RUNAWAY_PENALTY_MULTIPLIER; grading that fails on one completion makes its reward
None, never the batch's.

This module must not import torch or trl: the CLI starts in well under a second.
"""
from __future__ import annotations

import argparse
import os
import sys

from ocaml_grpo.commands import grade_cli
from ocaml_grpo.config import AUDIT_SETTINGS, SANDBOX_SETTINGS, RewardConfig, resolve
from ocaml_grpo.grading import audit
from ocaml_grpo.grading.toolcache import ToolchainError
from ocaml_grpo.problems import DatasetError
# What a TRL user imports from here (the reward engine lives in ocaml_grpo/scoring/; its parts,
# weights and metric names in ocaml_grpo/reward/).
from ocaml_grpo.reward.breakdown import Breakdown
from ocaml_grpo.reward.parts import (CURRICULUM, METRIC_COMPILED, METRIC_CRASHED, METRIC_END_MARKER, METRIC_PASSED_ANY,
                                     METRIC_SOLVED, METRIC_STUB, PARTS, Weights, curriculum_phase)
from ocaml_grpo.scoring import GuardedScorer, RewardLogger, RewardScorer, make_reward_function, score_grade

__all__ = ["Breakdown", "CURRICULUM", "GuardedScorer", "METRIC_COMPILED", "METRIC_CRASHED", "METRIC_END_MARKER",
           "METRIC_PASSED_ANY", "METRIC_SOLVED", "METRIC_STUB", "PARTS", "RewardConfig", "RewardLogger", "RewardScorer",
           "Weights", "curriculum_phase", "make_reward_function", "score_grade"]



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewards.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("score", help="score completions against problems, one JSON line each",
                       description="Score completions as training does: the reward's weights, the "
                                   "minimum-lines rule (MIN_NON_EMPTY_LINES: fewer code lines score 0), the "
                                   "runaway penalty at the run's GRPO_MAX_COMPLETION, the curriculum's weights by "
                                   "epoch and the repair turns' discount, taken from the run's config.json when the "
                                   "completions are a run's reward_logs/completions.jsonl or --run names the run, "
                                   "else from the environment (the runaway rule then needs each record's "
                                   "max_completion_tokens). Which settings apply is printed on stderr.")
    p.add_argument("problems", help=".jsonl/.json/.csv/.parquet with id, prompt|problem, tests[, requires]")
    p.add_argument("completions", help='JSONL of {"problem_id", "completion"[, "completion_tokens", "max_completion_tokens"]}')
    p.add_argument("--run", default=None, help="the train.py output folder whose reward settings apply")
    p.add_argument("--workers", type=int, default=0)
    f = sub.add_parser("feedback", help="what a repair turn would show the model after each completion "
                                        "(GRPO_REPAIR_TURNS), one JSON line each")
    f.add_argument("problems", help="as for score")
    f.add_argument("completions", help='JSONL of {"problem_id", "completion"}')
    f.add_argument("--run", default=None, help="as for score")
    f.add_argument("--workers", type=int, default=0)
    a = sub.add_parser("audit", help="which problems' tests can compile at all (see audit.py)")
    a.add_argument("dataset", help="a local file, `bundled`, or a hub id")
    a.add_argument("--json", action="store_true", help='one line per problem: {"id", "ok", "reason"}')
    a.add_argument("--workers", type=int, default=0)
    a.add_argument("--output-dir", default=None, help="also write audit.jsonl there")
    args = parser.parse_args(argv)
    try:
        if args.command == "audit":
            cfg, errors = resolve(os.environ, AUDIT_SETTINGS + SANDBOX_SETTINGS)
            if errors:
                raise ValueError("; ".join(errors))
            return audit.cli(args, cfg.audit.cache_dir, cfg.reward.sandbox)
        return grade_cli.feedback(args) if args.command == "feedback" else grade_cli.score(args)
    except (DatasetError, ToolchainError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`... | head`): what it did not read is not an error. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
