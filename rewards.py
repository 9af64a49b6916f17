"""The reward policy for OCaml completions, its JSONL logs, and a CLI to re-score them.

    python rewards.py score PROBLEMS COMPLETIONS [--workers N]   # one JSON line per completion
    python rewards.py feedback PROBLEMS COMPLETIONS              # what a repair turn would show the model
    python rewards.py audit DATASET [--json]                     # which problems can ever pass

Reward: the sum of the parts listed in ocaml_grpo/reward/parts.py (PARTS: each its weight,
REWARD_WEIGHT_<NAME> in ocaml_grpo/config/scoring.py, times the credit the grader's findings earn
it; `python train.py --help` lists them with their defaults). The record of one scored completion is reward/breakdown.py's Breakdown.
Rules: fewer than MIN_NON_EMPTY_LINES code lines -> 0; a check that ran out of compile time earns
no type-check or compile credit; a completion that reached the maximum completion length is
multiplied by RUNAWAY_PENALTY_MULTIPLIER; grading that fails on one completion makes its reward
None, never the batch's.

This module must not import torch or trl: the CLI starts in well under a second.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import threading
import time
import traceback
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ocaml_grpo.grading import audit
from ocaml_grpo.training import group_kinds
from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.completions import assemble_solution, completion_text, extract_code, has_end_marker
from ocaml_grpo.jsonl import JsonlWriter, session_id
from ocaml_grpo.problems import DatasetError, Problem, load_problems
from ocaml_grpo.config.settings import from_env
from ocaml_grpo.grading.feedback import Feedback, feedback_for
from ocaml_grpo.grading.grader import Grade, OcamlGrader
# The reward's settings (config/) and parts and metric names (reward/), re-exported for the commands.
from ocaml_grpo.config import AUDIT_SETTINGS, REWARD_SETTINGS, SANDBOX_SETTINGS, RewardConfig, resolve
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.reward.breakdown import Breakdown  # noqa: F401  (re-exported: rewards.Breakdown)
from ocaml_grpo.reward.parts import (CURRICULUM, METRIC_COMPILED, METRIC_CRASHED, METRIC_END_MARKER,  # noqa: F401
                                     METRIC_PASSED_ANY, METRIC_REPAIR_PASS_FINAL, METRIC_STUB, METRIC_REPAIR_PASS_FIRST,
                                     METRIC_REPAIR_RESCUED, METRIC_REPAIR_TOO_HARD_FIRST, METRIC_REPAIR_TURNS,
                                     METRIC_SOLVED, PARTS, Weights, curriculum_phase, discounted)
from ocaml_grpo.grading.toolcache import ToolchainError

# ---------------------------------------------------------------------------------------------
# Scoring.

def score_grade(grade: Grade, b: Breakdown, w: Weights) -> None:
    """What the grader found, into the breakdown, and each part's credit for it (reward/parts.py)."""
    b.type_errors = len(grade.compile_errors)
    b.syntax_errors = grade.syntax_errors
    b.error_kinds = [e.kind for e in grade.compile_errors]
    b.first_error = grade.compile_errors[0].message if grade.compile_errors else grade.test_error
    b.compiled, b.tests_compiled = grade.compiled_as_asked, grade.tests_compiled
    b.tests_passed, b.tests_total, b.timed_out = grade.tests_passed, grade.tests_total, grade.timed_out
    b.forbidden, b.unverifiable, b.compile_timed_out = grade.forbidden, grade.unverifiable, grade.compile_timed_out
    b.stub, b.unchecked = grade.stub, grade.unchecked
    b.credit(grade, w)


class RewardScorer:
    """Scores batches in parallel; facts about (problem, code) are cached so duplicates in a
    GRPO group, and re-scoring under new weights, cost nothing."""

    def __init__(self, config: RewardConfig | None = None, grader: OcamlGrader | None = None,
                 cache_size: int = 50_000):
        self.config = config or RewardConfig()
        self.grader = grader or OcamlGrader(Sandbox(self.config.sandbox), cores=self.config.workers)
        # Runs mostly wait on subprocesses; more threads than cores lets infinite loops time
        # out side by side while compiles stay bounded by the grader's compile slots.
        self.pool = ThreadPoolExecutor(max_workers=max(32, 8 * self.config.workers), thread_name_prefix="reward")
        self._cache: OrderedDict[str, Grade] = OrderedDict()
        self._inflight: dict[str, threading.Event] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.grader.close()

    def _grade_cached(self, problem: Problem, solution: str, entries: list[str]) -> tuple[Grade, bool]:
        key = hashlib.sha256("\0".join([problem.id, problem.prompt, problem.tests, ",".join(problem.requires),
                                        ",".join(entries), solution]).encode()).hexdigest()
        while True:
            with self._lock:
                if key in self._cache:
                    self._cache.move_to_end(key)
                    return self._cache[key], True
                event = self._inflight.get(key)
                if event is None:
                    self._inflight[key] = threading.Event()
                    break
            event.wait()  # the same code is being graded by another thread: share its result
        try:
            grade = self.grader.grade(solution, problem.tests, problem.requires, entries, problem.prompt)
            with self._lock:
                self._cache[key] = grade
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            return grade, False
        finally:
            with self._lock:
                self._inflight.pop(key).set()

    def feedback(self, problem: Problem, completion) -> Feedback:
        """What a repair turn shows the model after this answer, under this scorer's line minimum."""
        return feedback_for(self.grader, problem, completion, self.config.min_lines)

    def score_one(self, problem: Problem, completion, completion_tokens: int | None = None,
                  max_completion_tokens: int | None = None, weights: Weights | None = None) -> Breakdown:
        t0 = time.perf_counter()
        cfg = self.config
        w = weights or cfg.weights
        text = completion_text(completion)
        b = Breakdown(problem_id=problem.id, isolated=self.grader.sandbox.isolated)
        b.has_end_marker = has_end_marker(text)
        # Cut off at the limit, whatever it wrote before: a marker proves nothing about the text after it.
        b.runaway = (completion_tokens is not None and max_completion_tokens is not None
                     and completion_tokens >= max_completion_tokens)
        code = extract_code(text)
        b.code_lines = src.count_code_lines(code)
        # No line of code (nothing, or comments only) is no answer, whatever MIN_NON_EMPTY_LINES says:
        # with the gate at 0, a GRPO run of Qwen2.5-Coder-0.5B collapsed in 4 steps to "(* END *)"
        # alone, whose END marker earned more than its honest attempts' syntax errors.
        if b.code_lines < max(1, cfg.min_lines):
            b.gated_min_lines = True  # no part earns anything, the END marker included
            b.tests_total = src.assertion_count(src.parse_assert_tests(problem.tests))
        else:
            solution, entries = assemble_solution(code, problem.prompt, problem.entry_point)
            grade, b.cached = self._grade_cached(problem, solution, entries)
            score_grade(grade, b, w)
        reward = b.parts_total()
        if b.runaway:
            reward *= cfg.runaway_multiplier
        b.reward = round(reward, 6)
        b.elapsed_ms = round((time.perf_counter() - t0) * 1000, 2)
        return b

    def score_batch(self, problems: list[Problem], completions: list, completion_tokens: list | None = None,
                    max_completion_tokens: int | None = None, weights: Weights | None = None) -> list[Breakdown]:
        toks = completion_tokens or [None] * len(completions)
        futures = [self.pool.submit(self.score_one, p, c, t, max_completion_tokens, weights)
                   for p, c, t in zip(problems, completions, toks)]
        return [f.result() for f in futures]


class GuardedScorer(RewardScorer):
    """The trainer's scorer: a grader bug on one odd completion costs that completion its reward,
    not the whole run. Its reward is None, which TRL 1.16 treats as unscorable: it stays out of
    its group's baseline and gets no advantage (a 0 would drag the baseline down). The failure is
    recorded in the breakdown log (first_error), its traceback printed once per process, and its
    share reaches learning.log through log_metric (METRIC_CRASHED)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.crashes = 0
        self._crash_lock = threading.Lock()

    def score_one(self, problem: Problem, completion, *a, **kw) -> Breakdown:
        try:
            return super().score_one(problem, completion, *a, **kw)
        except Exception as e:  # noqa: BLE001 -- deliberate: see the docstring
            with self._crash_lock:
                self.crashes += 1
                first = self.crashes == 1
            if first:
                traceback.print_exc()
            print(f"warning: grading crashed on a completion for {problem.id} ({type(e).__name__}: {e}); "
                  f"reward None [{self.crashes} so far]", file=sys.stderr)
            return Breakdown(problem_id=problem.id, reward=None, isolated=self.grader.sandbox.isolated,
                             first_error=f"reward crashed: {type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------
# The reward's JSONL logs (ocaml_grpo/jsonl.py: whole lines, one write() each).

class RewardLogger:
    def __init__(self, output_dir: str | Path, rank: int = 0):
        self.rank = rank
        self.session = session_id()
        logs = Path(output_dir) / "reward_logs"
        self.completions = JsonlWriter(logs / "completions.jsonl")
        self.breakdown = JsonlWriter(logs / "syntax_aware_breakdown.jsonl")

    def log(self, step: int, epoch: float, breakdowns: list[Breakdown], completions: list,
            completion_tokens: list | None = None, turns: list[list[dict]] | None = None) -> None:
        """`turns` (repair turns): each completion's answers, each {completion, feedback, reward};
        `completion` is then the final answer, the one `reward` grades."""
        toks = completion_tokens or [None] * len(breakdowns)
        self.completions.write_many([
            {"step": step, "epoch": epoch, "problem_id": b.problem_id, "completion": completion_text(c),
             "reward": b.reward, "completion_tokens": t, "rank": self.rank, "session": self.session,
             **({"turns": turns[k]} if turns else {})}
            for k, (b, c, t) in enumerate(zip(breakdowns, completions, toks))])
        self.breakdown.write_many([{"step": step, "epoch": epoch, "rank": self.rank, "session": self.session,
                                    **asdict(b)} for b in breakdowns])


# ---------------------------------------------------------------------------------------------
# The TRL reward function.

def make_reward_function(output_dir: str | Path | None, max_completion_tokens: int | None = None,
                         curriculum: bool = False, scorer: RewardScorer | None = None, rank: int = 0,
                         group_size: int | None = None, on_groups=None, repair_discount: float = 1.0):
    """An async TRL reward function named `syntax_aware_reward`: TRL logs it under that name
    (`rewards/syntax_aware_reward/mean`), the name users know from the run this grew out of.
    Dataset columns used: Problem.to_row's (`id`, `problem`: the OCaml prompt, `tests`;
    optional `requires`, `entry_point`). With `group_size` (TRL's num_generations: a
    batch is whole groups of that many consecutive completions) each group's kind is logged
    (group_kinds.py) and the groups are handed to `on_groups(step, groups)`.
    With repair turns (training/repair.py's rollout passes each completion's episode as `repair`)
    the final answer is graded on the hidden tests and discounted per extra turn; every answer is
    graded too, for the logs and the [Repair] metrics, and each episode record gets its answers'
    grades (`grades`, undiscounted): the trainer gives the first answer its own advantage from them
    (training/trainer.py)."""
    scorer = scorer or RewardScorer()
    # Under accelerate every process scores (and logs) its own share of the batch: each line is
    # written once, whole, by the process that scored it, tagged with its rank.
    logger = RewardLogger(output_dir, rank) if output_dir is not None else None

    async def syntax_aware_reward(prompts, completions, completion_ids=None, trainer_state=None,
                                  log_metric=None, **columns) -> list[float | None]:
        n = len(completions)
        episodes = columns.pop("repair", None)
        # Dataset columns arrive as lists; TRL passes other keywords too (log_extra, ...).
        rows = {k: v for k, v in columns.items() if isinstance(v, (list, tuple))}
        problems = [Problem.from_row({k: v[i] for k, v in rows.items()}) for i in range(n)]
        epoch = float(getattr(trainer_state, "epoch", 0.0) or 0.0)
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        phase, weights = curriculum_phase(epoch, scorer.config.weights) if curriculum else (None, scorer.config.weights)
        loop = asyncio.get_running_loop()
        if episodes:
            answers = [e["answers"][-1] for e in episodes]
            tokens = [e["answer_tokens"][-1] for e in episodes]
        else:
            answers = list(completions)
            tokens = [len(ids) for ids in completion_ids] if completion_ids is not None else None
        breakdowns = await loop.run_in_executor(None, scorer.score_batch, problems, answers, tokens,
                                                max_completion_tokens, weights)
        turns, firsts = None, None
        if episodes:
            # every earlier answer too (the final one is cached): the logs' per-turn rewards, turn 1's groups
            flat = [(k, t) for k, e in enumerate(episodes) for t in range(e["turns"] - 1)]
            earlier = await loop.run_in_executor(None, scorer.score_batch, [problems[k] for k, _ in flat],
                                                 [episodes[k]["answers"][t] for k, t in flat],
                                                 [episodes[k]["answer_tokens"][t] for k, t in flat],
                                                 max_completion_tokens, weights)
            graded = {kt: b for kt, b in zip(flat, earlier)}
            firsts = [graded.get((k, 0), b) for k, b in enumerate(breakdowns)]
            turns = [[{"completion": e["answers"][t], "feedback": e["feedback"][t] if t < len(e["feedback"]) else None,
                       "reward": (graded[(k, t)] if t < e["turns"] - 1 else breakdowns[k]).reward}
                      for t in range(e["turns"])] for k, e in enumerate(episodes)]
            for b, e, record in zip(breakdowns, episodes, turns):
                e["grades"] = [t["reward"] for t in record]
                b.reward = discounted(b.reward, e["turns"], repair_discount)
        for b in breakdowns:
            b.phase = phase
        groups = groups_of(breakdowns, group_size) if group_size else []
        if logger:
            logger.log(step, round(epoch, 4), breakdowns, answers, tokens, turns)
        if log_metric is not None and episodes:
            share = lambda flags: sum(flags) / max(1, n)  # noqa: E731
            log_metric(METRIC_REPAIR_PASS_FIRST, share(b.solved for b in firsts))
            log_metric(METRIC_REPAIR_PASS_FINAL, share(b.solved for b in breakdowns))
            log_metric(METRIC_REPAIR_TURNS, sum(e["turns"] for e in episodes) / max(1, n))
            if group_size:
                # copies: groups_of marks each breakdown with its group's kind, and the logged one is the final's
                first_groups = [g.kind for g in groups_of([replace(b) for b in firsts], group_size)]
                log_metric(METRIC_REPAIR_TOO_HARD_FIRST, first_groups.count("too_hard") / max(1, len(groups)))
                log_metric(METRIC_REPAIR_RESCUED, sum(f == "too_hard" and g.kind == "mixed"
                                                      for f, g in zip(first_groups, groups)) / max(1, len(groups)))
        if log_metric is not None:
            share = lambda flags: sum(flags) / max(1, n)  # noqa: E731
            log_metric(METRIC_COMPILED, share(b.compiled for b in breakdowns))
            log_metric(METRIC_SOLVED, share(b.solved for b in breakdowns))
            log_metric(METRIC_END_MARKER, share(b.has_end_marker for b in breakdowns))
            log_metric(METRIC_PASSED_ANY, share(b.passed_any for b in breakdowns))
            log_metric(METRIC_CRASHED, share(b.reward is None for b in breakdowns))
            log_metric(METRIC_STUB, share(b.stub for b in breakdowns))
            scored = [b for b in breakdowns if b.reward is not None]
            for part in PARTS:
                log_metric(part.metric, sum(b.part(part.name) for b in scored) / max(1, len(scored)))
            if groups:
                for kind, value in group_kinds.kind_shares(groups).items():
                    log_metric(group_kinds.METRIC_GROUP[kind], value)
                log_metric(group_kinds.METRIC_FRAC_ZERO_STD, sum(g.kind != "mixed" for g in groups) / len(groups))
        if on_groups is not None and groups:
            on_groups(step, groups)
        return [b.reward for b in breakdowns]

    syntax_aware_reward.scorer = scorer
    syntax_aware_reward.logger = logger
    return syntax_aware_reward


def groups_of(breakdowns: list[Breakdown], size: int) -> list[group_kinds.GroupStat]:
    """Each group of `size` consecutive completions classified; every Breakdown gets its group's kind."""
    if len(breakdowns) % size:
        raise ValueError(f"{len(breakdowns)} completions are not whole groups of {size}")
    groups = []
    for i in range(0, len(breakdowns), size):
        members = breakdowns[i:i + size]
        g = group_kinds.group_stat(members[0].problem_id, [b.reward for b in members], [b.solved for b in members],
                                   [b.passed_any for b in members])
        for b in members:
            b.group = g.kind
        groups.append(g)
    return groups


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
