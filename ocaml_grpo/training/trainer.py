"""The GRPOTrainer train.py runs: TRL's, with two hooks.

- The sampler: with a ProblemTracker, tracking.TrackedSampler draws the generation batches in place
  of TRL's RepeatSampler (problems whose last group taught nothing come back less often).
- Repair episodes (GRPO_REPAIR_TURNS): the first answer's tokens get the first answer's own
  advantage, the later answers' keep the episode's (repair.first_answer_advantages). The per-answer
  grades come from the reward function, which writes them into each episode record (`grades`);
  TRL 1.16's loss takes advantages per token, shaped (completions, tokens), from a subclass.
- Answers stop at the END marker (GRPO_STOP_AT_END, `stop`): generate gets the tokenizer its stop
  strings need, and each answer that stopped there ends its turn (engines.end_turn_at_stop).
- Dynamic sampling (GRPO_DYNAMIC_SAMPLING, `dynamic_rounds`): a step's generation is repeated for
  newly drawn problems until the batch holds only groups that teach, or the cap; TRL then gets
  one step's batch of the kept groups (dynamic_sampling.py). None: TRL's generation, untouched.
- The run folder's README.md is ours (run_dir.write_readme), not TRL's hub model card; so is each
  adapter folder's, not peft's.
- Before each generation, the input-embedding hooks that gradient checkpointing's toggling left
  behind are removed (engines.drop_orphaned_input_hooks): they pile up every step, and the compiled
  engine would recompile for each new one.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from accelerate.utils import gather_object
from torch.utils.data import Sampler
from trl import GRPOTrainer

from ocaml_grpo.training import dynamic_sampling as ds
from ocaml_grpo.training.engines import drop_orphaned_input_hooks, end_turn_at_stop
from ocaml_grpo.training.group_kinds import ProblemTracker
from ocaml_grpo.training.repair import first_answer_advantages
from ocaml_grpo.training.run_dir import write_adapter_readme, write_readme
from ocaml_grpo.training.tracking import TrackedSampler


class OcamlGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer; tracker=None: TRL's own sampler; stop: the text that ends an answer
    (the args' generation_kwargs must stop there too: engines.engine_kwargs(stop=...));
    dynamic_rounds: with dynamic sampling, the extra generation rounds a step may take (None: off);
    group_log: the reward function's gathered groups (dynamic_sampling.GroupLog), to log the kinds
    of the groups dropped (None: not logged); min_std: a group teaches when its rewards' std is at
    least this (GRPO_LEARNABLE_MIN_STD; 0: any difference)."""

    def __init__(self, *args, tracker: ProblemTracker | None, stop: str | None = None,
                 dynamic_rounds: int | None = None, group_log: ds.GroupLog | None = None, min_std: float = 0.0,
                 **kwargs):
        self.tracker = tracker
        self.stop = stop
        self.dynamic_rounds, self.group_log, self.min_std = dynamic_rounds, group_log, min_std
        self._round_rewards = self._round_lengths = None
        super().__init__(*args, **kwargs)

    def create_model_card(self, *args, **kwargs) -> None:
        """TRL's card is written for a hub upload ("a fine-tuned version of [None]", a quick start that
        loads model "None"); the run folder gets a README that says what it holds instead."""
        if self.is_world_process_zero():
            write_readme(Path(self.args.output_dir))

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            out = Path(output_dir or self.args.output_dir)
            write_adapter_readme(out, f"Saved at step {self.state.global_step} by the GRPO run in "
                                      f"{Path(self.args.output_dir).resolve()} (its README.md says what the run holds).")

    def _get_train_sampler(self, dataset=None) -> Sampler:
        if self.tracker is None:
            return super()._get_train_sampler(dataset)
        dataset = self.train_dataset if dataset is None else dataset
        return TrackedSampler(dataset["id"], self.tracker, mini_repeat_count=self.num_generations,
                              batch_size=self.args.generation_batch_size // self.num_generations,
                              repeat_count=self.num_iterations * self.args.steps_per_generation,
                              shuffle=self.shuffle_dataset, seed=self.args.seed)

    def _generate_single_turn(self, *args, **kwargs):
        model = self.accelerator.unwrap_model(self.model)
        drop_orphaned_input_hooks(model)
        if self.stop is None:
            return super()._generate_single_turn(*args, **kwargs)
        if "generate" not in vars(model):  # transformers' stop strings need the tokenizer; TRL passes none
            model.generate = partial(model.generate, tokenizer=self._tokenizer)
        ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        tok = self._tokenizer
        return end_turn_at_stop(ids, logprobs, partial(tok.decode, skip_special_tokens=True), self.stop,
                                {*self.eos_token_ids, tok.pad_token_id}, tok.eos_token_id)

    def _generate_and_score_completions(self, inputs):
        if self.dynamic_rounds is None or not self.model.training:
            return self._generate_and_score_round(inputs)
        return self._dynamic_batch(inputs)

    def _generate_and_score_round(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not inputs or "repair" not in inputs[0]:
            return out
        episodes = [row["repair"] for row in inputs]
        if any("grades" not in e for e in episodes):
            raise RuntimeError("repair turns: an episode without its answers' grades (the reward function, "
                               "rewards.make_reward_function, writes them)")
        # TRL normalises over the whole generation batch, which other processes hold parts of
        grades = gather_object([e["grades"][0] for e in episodes])
        lengths = gather_object([e["answer_tokens"][0] for e in episodes])
        start = self.accelerator.process_index * len(inputs)
        out["advantages"] = first_answer_advantages(out["advantages"], grades, lengths, self.num_generations,
                                                    self.scale_rewards, out["completion_ids"].shape[1],
                                                    slice(start, start + len(inputs)))
        return out

    # ------------------------------------------------------------------------- dynamic sampling

    def _generate(self, prompts):
        out = super()._generate(prompts)
        if self.dynamic_rounds is not None:  # each completion's own tokens (feedback left out): the step's cost
            ids, mask = out[1], out[2]
            self._round_lengths = [sum(m) for m in mask] if mask is not None else [len(x) for x in ids]
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.dynamic_rounds is not None:  # every process's, gathered: the same on every process
            rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
            rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscored, as TRL marks it
            self._round_rewards = rewards.tolist()
        return rewards_per_func

    def _dynamic_batch(self, inputs):
        """Rounds of TRL's generation and scoring until every process holds its share of groups
        that teach, or the cap; the kept groups as the one batch TRL trains the step on."""
        G, P, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        plan = ds.StepPlan(P, len(inputs) // G)
        ids = list(self.train_dataset["id"]) if "id" in self.train_dataset.column_names else None
        index = {pid: i for i, pid in enumerate(ids or [])}
        # The step's problems whose group taught nothing are not drawn again in it: the same policy
        # would most likely tie again. A problem whose group taught may come back.
        tied: set[int] = set()
        outs, lengths, kinds, batch = [], [], [], inputs
        if ids is not None:  # every process's groups' problems, in TRL's order
            drawn = [index.get(pid, -1) for pid in gather_object([row.get("id") for row in inputs[::G]])]
        if self.group_log is not None:
            self.group_log.take()  # a group logged outside a step (none expected) must not shift the kinds
        for round_ in range(self.dynamic_rounds + 1):
            if round_:
                gen = ds.round_generator(self.args.seed, self.state.global_step, round_)
                weights = [self.tracker.keep_probability(p) for p in ids] if self.tracker and ids is not None \
                    else [1.0] * len(self.train_dataset)
                drawn = ds.draw_prompts(P * plan.quota, weights, tied, gen)
                mine = drawn[rank * plan.quota:(rank + 1) * plan.quota]
                batch = [dict(self.train_dataset[i]) for i in mine for _ in range(G)]
            outs.append(self._generate_and_score_round(batch))
            lengths.append(self._round_lengths)
            teaches = ds.teaching_groups(self._round_rewards, G, self.min_std)
            plan.add(teaches)
            if ids is not None:
                tied |= {i for i, t in zip(drawn, teaches) if not t and i >= 0}
            if self.group_log is not None:
                kinds += [ds.dropped_kind(g, self.min_std) for g in self.group_log.take()]
            if not plan.shortfall():
                break
        picks = plan.picks(rank)
        out = ds.take_rows(outs, picks, G, self._tokenizer.pad_token_id)
        loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        trained = sum(sum(lengths[r][j * G:(j + 1) * G]) for r, j in picks)
        tokens = self.accelerator.gather(torch.tensor([float(trained), float(sum(map(sum, lengths)))],
                                                      device=self.accelerator.device)).view(-1, 2).sum(dim=0).tolist()
        for key, value in ds.step_figures(plan, kinds if self.group_log is not None else None, tokens).items():
            self._metrics["train"][ds.METRIC_DYNAMIC[key]].append(value)
        return out
