"""`python evaluate.py`'s work once its arguments are read: the problems chosen and checked before
any model loads, the samples drawn (transformers, vLLM, llama.cpp, or episodes with repair turns),
graded by the training grader, and the report written (report.json, report.md, completions.jsonl).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ocaml_grpo.config import RewardConfig
from ocaml_grpo.config.settings import cache_dir, from_env
from ocaml_grpo.models.loading import go_offline_unless_needed, model_error
from ocaml_grpo.models.named import resolve_model
from ocaml_grpo.models.tiny import ensure_plumbing_model, plumbing_model_dir
from ocaml_grpo.problems import DatasetError, Problem, load_problems
from ocaml_grpo.prompting import chat_messages
from ocaml_grpo.scoring import RewardScorer
from ocaml_grpo.training import llamacpp
from ocaml_grpo.training.repair import sample_episodes
from ocaml_grpo.training.sampling import RATES, generate_hf, generate_llamacpp, generate_vllm, grade_completions


class InputError(Exception):
    """An argument, a dataset or a model the evaluation cannot use: said before any model loads."""


@dataclass
class Samples:
    texts: list[list[str]]
    lens: list[list[int]]
    episodes: list | None  # with --repair-turns: every turn of each episode
    seconds: float


def choose_problems(args: argparse.Namespace) -> list[Problem]:
    """The problems to sample (--ids, else --n drawn by --seed), the model and the engine checked:
    a bad path or a missing toolchain costs seconds, not a model load."""
    if note := go_offline_unless_needed([] if args.model == "plumbing" else [args.model], args.dataset, os.environ):
        print(note)  # before the libraries are imported: they read HF_HUB_OFFLINE once
    try:
        problems = load_problems(args.dataset)
    except DatasetError as e:
        raise InputError(f"dataset error: {e}") from None
    if args.model != "plumbing" and (error := model_error("--model", args.model, os.environ)):
        raise InputError(f"error: {error}")
    if args.engine == "llamacpp" and (errors := llamacpp.run_errors(args.model, args.adapter, cache_dir(os.environ))):
        raise InputError("error: --engine llamacpp: " + "; ".join(errors))
    if not args.ids:
        return random.Random(args.seed).sample(problems, min(args.n, len(problems)))
    ids = Path(args.ids).read_text().split() if Path(args.ids).is_file() else args.ids.split(",")
    by_id = {p.id: p for p in problems}
    if missing := [i for i in ids if i not in by_id]:
        raise InputError(f"error: --ids: {len(missing)} not in {args.dataset}: {', '.join(missing[:5])}")
    return [by_id[i] for i in ids]


def model_folder(model: str) -> str:
    """What --model loads from: the plumbing model built, a named model or a .gguf converted once."""
    if model == "plumbing":
        model = str(ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ))))
    return resolve_model(model, cache_dir(os.environ))


def sample(args: argparse.Namespace, chosen: list[Problem], scorer: RewardScorer, samples: int, temperature: float,
           examples: int, stop_at_end: bool) -> Samples:
    """`samples` answers per problem from the engine asked for (episodes, with --repair-turns)."""
    model_id = model_folder(args.model)
    prompts = [chat_messages(p.prompt, examples) for p in chosen]
    t0 = time.time()
    episodes = None
    if args.repair_turns:
        episodes = sample_episodes(model_id, args.adapter, chosen, samples, args.repair_turns, scorer.feedback,
                                   scorer.pool, args.max_new_tokens, temperature, args.batch_size, args.seed,
                                   examples=examples, stop_at_end=stop_at_end)
        texts = [[e.answers[0] for e in eps] for eps in episodes]
        lens = [[e.answer_tokens[0] for e in eps] for eps in episodes]
    elif args.engine == "llamacpp":
        texts, lens = generate_llamacpp(args.model, args.adapter, prompts, samples, args.max_new_tokens, temperature,
                                        args.batch_size, args.seed, cache_dir(os.environ), stop_at_end)
    elif args.vllm:
        texts, lens = generate_vllm(model_id, args.adapter, prompts, samples, args.max_new_tokens, temperature, args.seed,
                                    stop_at_end)
    else:
        texts, lens = generate_hf(model_id, args.adapter, prompts, samples, args.max_new_tokens, temperature,
                                  args.batch_size, args.seed, stop_at_end=stop_at_end)
    return Samples(texts, lens, episodes, time.time() - t0)


def evaluate(args: argparse.Namespace, chosen: list[Problem], samples: int, temperature: float, examples: int,
             stop_at_end: bool) -> dict:
    """Sample, grade (every answer with the line gate off, so pass@k is about correctness; the
    training reward, gate included, is mean_reward), write the report; returns it."""
    env_cfg = from_env(RewardConfig, os.environ)
    scorer = RewardScorer(replace(env_cfg, min_lines=0))
    out = Path(args.out or f"eval_runs/{time.strftime('%Y%m%d-%H%M%S')}")  # created once there is a report
    try:
        drawn = sample(args, chosen, scorer, samples, temperature, examples, stop_at_end)
        core, rows = grade_completions(chosen, drawn.texts, drawn.lens, args.k, args.max_new_tokens, scorer,
                                       env_cfg.min_lines)
        if episodes := drawn.episodes:
            # RLEF's protocol: the same episodes judged by their last answer
            final, rows = grade_completions(chosen, [[e.answers[-1] for e in eps] for eps in episodes],
                                            [[e.answer_tokens[-1] for e in eps] for eps in episodes], args.k,
                                            args.max_new_tokens, scorer, env_cfg.min_lines)
            flat = [e for eps in episodes for e in eps]
            for row, e in zip(rows, flat):
                row["turns"] = [{"completion": a, "feedback": e.feedback[t] if t < len(e.feedback) else None}
                                for t, a in enumerate(e.answers)]
            core["repair"] = {"turns": args.repair_turns, "pass@1_final": final["pass@1"], "pass@k_final": final["pass@k"],
                              "mean_turns": sum(e.turns for e in flat) / len(flat)}
    finally:
        scorer.close()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "completions.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    report = {"model": args.model, "adapter": args.adapter, "dataset": args.dataset, "n_problems": len(chosen),
              "k": args.k, "samples_per_problem": samples, "temperature": temperature, "seed": args.seed,
              "prompt_examples": examples, **core,
              "generation_seconds": round(drawn.seconds, 1), "problem_ids": [p.id for p in chosen]}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    print(render_markdown(report))
    print(f"report: {out / 'report.md'}")
    return report


def render_markdown(r: dict) -> str:
    title = f"# Evaluation: {r['model']}" + (f" + adapter {r['adapter']}" if r["adapter"] else "")
    lines = [title, "",
             f"Dataset `{r['dataset']}`, {r['n_problems']} problems (seed {r['seed']}), "
             f"{r['samples_per_problem']} sample(s) each at temperature {r['temperature']}.", "",
             "| metric | value |", "|---|---:|",
             f"| pass@1 | {r['pass@1']:.1%} |"] + ([f"| pass@{r['k']} | {r['pass@k']:.1%} |"] if r["k"] > 1 else []) + [
             f"| mean training reward | {r['mean_reward']:.3f} |"]
    if rep := r.get("repair"):
        lines += [f"| pass@1 after up to {rep['turns']} repair turn(s) | {rep['pass@1_final']:.1%} |",
                  f"| mean turns | {rep['mean_turns']:.2f} |"]
    lines += [f"| `{name}` rate: {RATES[name]} | {v:.1%} |" for name, v in r["rates"].items()]
    lines += ["", "| difficulty | problems | pass@1 | mean reward |", "|---|---:|---:|---:|"]
    lines += [f"| {d} | {v['n_problems']} | {v['pass@1']:.1%} | {v['mean_reward']:.3f} |"
              for d, v in r["per_difficulty"].items()]
    lines += ["", f"**Verdict:** {r['verdict']}", ""]
    return "\n".join(lines)

