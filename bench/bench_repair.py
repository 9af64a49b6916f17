"""GRPO single-turn against GRPO with repair turns, side by side, compute-matched, on CPU with the
demo's learner model.

    python -m bench.bench_repair --json OUT.json           # ~5 min on 2 cores
    python -m bench.bench_repair --seed 1 --turns 2 --json repair-1.json
    python -m bench.bench_repair --model smollm2-135m-instruct --steps 4 --eval-samples 16 \
        --json bench/results/repair_real_model.json       # a real model (`make model`): 31 min on 2 cores

1. The learner model (ocaml_grpo/models/tiny.py), or --model, gets the demo's SFT warm
   start (`python train.py sft`, stopped at partial memorisation) on the demo's training problems.
   A real model gets REAL_RECIPE: a pretrained model's rate, 128-token answers stopped at the END
   marker (GRPO_STOP_AT_END) and prompts without worked examples (on 2 cores the examples are most
   of what sampling costs), everything else the same.
2. repair: `python train.py` from that start with GRPO_REPAIR_TURNS=--turns for --steps steps.
3. single: `python train.py` from the same start, single-turn, checkpointed every step, for up to
   three times as many steps; it is judged at the checkpoint where the completion tokens it
   generated first reach the repair run's (feedback tokens are not generated and not counted:
   TRL's completions/mean_length counts the model's own tokens only).
4. The SFT model and each run's model are sampled as GRPO samples (same temperature, budget and
   sampling seed) on the training problems and graded by the training grader: the share solving
   every test at turn 1, and, for the repair run, after its repair turns with the same feedback.

Reported per run (JSON keys): tokens, grpo_steps, frac_zero_std (mean over the run's log steps up
to the matched one), pass_turn1_before (the SFT model), pass_turn1_after, pass_final_after (the
final turn; the same as turn 1 for single).
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from bench import arguments, fresh_run_dir, matched_model, print_table, write_json
from ocaml_grpo.models.loading import quiet_library_warnings
from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.grading.feedback import feedback_for
from ocaml_grpo.jsonl import read_jsonl
from ocaml_grpo.problems import load_problems
from ocaml_grpo.commands import demo
from ocaml_grpo.training.metrics import METRICS_FILE, StepRecord
from ocaml_grpo.models.named import resolve_model
from ocaml_grpo.training.repair import sample_episodes
from ocaml_grpo.models.tiny import ensure_learner_model, learner_model_dir
from rewards import RewardConfig, RewardScorer

RECIPE = demo.RECIPE
STEPS = 24  # the repair run's
# Groups of 4, the regime repair is for: with a pass rate near the SFT model's 0.3, a quarter of
# single-turn groups fail together (0.7^4) and teach nothing; the demo's 12 almost never do.
GENERATIONS = 4
EVAL_SAMPLES = 48  # per training problem and model
MARK = ".bench_repair"
# A pretrained model: full fine-tune at a pretrained model's rate (the learner's 3e-3 would wreck
# it), longer answers (SmolLM2's tokenizer spends ~2x the learner's tokens on them), LoRA at r 32.
REAL_RECIPE = replace(RECIPE, sft_learning_rate="1e-4", sft_max_steps="60", max_completion="128",
                      learning_rate="2e-4", lora_r="32", lora_alpha="64")
REAL_ENV = {"GRPO_PROMPT_EXAMPLES": "0", "GRPO_STOP_AT_END": "1"}


def records(run: Path) -> list[StepRecord]:
    return [StepRecord.from_json(r) for r in read_jsonl(run / METRICS_FILE)[0]]


def tokens_per_step(run: Path, completions_per_step: int) -> list[float]:
    """Completion tokens the model generated at each step (its own tokens, feedback excluded)."""
    return [(r.completion_length or 0.0) * completions_per_step for r in records(run)]


def passes(model_dir: str, problems: list, turns: int, scorer: RewardScorer, seed: int, recipe: "demo.Recipe",
           samples: int, real: bool) -> tuple[float, float]:
    """Shares of the completions solving every test at turn 1 and after the last turn."""
    with ThreadPoolExecutor(2) as pool:
        episodes = sample_episodes(model_dir, None, problems, samples, turns,
                                   lambda p, a: feedback_for(scorer.grader, p, a), pool, int(recipe.max_completion),
                                   float(recipe.temperature), len(problems), seed, top_k=0,
                                   **({"examples": 0, "stop_at_end": True} if real else {}))
    flat = [(p, e) for p, eps in zip(problems, episodes) for e in eps]
    max_c = int(recipe.max_completion)
    first = scorer.score_batch([p for p, _ in flat], [e.answers[0] for _, e in flat],
                               [e.answer_tokens[0] for _, e in flat], max_c)
    final = scorer.score_batch([p for p, _ in flat], [e.answers[-1] for _, e in flat],
                               [e.answer_tokens[-1] for _, e in flat], max_c)
    return sum(b.solved for b in first) / len(first), sum(b.solved for b in final) / len(final)


def main(argv: list[str] | None = None) -> int:
    ap = arguments(__doc__, out="grpo_runs/bench-repair")
    ap.add_argument("--seed", default=RECIPE.seed, help="GRPO_SEED of both runs (the SFT stage keeps 42)")
    ap.add_argument("--steps", type=int, default=STEPS, help="the repair run's GRPO steps")
    ap.add_argument("--turns", type=int, default=1, help="GRPO_REPAIR_TURNS of the repair run")
    ap.add_argument("--generations", type=int, default=GENERATIONS,
                    help="GRPO_NUM_GENERATIONS of both runs (the demo's 12 leave no group without variance)")
    ap.add_argument("--model", default="", help="a named model, a .gguf file or a model folder (default: the demo's learner)")
    ap.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES, help="samples per training problem and model")
    ap.add_argument("--lr", default=None, help="GRPO_LEARNING_RATE of both runs (default: the recipe's; 2e-4 for a "
                                               "real model broke Qwen2.5-Coder-0.5B in two steps, use 5e-5 there)")
    ap.add_argument("--sft-lr", default=None, help="SFT_LEARNING_RATE of the warm start (default: the recipe's; a "
                                                   "real model's 1e-4 broke Qwen2.5-Coder-0.5B in one full step)")
    ap.add_argument("--min-lines", default=None, help="MIN_NON_EMPTY_LINES of both GRPO runs (default: the project's 8)")
    ap.add_argument("--grad-accum", type=int, default=1,
                    help="split each step's prompts over this many accumulated passes (same step, less memory)")
    args = ap.parse_args(argv)
    real = bool(args.model)
    recipe = replace(REAL_RECIPE if real else RECIPE, generations=str(args.generations))
    if args.lr:
        recipe = replace(recipe, learning_rate=str(args.lr))
    if args.sft_lr:
        recipe = replace(recipe, sft_learning_rate=str(args.sft_lr))
    extra_env = dict(REAL_ENV if real else {})
    if args.min_lines is not None:
        extra_env["MIN_NON_EMPTY_LINES"] = str(args.min_lines)
    if args.grad_accum > 1:
        prompts = int(recipe.batch_size)
        if prompts % args.grad_accum:
            ap.error(f"--grad-accum {args.grad_accum} does not divide the {prompts} prompts of a step")
        extra_env |= {"GRPO_BATCH_SIZE": str(prompts // args.grad_accum), "GRPO_GRAD_ACCUM_STEPS": str(args.grad_accum)}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "2" if real else "1")  # a 135M model wants both cores
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers.utils import logging as hf_logging
    quiet_library_warnings()
    out = fresh_run_dir(args.out, MARK)
    t0 = time.time()
    echo = lambda l: l.startswith(("[SFT]", "repair turns", "done in", "warning"))  # noqa: E731

    model = (resolve_model(args.model, cache_dir(os.environ)) if real
             else ensure_learner_model(learner_model_dir(cache_dir(os.environ))))
    problems_file = demo.write_problems(recipe, out / "problems.jsonl")
    sft = out / "sft"
    demo.run_stage("SFT warm start", [str(demo.TRAIN), "sft"],
                   {**demo.sft_env(recipe, model, problems_file, sft), **extra_env}, out, out / "sft.out", echo)

    def grpo(name: str, steps: int, **extra) -> Path:
        env = {**demo.grpo_env(recipe, sft, out / name), **extra_env, "GRPO_MAX_STEPS": str(steps),
               "GRPO_SEED": str(args.seed), **{k: str(v) for k, v in extra.items()}}
        demo.run_stage(f"GRPO {name}", [str(demo.TRAIN)], env, out, out / f"{name}.out", echo)
        return out / name

    per_step = int(recipe.batch_size) * int(recipe.generations)
    repair = grpo("repair", args.steps, GRPO_REPAIR_TURNS=args.turns)
    budget = sum(tokens_per_step(repair, per_step))
    single = grpo("single", 3 * args.steps, GRPO_REPAIR_TURNS=0, GRPO_SAVE_STEPS=1, GRPO_SAVE_TOTAL_LIMIT=3 * args.steps)
    single_tokens = tokens_per_step(single, per_step)
    matched, spent, single_model = matched_model(single, single_tokens, budget)

    print("\n== pass rates, sampled as GRPO samples (same seed), training grader", flush=True)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    problems = load_problems(str(sft / "train_problems.jsonl"))
    scorer = RewardScorer(replace(RewardConfig(), min_lines=0))
    try:
        sampled = {"recipe": recipe, "samples": args.eval_samples, "real": real}
        before, _ = passes(str(sft / "final_model"), problems, 0, scorer, 0, **sampled)
        single_first, _ = passes(single_model, problems, 0, scorer, 0, **sampled)
        repair_first, repair_final = passes(demo.merge_adapter(repair), problems, args.turns, scorer, 0, **sampled)
    finally:
        scorer.close()

    def zero_std(run: Path, steps: int) -> float:
        zs = [r.frac_zero_std for r in records(run)[:steps] if r.frac_zero_std is not None]
        return sum(zs) / len(zs)

    results = {
        "single": {"tokens": round(spent), "grpo_steps": matched, "frac_zero_std": zero_std(single, matched),
                   "pass_turn1_before": before, "pass_turn1_after": single_first, "pass_final_after": single_first},
        "repair": {"tokens": round(budget), "grpo_steps": args.steps, "turns": args.turns,
                   "frac_zero_std": zero_std(repair, args.steps), "pass_turn1_before": before,
                   "pass_turn1_after": repair_first, "pass_final_after": repair_final,
                   "mean_turns": sum(r.repair["turns"] or 1 for r in records(repair)) / len(records(repair))},
        "problems": list(recipe.train_ids), "generations": args.generations, "eval_samples": args.eval_samples,
        "seed": args.seed, "model": args.model or "the demo's learner",
        "recipe": {k: getattr(recipe, k) for k in ("sft_learning_rate", "max_completion", "temperature", "learning_rate",
                                                   "lora_r")} | extra_env,
        "seconds": round(time.time() - t0)}
    print_table(["run", "GRPO steps", "completion tokens", "mean frac_zero_std", "pass turn 1 before", "after",
                 "final turn after"],
                [[name, str(r["grpo_steps"]), str(r["tokens"]), f"{r['frac_zero_std']:.3f}", f"{r['pass_turn1_before']:.3f}",
                  f"{r['pass_turn1_after']:.3f}", f"{r['pass_final_after']:.3f}"]
                 for name, r in ((n, results[n]) for n in ("single", "repair"))])
    print(f"\n{results['seconds']} s")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
