"""`python rewards.py score|feedback`'s work: logged completions re-scored as the run that wrote them
scored them (its config.json's reward settings and rules), or the feedback a repair turn would show.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ocaml_grpo.config import REWARD_SETTINGS, RewardConfig
from ocaml_grpo.config.settings import from_env
from ocaml_grpo.problems import DatasetError, Problem, load_problems
from ocaml_grpo.reward.breakdown import Breakdown
from ocaml_grpo.reward.parts import curriculum_phase, discounted
from ocaml_grpo.scoring import GuardedScorer, RewardScorer


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


def feedback(args) -> int:
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


def score(args) -> int:
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
