"""The TRL reward function (`make_reward_function`) and the reward's JSONL logs (RewardLogger:
reward_logs/completions.jsonl and syntax_aware_breakdown.jsonl, whole lines, one write each)."""
from __future__ import annotations

import asyncio
from dataclasses import asdict, replace
from pathlib import Path

from ocaml_grpo.grading.completions import completion_text
from ocaml_grpo.jsonl import JsonlWriter, session_id
from ocaml_grpo.problems import Problem
from ocaml_grpo.reward import group_kinds
from ocaml_grpo.reward.breakdown import Breakdown
from ocaml_grpo.reward.parts import (METRIC_COMPILED, METRIC_CRASHED, METRIC_END_MARKER, METRIC_PASSED_ANY,
                                     METRIC_REPAIR_PASS_FINAL, METRIC_REPAIR_PASS_FIRST, METRIC_REPAIR_RESCUED,
                                     METRIC_REPAIR_TOO_HARD_FIRST, METRIC_REPAIR_TURNS, METRIC_SOLVED, METRIC_STUB, METRIC_CONSTANT,
                                     PARTS, curriculum_phase, discounted)
from ocaml_grpo.scoring.scorer import RewardScorer


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


def make_reward_function(output_dir: str | Path | None, max_completion_tokens: int | None = None,
                         curriculum: bool = False, scorer: RewardScorer | None = None, rank: int = 0,
                         group_size: int | None = None, on_groups=None, repair_discount: float = 1.0,
                         on_turn_grades=None):
    """An async TRL reward function named `syntax_aware_reward`: TRL logs it under that name
    (`rewards/syntax_aware_reward/mean`), the name users know from the run this grew out of.
    Dataset columns used: Problem.to_row's (`id`, `problem`: the OCaml prompt, `tests`;
    optional `requires`, `entry_point`). With `group_size` (TRL's num_generations: a
    batch is whole groups of that many consecutive completions) each group's kind is logged
    (group_kinds.py) and the groups are handed to `on_groups(step, groups)`.
    With repair turns (training/repair.py's rollout passes each completion's episode as `repair`)
    the final answer is graded on the hidden tests and discounted per extra turn; every answer is
    graded too, for the logs and the [Repair] metrics, and every episode's answers' grades
    (undiscounted, one list per episode) go to `on_turn_grades(grades)`: the trainer gives the
    first answer its own advantage from them (training/repair.py's TurnGrades)."""
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
            for b, e in zip(breakdowns, episodes):
                b.reward = discounted(b.reward, e["turns"], repair_discount)
            if on_turn_grades is not None:
                on_turn_grades([[t["reward"] for t in record] for record in turns])
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
            log_metric(METRIC_CONSTANT, share(b.constant for b in breakdowns))
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
