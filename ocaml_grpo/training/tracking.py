"""Online difficulty tracking in the trainer: a sampler (the trainer's, training/trainer.py) that draws
the problems whose last group taught nothing less often (tracker.ProblemTracker decides, by group_kinds.learnable).

TRL 1.16 draws prompts with its RepeatSampler: each epoch a permutation of the problems, cut into
generation batches of distinct prompts, each prompt repeated num_generations times. The
TrackedSampler keeps that layout and the number of batches per epoch, but draws each generation
batch when the DataLoader asks for it, by weight: 1 for a problem not seen yet or whose last group
taught, GRPO_TRACK_WEIGHT for one whose last group did not (too easy, too hard, identical). Draws
are with replacement across batches, so a problem that teaches comes back within the epoch and one
that does not comes back rarely (one group that teaches restores it). With equal weights (a fresh
run, or every group teaching) a batch is a uniform draw from the same seeded generator as
RepeatSampler's. Accelerate prefetches one batch, so a group's verdict reaches the draw after the
next.

Every process must draw the same prompts: the groups each process graded are gathered
(accelerate's gather_object, called by every process in the reward function) so every tracker
holds the same states. Skipping at draw time costs no extra generation; in-batch replacement of
the groups that still teach nothing is dynamic sampling's (GRPO_DYNAMIC_SAMPLING, dynamic_sampling.py),
whose extra rounds draw by the same weights.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch
from torch.utils.data import Sampler

from ocaml_grpo.reward.group_kinds import GroupStat
from ocaml_grpo.training.tracker import ProblemTracker


class TrackedSampler(Sampler):
    """RepeatSampler's layout (generation batches of distinct problems, each index repeated
    num_generations times, each batch repeat_count times), with each batch's problems drawn by
    weight, without replacement within a batch and with replacement across batches."""

    def __init__(self, problem_ids: Sequence[str], tracker: ProblemTracker, mini_repeat_count: int,
                 batch_size: int, repeat_count: int, shuffle: bool = True, seed: int = 0):
        if len(problem_ids) < batch_size:
            raise ValueError(f"{len(problem_ids)} problems cannot fill a generation batch of {batch_size}")
        self.ids, self.tracker = list(problem_ids), tracker
        self.mini_repeat_count, self.batch_size, self.repeat_count = mini_repeat_count, batch_size, repeat_count
        self.shuffle = shuffle
        self.generator = torch.Generator().manual_seed(seed)  # seeded as RepeatSampler seeds its own
        self.batches = len(self.ids) // batch_size  # an epoch keeps RepeatSampler's number of batches

    def __len__(self) -> int:
        return self.batches * self.batch_size * self.mini_repeat_count * self.repeat_count

    def next_batch(self) -> list[int]:
        """The next generation batch's distinct problems, drawn when the DataLoader asks for it."""
        weights = torch.tensor([self.tracker.keep_probability(p) for p in self.ids])
        if not self.shuffle:
            return torch.topk(weights, self.batch_size, sorted=True).indices.tolist()  # stable: first come first
        if bool((weights == weights[0]).all()):  # nothing to prefer: a uniform draw, as RepeatSampler's
            return torch.randperm(len(self.ids), generator=self.generator)[:self.batch_size].tolist()
        # Weighted sampling without replacement (Efraimidis & Spirakis): the largest u ** (1 / w).
        keys = torch.rand(len(self.ids), generator=self.generator, dtype=torch.float64) ** (1.0 / weights.double())
        return torch.topk(keys, self.batch_size).indices.tolist()

    def __iter__(self) -> Iterator[int]:
        for _ in range(self.batches):
            chunk = self.next_batch()
            for _ in range(self.repeat_count):
                for index in chunk:
                    yield from [index] * self.mini_repeat_count


def shared_update(*consumers: Callable[[int, list[GroupStat]], None]):
    """The reward function's `on_groups`: every process's groups, gathered, go to each consumer
    (the tracker's update, dynamic sampling's GroupLog) on every process."""
    def on_groups(step: int, groups: list[GroupStat]) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            from accelerate.utils import gather_object
            groups = gather_object(groups)
        for consume in consumers:
            consume(step, groups)
    return on_groups
