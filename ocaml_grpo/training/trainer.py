"""The GRPOTrainer train.py runs: TRL's, with two hooks.

- The sampler: with a ProblemTracker, tracking.TrackedSampler draws the generation batches in place
  of TRL's RepeatSampler (problems whose last group taught nothing come back less often).
- Repair episodes (GRPO_REPAIR_TURNS): the first answer's tokens get the first answer's own
  advantage, the later answers' keep the episode's (repair.first_answer_advantages). The per-answer
  grades come from the reward function, which hands them over through `turn_grades`;
  TRL 1.16's loss takes advantages per token, shaped (completions, tokens), from a subclass.
- Answers stop at the END marker (GRPO_STOP_AT_END, `stop`): generate gets the tokenizer its stop
  strings need, and each answer that stopped there ends its turn (engines.end_turn_at_stop).
- Dynamic sampling (GRPO_DYNAMIC_SAMPLING, `dynamic_rounds`): a step's generation is repeated for
  newly drawn problems until the batch holds only groups that teach, or the cap; TRL then gets
  one step's batch of the kept groups (dynamic_sampling.py). None: TRL's generation, untouched.
- The run folder's README.md is ours (run_dir.write_readme), not TRL's hub model card; so is each
  adapter folder's, not peft's.
- The llama.cpp engine (GRPO_ENGINE=llamacpp, `llama`): before each step's generation the live LoRA
  weights go to the engine as a GGUF adapter; the engine samples every answer, and TRL's
  importance-sampling correction for vLLM's rollouts (its `use_vllm` branches: the ratio of the
  trainer's to the engine's log-probabilities, masked or clipped as GRPOConfig's
  vllm_importance_sampling_* say) weighs the loss, as it would for vLLM. The share of ratios that
  bound masks or clips is logged beside TRL's ratio and log-probability gap.
  The ratio comes from the loss's own forward pass (`late_ratio`), not from TRL's extra no-grad
  pass over every generated answer (dropped groups included): where the loss's policy is the one
  that sampled (one iteration, each generation batch trained within one optimizer step, no KL
  reference, not vespo) the two are the same numbers, and the step skips a forward pass.
- The group's prompt once (GRPO_SHARED_PREFIX, `share_prompts`): TRL's log-probability passes, the
  loss's forward and backward among them, run on shared-prefix packs (shared_prefix.py), which
  give the same values and gradients with each group's prompt encoded once.
- Before each generation, the input-embedding hooks that gradient checkpointing's toggling left
  behind are removed (engines.drop_orphaned_input_hooks): they pile up every step, and the compiled
  engine would recompile for each new one.
"""
from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import gather_object
from torch.utils.data import Sampler
from trl import GRPOTrainer

from ocaml_grpo.training import dynamic_sampling as ds
from ocaml_grpo.training import shared_prefix
from ocaml_grpo.training.engines import drop_orphaned_input_hooks, end_turn_at_stop
from ocaml_grpo.training.tracker import ProblemTracker
from ocaml_grpo.training.llamacpp import LlamaEngine, Sampling, lora_tensors
from ocaml_grpo.training.metrics import METRIC_IS_CLIPPED
from ocaml_grpo.training.repair import TurnGrades, first_answer_advantages
from ocaml_grpo.training.run_dir import write_adapter_readme, write_readme
from ocaml_grpo.training.tracking import TrackedSampler


class OcamlGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer; tracker=None: TRL's own sampler; stop: the text that ends an answer
    (the args' generation_kwargs must stop there too: engines.engine_kwargs(stop=...));
    dynamic_rounds: with dynamic sampling, the extra generation rounds a step may take (None: off);
    group_log: the reward function's gathered groups (dynamic_sampling.GroupLog), to log the kinds
    of the groups dropped (None: not logged); min_std: a group teaches when its rewards' std is at
    least this (GRPO_LEARNABLE_MIN_STD; 0: any difference); llama: the llama.cpp engine that
    generates every answer (None: TRL's own engines); share_prompts: the log-probability passes
    (the loss's included) encode each group's prompt once (shared_prefix.py; GRPO_SHARED_PREFIX);
    late_ratio: with the engine, its importance ratio from the loss's forward where that is exact
    (False: TRL's extra no-grad pass, kept for comparison: bench_train's `+oldpass`)."""

    def __init__(self, *args, tracker: ProblemTracker | None, stop: str | None = None,
                 dynamic_rounds: int | None = None, group_log: ds.GroupLog | None = None, min_std: float = 0.0,
                 llama: LlamaEngine | None = None, share_prompts: bool = False,
                 turn_grades: TurnGrades | None = None, late_ratio: bool = True, **kwargs):
        self.tracker = tracker
        self.turn_grades = turn_grades
        self.stop = stop
        self.dynamic_rounds, self.group_log, self.min_std = dynamic_rounds, group_log, min_std
        self._round_rewards = self._round_lengths = None
        self.llama, self._llama_step, self._llama_calls = llama, None, 0
        self.share_prompts = share_prompts
        self.late_ratio = False
        self._scoring = False  # inside TRL's generation and scoring
        self._loss_inputs: dict | None = None  # the batch whose loss is being computed
        super().__init__(*args, **kwargs)
        if llama is not None:
            if self.args.use_vllm:
                raise ValueError("the llama.cpp engine and vLLM: choose one")
            # TRL corrects vLLM's rollouts in its `use_vllm` branches; vLLM itself is reached only
            # through `_generate_single_turn` and the weight sync in `_generate`, both taken over here.
            self.use_vllm = True
            self._last_loaded_step = -1
        args = self.args
        self.late_ratio = (late_ratio and llama is not None and self.vllm_importance_sampling_correction
                           and self.beta == 0.0 and self.num_iterations == 1
                           and args.gradient_accumulation_steps % args.steps_per_generation == 0
                           and self.loss_type != "vespo")

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

    def sync_llama(self) -> None:
        """Give the engine the trainer's current LoRA weights (once per optimizer step)."""
        model = self.accelerator.unwrap_model(self.model)
        config = model.peft_config[model.active_adapter]
        if getattr(config, "use_rslora", False) or getattr(config, "use_dora", False):
            raise ValueError("the llama.cpp engine runs plain LoRA (scale alpha / r): no rsLoRA or DoRA")
        shape = self.llama.shape
        self.llama.set_lora(lora_tensors(model.named_parameters(), shape["arch"], shape["n_head"], shape["n_head_kv"]),
                            config.lora_alpha)
        self._llama_step = self._last_loaded_step = self.state.global_step

    def _llama_generate(self, prompt_ids: list[list[int]]):
        if self._llama_step != self.state.global_step:
            self.sync_llama()
        args, tok = self.args, self._tokenizer
        sampling = Sampling(args.temperature, args.top_p if args.top_p is not None else 1.0, args.top_k or 0,
                            args.min_p or 0.0)
        if (args.repetition_penalty or 1.0) != 1.0:
            raise ValueError("the llama.cpp engine samples without a repetition penalty")
        self._llama_calls += 1
        decode = partial(tok.decode, skip_special_tokens=True)
        answers = self.llama.generate(prompt_ids, self.max_completion_length, sampling, stop_ids=set(self.eos_token_ids),
                                      decode=decode, stop=self.stop,
                                      seed=hash((args.seed, self.state.global_step, self._llama_calls)) % 2**32)
        if self.stop is None:
            return answers.ids, answers.logprobs
        # the end-of-turn token added after the END marker was not sampled: NaN, which TRL's correction ignores
        return end_turn_at_stop(answers.ids, answers.logprobs, decode, self.stop, {*self.eos_token_ids, tok.pad_token_id},
                                tok.eos_token_id, unsampled_logprob=float("nan"))

    def _generate_single_turn(self, *args, **kwargs):
        model = self.accelerator.unwrap_model(self.model)
        drop_orphaned_input_hooks(model)
        if self.llama is not None:
            return self._llama_generate(args[0] if args else kwargs["prompt_ids"])
        if self.stop is None:
            return super()._generate_single_turn(*args, **kwargs)
        if "generate" not in vars(model):  # transformers' stop strings need the tokenizer; TRL passes none
            model.generate = partial(model.generate, tokenizer=self._tokenizer)
        ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        tok = self._tokenizer
        return end_turn_at_stop(ids, logprobs, partial(tok.decode, skip_special_tokens=True), self.stop,
                                {*self.eos_token_ids, tok.pad_token_id}, tok.eos_token_id)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        if self.late_ratio and self._scoring and not torch.is_grad_enabled():
            # TRL's old-log-probability pass (the only no-grad one without a KL reference): its values
            # are never used, the loss's forward gives the ratio (_compute_loss, _set_engine_ratio)
            return torch.zeros(input_ids.shape[0], logits_to_keep, device=input_ids.device), None, None
        if not self.share_prompts or compute_aux_loss or any(v is not None for v in multimodal.values()):
            out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                                             compute_entropy, compute_aux_loss, **multimodal)
        else:
            out = (*shared_prefix.logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                      self._tokenizer.pad_token_id, batch_size, compute_entropy,
                                                      self.accelerator.autocast), None)
        if self._loss_inputs is not None:
            self._set_engine_ratio(self._loss_inputs, out[0].detach())
        return out

    def _compute_loss(self, model, inputs):
        if not self.late_ratio:
            return super()._compute_loss(model, inputs)
        # TRL reads the ratio from `inputs` after its forward pass; with no old log-probabilities
        # there (_generate_and_score_round dropped them) it takes the loss's own, detached
        self._loss_inputs = inputs
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._loss_inputs = None

    def _set_engine_ratio(self, inputs: dict, logps: torch.Tensor) -> None:
        """The engine's importance ratio for the batch, from the trainer's log-probabilities `logps`
        (the loss's forward), as TRL computes it from its extra pass, and its figures in TRL's names."""
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        sampling = inputs["sampling_per_token_logps"]
        mode = self.vllm_importance_sampling_mode
        ratio = engine_ratio(logps, sampling, mask, mode, self.vllm_importance_sampling_clip_min,
                             self.vllm_importance_sampling_clip_max)
        inputs["importance_sampling_ratio"] = ratio
        m = self._metrics["train" if self.model.training else "eval"]
        delta = (logps - sampling).abs()
        delta = delta[mask.bool() & ~torch.isnan(delta)]
        gather = self.accelerator.gather
        zero = torch.tensor(0.0, device=logps.device)
        m["sampling/sampling_logp_difference/mean"].append(gather(delta.mean() if delta.numel() else zero).mean().item())
        m["sampling/sampling_logp_difference/max"].append(gather(delta.max() if delta.numel() else zero).max().item())
        flat = ratio.flatten() if mode.startswith("sequence") else ratio[mask.bool()]
        for name, f in (("min", torch.min), ("mean", torch.mean), ("max", torch.max)):
            m[f"sampling/importance_sampling_ratio/{name}"].append(
                getattr(gather(f(flat) if flat.numel() else zero), name)().item())
        m[METRIC_IS_CLIPPED].append(clipped_share(ratio, mask, mode, self.vllm_importance_sampling_clip_min,
                                                  self.vllm_importance_sampling_clip_max, self.accelerator))

    def _generate_and_score_completions(self, inputs):
        if self.dynamic_rounds is None or not self.model.training:
            return self._generate_and_score_round(inputs)
        return self._dynamic_batch(inputs)

    def _generate_and_score_round(self, inputs):
        self._scoring = True
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self._scoring = False
        if self.late_ratio:  # TRL's ratio and its figures came from the skipped pass: set again in the loss
            out.pop("old_per_token_logps", None)
            out.pop("importance_sampling_ratio", None)
            m = self._metrics["train" if self.model.training else "eval"]
            for name in TRL_RATIO_METRICS:
                m[name].pop()
        elif self.llama is not None and "importance_sampling_ratio" in out:
            mode = "train" if self.model.training else "eval"
            self._metrics[mode][METRIC_IS_CLIPPED].append(clipped_share(
                out["importance_sampling_ratio"], out["completion_mask"], self.vllm_importance_sampling_mode,
                self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max, self.accelerator))
        if not inputs or "repair" not in inputs[0]:
            return out
        episodes = [row["repair"] for row in inputs]
        if self.turn_grades is None:
            raise RuntimeError("repair turns need the trainer's turn_grades, handed to the reward function as its "
                               "on_turn_grades (training/repair.py's TurnGrades)")
        # TRL normalises over the whole generation batch, which other processes hold parts of
        grades = gather_object([g[0] for g in self.turn_grades.take(len(episodes))])
        lengths = gather_object([e["answer_tokens"][0] for e in episodes])
        start = self.accelerator.process_index * len(inputs)
        out["advantages"] = first_answer_advantages(out["advantages"], grades, lengths, self.num_generations,
                                                    self.scale_rewards, out["completion_ids"].shape[1],
                                                    slice(start, start + len(inputs)))
        return out

    # ------------------------------------------------------------------------- dynamic sampling

    def _generate(self, prompts):
        if self.llama is not None and self._llama_step != self.state.global_step:
            self.sync_llama()  # before TRL's own check, which would sync vLLM
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


# What TRL 1.16's generation and scoring log once per call from its old-log-probability pass
TRL_RATIO_METRICS = ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
                     "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                     "sampling/importance_sampling_ratio/max")


def engine_ratio(logps: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, mode: str,
                 clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """The importance ratio trainer / engine (GRPOConfig's vllm_importance_sampling_*): per token,
    or per sequence (the sum of its tokens' log-ratios; shaped (B, 1)), clipped into the bounds
    (`*_truncate`) or set to 0 outside them (`*_mask`). A token the engine did not sample (NaN)
    counts as a log-ratio of 0."""
    diff = torch.nan_to_num((logps - sampling) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode.endswith("mask"):
        low = clip_min if clip_min is not None else -math.inf
        high = clip_max if clip_max is not None else math.inf
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"unknown importance sampling mode {mode!r}")


def clipped_share(ratio: torch.Tensor, completion_mask: torch.Tensor, mode: str, clip_min: float | None,
                  clip_max: float | None, accelerator) -> float:
    """The share of the engine's samples (sequences, or tokens in the token modes) whose importance
    ratio the bound masked (set to 0) or clipped (held at a bound), over every process."""
    if mode.startswith("sequence"):
        values = ratio.flatten()
    else:
        values = ratio[completion_mask.bool()]
    if mode.endswith("mask"):
        out = values == 0
    else:
        out = torch.zeros_like(values, dtype=torch.bool)
        if clip_max is not None:
            out |= values >= clip_max
        if clip_min is not None:
            out |= values <= clip_min
    counts = accelerator.gather(torch.tensor([float(out.sum()), float(out.numel())], device=ratio.device)).view(-1, 2).sum(0)
    return (counts[0] / counts[1]).item() if counts[1] > 0 else 0.0
