"""Dynamic sampling (GRPO_DYNAMIC_SAMPLING=1): a step trains only on groups that teach, as DAPO
(Yu et al. 2025), verl's `filter_groups` and prime-rl's advantage gate do.

A group whose rewards are all equal has no advantage: it costs its generation and its backward
pass and teaches nothing. The trainer (training/trainer.py) generates and scores the step's groups
with TRL's own `_generate_and_score_completions` (every engine, repair turns included), drops the
groups that teach nothing, draws problems for another round of the same size, and repeats until every
process holds its share of groups that teach or GRPO_DYNAMIC_SAMPLING_ROUNDS extra rounds were
taken; then TRL gets exactly the batch it would have had, same number of rows per process.

Pure Python but for the tensors `take_rows` merges (torch imported there): metrics.py and
analyze.py read DYNAMIC_KEYS without torch. The pieces carry no trainer state, so what they decide
can be checked alone:
- `teaching_groups`: which groups teach, from the rewards TRL gathered from every process: their
  rewards differ (`group_kinds.has_spread`, the rule behind the logs' frac_zero_std) by a std of at
  least GRPO_LEARNABLE_MIN_STD (0.05), the threshold the selection and the tracker judge with: a
  group whose rewards differ by a stray END marker is pushed as hard as one where half the answers
  pass (group-std scaling), and teaches noise. Measured on the tiny learner (bench/BENCHMARKS.md),
  keeping such groups made the run worse than tracking alone; GRPO_LEARNABLE_MIN_STD=0 keeps every
  group with any spread. Every process holds the same gathered rewards, so every process reaches
  the same verdicts without talking to the others.
- `StepPlan`: which groups each process trains on. Each process fills its own share from the
  groups it generated itself (moving groups between processes would move their tensors); a round
  is taken while any process is short. At the cap the short places are filled with groups that
  teach nothing (zero advantage, as without dynamic sampling): the step trains on what it has,
  the batch keeps its shape, and `frac_zero_std_trained` says so.
- `draw_prompts`: the next round's problems, drawn as the tracker draws (weight 1, or
  GRPO_TRACK_WEIGHT for a problem whose last group taught nothing), leaving out the problems whose
  group tied in this step while enough others remain (the same policy would most likely tie
  again; a problem whose group taught may come back), from a generator seeded by (seed, step,
  round): the same draw on every process and after a resume.
- `take_rows`: the kept rows of several rounds' outputs as one batch, each tensor padded as TRL pads it.

Every round is as large as the first: the compiled engine's shapes stay the same (no recompile),
and a GPU generates a full batch in about the time of a small one. The price: the last round's
teaching groups beyond the need are generated and not trained on (`dropped_surplus`). Every
generated group still reaches the reward logs, the tracker and the group-kind metrics; the
reward and frac_zero_std a log step reports are those of every generated group.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ocaml_grpo.reward.group_kinds import ZERO_VARIANCE, GroupStat, has_spread, learnable

if TYPE_CHECKING:
    import torch

# One log step's figures (metrics.py's StepRecord.dynamic, learning.log's [Dynamic] line), logged
# through the trainer's metrics as `ocaml/<key>`. Counts are of groups over every process;
# frac_zero_std_trained is the share of the trained groups that teach nothing (`teaching_groups`;
# with GRPO_LEARNABLE_MIN_STD=0, exactly the trained batch's frac_zero_std); dropped_surplus counts
# groups that teach, generated beyond the batch's need; tokens_trained is the share of the
# generated completion tokens in the trained batch.
DYNAMIC_KEYS = ("groups_generated", "groups_kept", "generation_rounds", "frac_zero_std_trained",
                "dropped_too_hard", "dropped_too_easy", "dropped_identical", "dropped_surplus", "tokens_trained")
METRIC_DYNAMIC = {k: f"ocaml/{k}" for k in DYNAMIC_KEYS}


def teaching_groups(rewards: Sequence[float], group_size: int, min_std: float = 0.0) -> list[bool]:
    """Per group of `group_size` consecutive rewards (NaN: not scored, left out as TRL leaves it
    out of the baseline): whether it teaches, the tracker's rule on rewards alone: its scored
    rewards differ, with a population std of at least `min_std` (GRPO_LEARNABLE_MIN_STD)."""
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards are not whole groups of {group_size}")
    out = []
    for i in range(0, len(rewards), group_size):
        scored = [float(r) for r in rewards[i:i + group_size] if not math.isnan(float(r))]
        out.append(has_spread(scored) and statistics.pstdev(scored) >= min_std)
    return out


@dataclass
class StepPlan:
    """One step's rounds and which groups each process keeps. A round holds `quota` groups per
    process, in rank order (TRL's layout: process p holds groups p*quota ... (p+1)*quota - 1)."""
    processes: int
    quota: int                          # groups each process trains on (its share of one round)
    rounds: list[list[bool]] = field(default_factory=list)  # each round's teaching_groups, every process's

    def add(self, teaches: Sequence[bool]) -> None:
        if len(teaches) != self.processes * self.quota:
            raise ValueError(f"a round of {len(teaches)} groups; expected {self.processes} x {self.quota}")
        self.rounds.append(list(teaches))

    def mine(self, rank: int) -> list[tuple[int, int, bool]]:
        """(round, group index within the process's share, teaches) of every group `rank` generated."""
        return [(r, j, teaches[rank * self.quota + j]) for r, teaches in enumerate(self.rounds) for j in range(self.quota)]

    def shortfall(self) -> int:
        """Groups that teach still missing on the process that misses most (0: every share is full)."""
        return max(self.quota - min(self.quota, sum(t for *_, t in self.mine(rank))) for rank in range(self.processes))

    def picks(self, rank: int) -> list[tuple[int, int]]:
        """The `quota` groups `rank` trains on: its teaching groups in the order generated, then, if
        short (the cap), its groups that teach nothing in the same order."""
        mine = self.mine(rank)
        chosen = [(r, j) for r, j, t in mine if t][:self.quota]
        return chosen + [(r, j) for r, j, t in mine if not t][:self.quota - len(chosen)]

    def trained(self) -> list[tuple[int, int]]:
        """Every process's picks, as (round, global group index)."""
        return [(r, rank * self.quota + j) for rank in range(self.processes) for r, j in self.picks(rank)]


def draw_prompts(n: int, weights: Sequence[float], exclude: set[int], generator: torch.Generator) -> list[int]:
    """`n` dataset indices drawn by weight, without replacement while the dataset allows; the
    indices in `exclude` (tied earlier in the step) only when too few others can be drawn."""
    import torch
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if w.numel() == 0 or not bool((w > 0).any()):
        w = torch.ones(len(weights), dtype=torch.float64)
    free = w.clone()
    free[list(exclude)] = 0.0
    if int((free > 0).sum()) >= n:
        w = free
    replacement = int((w > 0).sum()) < n
    return torch.multinomial(w, n, replacement=replacement, generator=generator).tolist()


def round_generator(seed: int, step: int, round_: int) -> torch.Generator:
    import torch
    return torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + round_)


# How TRL 1.16 pads each tensor of `_generate_and_score_completions`' output: prompts on the left,
# completions (and everything per completion token) on the right.
LEFT_PADDED = ("prompt_ids", "prompt_mask")
RIGHT_PADDED = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps", "sampling_per_token_logps",
                "ref_per_token_logps", "importance_sampling_ratio", "advantages")
PAD_VALUES = {"prompt_mask": 0, "completion_mask": 0, "tool_mask": 1, "old_per_token_logps": 0.0,
              "sampling_per_token_logps": 0.0, "ref_per_token_logps": 0.0, "importance_sampling_ratio": 1.0,
              "advantages": 0.0}


def take_rows(outs: Sequence[dict], picks: Sequence[tuple[int, int]], group_size: int, pad_token_id: int) -> dict:
    """One batch of the groups `picks` ((round, group index in that round's output)) from the
    rounds' outputs, in pick order. `num_items_in_batch` is left to the caller (it counts over
    every process). A key TRL adds for images is refused: dynamic sampling is for text."""
    import torch
    unknown = set().union(*outs) - set(LEFT_PADDED) - set(RIGHT_PADDED) - {"num_items_in_batch"}
    if unknown:
        raise ValueError(f"dynamic sampling cannot merge {sorted(unknown)} (multimodal inputs are not supported)")
    rows = [(r, j * group_size + k) for r, j in picks for k in range(group_size)]
    merged = {}
    for key in outs[0]:
        if key == "num_items_in_batch":
            continue
        parts = [outs[r][key][i] for r, i in rows]
        if parts[0].dim() == 0 or (key == "importance_sampling_ratio" and parts[0].shape[-1] == 1):
            merged[key] = torch.stack(parts)  # one value per completion (advantages, a sequence-level ratio)
            continue
        width = max(outs[r][key].shape[1] for r in {r for r, _ in picks})
        value = pad_token_id if key in ("prompt_ids", "completion_ids") else PAD_VALUES[key]
        left = key in LEFT_PADDED
        merged[key] = torch.stack([torch.nn.functional.pad(p, (width - p.shape[0], 0) if left else (0, width - p.shape[0]),
                                                           value=value) for p in parts])
    return merged


class GroupLog:
    """The reward function's groups (every process's, gathered: tracking.shared_update), in the
    order TRL holds them, kept for the trainer to name the kinds of the groups it drops."""

    def __init__(self):
        self.groups: list[GroupStat] = []

    def __call__(self, step: int, groups: list[GroupStat]) -> None:
        self.groups.extend(groups)

    def take(self) -> list[GroupStat]:
        out, self.groups = self.groups, []
        return out


def dropped_kind(g: GroupStat, min_std: float) -> str:
    """Why a group was dropped, in group_kinds' words: `learnable`'s verdict at `min_std`, where
    too_easy means every completion passed (the kind's meaning, not the tracker's share)."""
    return learnable(g.reward_std, g.solved, g.passed_any, min_std, 1.0)


def step_figures(plan: StepPlan, kinds: Sequence[str] | None, tokens: tuple[float, float]) -> dict[str, float]:
    """The step's DYNAMIC_KEYS: `kinds` are every generated group's (`dropped_kind`; round by round,
    rank order; None: unknown, no dropped_<kind>), `tokens` (trained, generated) completion tokens
    over every process. frac_zero_std_trained counts the trained groups that do not teach."""
    per_round = plan.processes * plan.quota
    trained = set(plan.trained())
    teaches = {(r, g): t for r, round_ in enumerate(plan.rounds) for g, t in enumerate(round_)}
    zero_trained = sum(not teaches[p] for p in trained)
    out = {"groups_generated": float(len(teaches)), "groups_kept": float(len(trained) - zero_trained),
           "generation_rounds": float(len(plan.rounds)), "frac_zero_std_trained": zero_trained / max(1, len(trained)),
           "dropped_surplus": float(sum(t and p not in trained for p, t in teaches.items())),
           "tokens_trained": tokens[0] / tokens[1] if tokens[1] else 0.0}
    if kinds is not None:
        if len(kinds) != len(teaches):
            raise ValueError(f"{len(kinds)} group kinds for {len(teaches)} generated groups")
        for kind in ZERO_VARIANCE:
            out[f"dropped_{kind}"] = float(sum(kinds[r * per_round + g] == kind and not t and (r, g) not in trained
                                               for (r, g), t in teaches.items()))
    return out
