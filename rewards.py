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
no type-check or compile credit; a completion that reached the maximum completion length is
multiplied by RUNAWAY_PENALTY_MULTIPLIER; grading that fails on one completion makes its reward
None, never the batch's.

This module must not import torch or trl: the CLI starts in well under a second.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ocaml_grpo.config import AUDIT_SETTINGS, REWARD_SETTINGS, SANDBOX_SETTINGS, RewardConfig, resolve
from ocaml_grpo.config.settings import from_env
from ocaml_grpo.grading import audit
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.grading.toolcache import ToolchainError
from ocaml_grpo.problems import DatasetError, Problem, load_problems
# What a TRL user imports from here (the reward engine lives in ocaml_grpo/scoring/; its parts,
# weights and metric names in ocaml_grpo/reward/).
from ocaml_grpo.reward.breakdown import Breakdown
from ocaml_grpo.reward.parts import (CURRICULUM, METRIC_COMPILED, METRIC_CRASHED, METRIC_END_MARKER, METRIC_PASSED_ANY,
                                     METRIC_SOLVED, METRIC_STUB, PARTS, Weights, curriculum_phase, discounted)
from ocaml_grpo.scoring import GuardedScorer, RewardLogger, RewardScorer, make_reward_function, score_grade

__all__ = ["Breakdown", "CURRICULUM", "GuardedScorer", "METRIC_COMPILED", "METRIC_CRASHED", "METRIC_END_MARKER",
           "METRIC_PASSED_ANY", "METRIC_SOLVED", "METRIC_STUB", "PARTS", "RewardConfig", "RewardLogger", "RewardScorer",
           "Weights", "curriculum_phase", "make_reward_function", "score_grade"]


# ---------------------------------------------------------------------------------------------
# CLI.

def _read_completions(path: str) -> list[dict]:
    records = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the completions file ({e.strerror})") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}: line {n} is not JSON ({e.msg} at column {e.colno})") from None
            if "problem_id" not in r or "completion" not in r:
                raise DatasetError(f"{path}: line {n} needs keys problem_id and completion")
            records.append(r)
    return records


def _problems_and_completions(args) -> tuple[dict[str, Problem], list[dict]]:
    problems = {p.id: p for p in load_problems(args.problems)}
    records = _read_completions(args.completions)
    unknown = sorted({str(r["problem_id"]) for r in records} - set(problems))
    if unknown:
        raise DatasetError(f"{args.completions}: problem ids not in {args.problems}: {unknown[:5]}")
    return problems, records


def _run_dir(args) -> Path | None:
    """The training run the completions come from: `--run DIR`, or the run folder holding them
    (RUN/reward_logs/completions.jsonl beside RUN/config.json)."""
    if args.run:
        if not (Path(args.run) / "config.json").is_file():
            raise DatasetError(f"--run {args.run}: no config.json there (train.py writes one in its output folder)")
        return Path(args.run)
    logs = Path(args.completions).resolve().parent
    return logs.parent if logs.name == "reward_logs" and (logs.parent / "config.json").is_file() else None


@dataclass(frozen=True)
class RunRules:
    """The rules a run applied on top of the reward's settings, read from its config.json, so that
    a re-score reproduces its rewards: the completion limit (the runaway rule), the curriculum's
    weights by epoch, and the repair turns' discount. None/False: no run, or the rule was off."""
    max_completion: int | None = None
    curriculum: bool = False
    repair_discount: float | None = None


def _reward_config(args) -> tuple[RewardConfig, RunRules]:
    """The reward as the run that wrote the completions computed it (its config.json's reward
    settings and rules), else as this environment sets it; says which on stderr."""
    env = dict(os.environ)
    run = _run_dir(args)
    keys = [s.name for s in REWARD_SETTINGS if s.name != "REWARD_WORKERS"]
    rules = RunRules()
    if run is not None:
        saved = json.loads((run / "config.json").read_text())
        env.update({k: str(saved[k]) for k in keys if k in saved})
        source = f"run {run}'s config.json"
        turns = int(saved.get("GRPO_REPAIR_TURNS") or 0)
        rules = RunRules(max_completion=int(saved["GRPO_MAX_COMPLETION"]) if "GRPO_MAX_COMPLETION" in saved else None,
                         curriculum=str(saved.get("REWARD_CURRICULUM")).lower() in ("true", "1"),
                         repair_discount=float(saved.get("GRPO_REPAIR_DISCOUNT", 0.8)) if turns else None)
    else:
        source = "the environment (no run folder: --run DIR names one)"
    cfg = from_env(RewardConfig, env)
    print(f"reward settings from {source}: " + ", ".join(f"{s.name}={env.get(s.name, s.default)}"
                                                         for s in REWARD_SETTINGS if s.name in keys)
          + (f", GRPO_MAX_COMPLETION={rules.max_completion}" if rules.max_completion else "")
          + (", REWARD_CURRICULUM=1 (each completion's weights from its epoch)" if rules.curriculum else "")
          + (f", GRPO_REPAIR_DISCOUNT={rules.repair_discount:g}" if rules.repair_discount else ""), file=sys.stderr)
    return (replace(cfg, workers=args.workers) if args.workers else cfg), rules


def rescore(scorer: RewardScorer, problem: Problem, record: dict, rules: RunRules) -> Breakdown:
    """One logged completion scored as its run scored it. A record's own max_completion_tokens
    wins over the run's limit; the runaway rule needs a token count."""
    weights = curriculum_phase(float(record.get("epoch") or 0.0), scorer.config.weights)[1] if rules.curriculum else None
    limit = record.get("max_completion_tokens") or rules.max_completion
    b = scorer.score_one(problem, record["completion"], record.get("completion_tokens"), limit, weights)
    if rules.repair_discount and record.get("turns"):
        b.reward = discounted(b.reward, len(record["turns"]), rules.repair_discount)
    return b


def cmd_feedback(args) -> int:
    """Exactly what a repair turn would show the model after each completion (null: nothing to repair)."""
    problems, records = _problems_and_completions(args)
    cfg, _ = _reward_config(args)  # feedback depends on the line minimum only
    scorer = RewardScorer(cfg)
    try:
        futures = [scorer.pool.submit(scorer.feedback, problems[str(r["problem_id"])], r["completion"])
                   for r in records]
        for r, fut in zip(records, futures):
            fb = fut.result()
            print(json.dumps({"problem_id": str(r["problem_id"]), "feedback": fb.text, "compiled": fb.compiled,
                              "examples_passed": fb.examples_passed, "examples_total": fb.examples_total}), flush=True)
    finally:
        scorer.close()
    return 0


def cmd_score(args) -> int:
    problems, records = _problems_and_completions(args)
    cfg, rules = _reward_config(args)
    scorer = GuardedScorer(cfg)  # a completion whose grading fails prints reward None, not a dead batch
    if not scorer.grader.sandbox.isolated:
        print("WARNING: " + scorer.grader.sandbox.describe(), file=sys.stderr)
    try:
        futures = [scorer.pool.submit(rescore, scorer, problems[str(r["problem_id"])], r, rules) for r in records]
        for r, fut in zip(records, futures):
            b = fut.result()
            print(json.dumps(asdict(b)), flush=True)  # problem_id is the first field
    finally:
        scorer.close()
    return 0


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
        return cmd_feedback(args) if args.command == "feedback" else cmd_score(args)
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
