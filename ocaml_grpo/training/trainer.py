"""The GRPOTrainer train.py runs: TRL's, with two hooks.

- The sampler: with a ProblemTracker, tracking.TrackedSampler draws the generation batches in place
  of TRL's RepeatSampler (problems whose last group taught nothing come back less often).
- Repair episodes (GRPO_REPAIR_TURNS): the first answer's tokens get the first answer's own
  advantage, the later answers' keep the episode's (repair.first_answer_advantages). The per-answer
  grades come from the reward function, which writes them into each episode record (`grades`);
  TRL 1.16's loss takes advantages per token, shaped (completions, tokens), from a subclass.
- Answers stop at the END marker (GRPO_STOP_AT_END, `stop`): generate gets the tokenizer its stop
  strings need, and each answer that stopped there ends its turn (engines.end_turn_at_stop).
- The run folder's README.md is ours (run_dir.write_readme), not TRL's hub model card.
- Before each generation, the input-embedding hooks that gradient checkpointing's toggling left
  behind are removed (engines.drop_orphaned_input_hooks): they pile up every step, and the compiled
  engine would recompile for each new one.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from accelerate.utils import gather_object
from torch.utils.data import Sampler
from trl import GRPOTrainer

from ocaml_grpo.training.engines import drop_orphaned_input_hooks, end_turn_at_stop
from ocaml_grpo.training.group_kinds import ProblemTracker
from ocaml_grpo.training.repair import first_answer_advantages
from ocaml_grpo.training.run_dir import write_readme
from ocaml_grpo.training.tracking import TrackedSampler


class OcamlGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer; tracker=None: TRL's own sampler; stop: the text that ends an answer
    (the args' generation_kwargs must stop there too: engines.engine_kwargs(stop=...))."""

    def __init__(self, *args, tracker: ProblemTracker | None, stop: str | None = None, **kwargs):
        self.tracker = tracker
        self.stop = stop
        super().__init__(*args, **kwargs)

    def create_model_card(self, *args, **kwargs) -> None:
        """TRL's card is written for a hub upload ("a fine-tuned version of [None]", a quick start that
        loads model "None"); the run folder gets a README that says what it holds instead."""
        if self.is_world_process_zero():
            write_readme(Path(self.args.output_dir))

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
