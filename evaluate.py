"""Evaluate a model (optionally with a LoRA adapter) on OCaml problems with the training prompt
and the training grader: whether a base model solves enough problems for GRPO to learn from, and
a before/after check.

    python evaluate.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --n 10 --k 1
    python evaluate.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --adapter grpo_runs/final_adapter --n 50 --k 4
    python evaluate.py --model qwen2.5-coder-0.5b-instruct --n 10 --k 4   # a real model offline (make model-qwen05)
    python evaluate.py --model plumbing --dataset bundled --n 20   # offline: a tiny random model, the bundled problems
    python evaluate.py --model M --dataset problems.jsonl      # your own problems (a local .jsonl, .json, .csv, .parquet)
    python evaluate.py --model PATH --vllm       # generate with vLLM when it is installed
    python evaluate.py --model PATH --repair-turns 1   # pass@1 at turn 1 and after one repair turn
                                                       # (the protocol of RLEF, Gehring et al. 2024)
    python evaluate.py --probe stats.jsonl       # per-problem statistics for GRPO_PROBLEM_STATS
                                                 # (its options: --probe FILE --help)

Writes OUT/report.json, OUT/report.md and OUT/completions.jsonl (default OUT: eval_runs/<time>,
created only once the completions are graded). Each completion carries two rewards:
  graded_reward  the reward with the minimum-lines gate off: what pass@k and "solved" judge
  train_reward   the reward training would give it, MIN_NON_EMPTY_LINES gate included (a correct
                 answer shorter than the gate scores 0 here); mean_reward averages this one
pass@k uses the unbiased estimator 1 - C(n-c, k) / C(n, k) over the n = --samples (default k)
completions per problem. "Solved" means every test of the problem passed.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

from ocaml_grpo.training import probe
from ocaml_grpo.models.tiny import ensure_plumbing_model, plumbing_model_dir
from ocaml_grpo.training.sampling import RATES, generate_hf, generate_llamacpp, generate_vllm, grade_completions
from ocaml_grpo.models.loading import go_offline_unless_needed, model_error
from ocaml_grpo.models.named import resolve_model
from ocaml_grpo.training import llamacpp
from ocaml_grpo.training.repair import sample_episodes
from ocaml_grpo.problems import DatasetError, load_problems
from ocaml_grpo import prompting
from ocaml_grpo.prompting import chat_messages
from ocaml_grpo.config import RewardConfig
from ocaml_grpo.config.settings import cache_dir, from_env
from rewards import RewardScorer

atexit.register(gc.freeze)  # skips ~1.7 s of collecting torch's and transformers' objects at exit (see train.py)

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--probe" or a.startswith("--probe=") for a in argv):  # the probe for selection: ocaml_grpo/training/probe.py
        return probe.main(argv, generate_hf, generate_vllm)
    ap = argparse.ArgumentParser(prog="evaluate.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # The probe is a mode of its own, dispatched above; listed here so that --help shows every mode.
    ap.add_argument("--probe", metavar="FILE", help="the probe mode: per-problem pass statistics for GRPO_PROBLEM_STATS "
                                                   "(its options: python evaluate.py --probe FILE --help)")
    ap.add_argument("--model", required=True, help="hub id, local dir, a named model (smollm2-135m-instruct: `make model`) "
                    "or a .gguf file; `plumbing` = the tiny random model of the plumbing run (offline)")
    ap.add_argument("--adapter", default=None, help="a LoRA adapter dir (e.g. grpo_runs/final_adapter)")
    ap.add_argument("--dataset", default="bundled", help="bundled, a local .jsonl/.json/.csv/.parquet, or a hub id")
    ap.add_argument("--n", type=int, default=10, help="problems sampled (reproducibly, by --seed)")
    ap.add_argument("--ids", default=None, help="these problems (comma-separated ids, or a file of them, one per "
                                                "line) in place of --n's sample")
    ap.add_argument("--k", type=int, default=1, help="the k of pass@k")
    ap.add_argument("--samples", type=int, default=0, help="completions per problem (default k; >= k)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=None, help="default 0 (greedy) for one sample, else 0.8")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8, help="problems per generate() call")
    ap.add_argument("--vllm", action="store_true", help="generate with vLLM (must be installed)")
    ap.add_argument("--engine", default="default", choices=["default", "llamacpp"],
                    help="default: transformers' generate; llamacpp: llama.cpp from the model's GGUF file with the "
                         "adapter set on it (`make engine`; a named model or a .gguf file)")
    ap.add_argument("--repair-turns", type=int, default=0, metavar="N",
                    help="after an answer that does not compile or fails the prompt's examples, show the model the "
                         "feedback training shows (GRPO_REPAIR_TURNS) and let it answer again, up to N times; "
                         "reports pass@1 at turn 1 and after the last turn (transformers generation)")
    ap.add_argument("--prompt-examples", default=os.environ.get("GRPO_PROMPT_EXAMPLES", str(prompting.ALL)),
                    choices=[str(n) for n in range(prompting.ALL + 1)],
                    help="worked examples in the prompt: what the model was trained with (default: "
                         "GRPO_PROMPT_EXAMPLES, else 3)")
    ap.add_argument("--stop-at-end", default=os.environ.get("GRPO_STOP_AT_END", "0"), choices=["0", "1"],
                    help="1: an answer ends at the END marker, as training's do with GRPO_STOP_AT_END=1 (default: "
                         "GRPO_STOP_AT_END, else 0)")
    ap.add_argument("--out", default=None, help="report directory (default eval_runs/<time>)")
    args = ap.parse_args(argv)
    stop_at_end = args.stop_at_end == "1"
    examples = int(args.prompt_examples)
    samples = args.samples or args.k
    errors = [m for bad, m in [(args.n < 1, "--n must be >= 1"), (args.k < 1, "--k must be >= 1"),
                               (samples < args.k, f"--samples {samples} must be >= --k {args.k}"),
                               (args.max_new_tokens < 1, "--max-new-tokens must be >= 1"),
                               (args.repair_turns < 0, "--repair-turns must be >= 0"),
                               (args.repair_turns > 0 and (args.vllm or args.engine != "default"),
                                "--repair-turns samples each turn with transformers: drop --vllm / --engine"),
                               (args.vllm and args.engine != "default", "--vllm or --engine llamacpp: choose one")]
              if bad]
    if errors:
        ap.error("; ".join(errors))
    temperature = args.temperature if args.temperature is not None else (0.0 if samples == 1 else 0.8)
    if samples > 1 and temperature == 0:
        ap.error("several samples per problem need --temperature > 0")

    # Data and grader first: a bad path or a missing toolchain costs seconds, not a model load.
    if note := go_offline_unless_needed([] if args.model == "plumbing" else [args.model], args.dataset, os.environ):
        print(note)  # before the libraries are imported: they read HF_HUB_OFFLINE once
    try:
        problems = load_problems(args.dataset)
    except DatasetError as e:
        print(f"dataset error: {e}", file=sys.stderr)
        return 2
    if args.model != "plumbing" and (error := model_error("--model", args.model, os.environ)):
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.engine == "llamacpp" and (errors := llamacpp.run_errors(args.model, args.adapter, cache_dir(os.environ))):
        print("error: --engine llamacpp: " + "; ".join(errors), file=sys.stderr)
        return 2
    if args.ids:
        ids = Path(args.ids).read_text().split() if Path(args.ids).is_file() else args.ids.split(",")
        by_id = {p.id: p for p in problems}
        if missing := [i for i in ids if i not in by_id]:
            print(f"error: --ids: {len(missing)} not in {args.dataset}: {', '.join(missing[:5])}", file=sys.stderr)
            return 2
        chosen = [by_id[i] for i in ids]
    else:
        chosen = random.Random(args.seed).sample(problems, min(args.n, len(problems)))
    env_cfg = from_env(RewardConfig, os.environ)
    # Grade every completion (no line gate) so pass@k is about correctness; the training reward,
    # gate included, is reported as mean_reward.
    scorer = RewardScorer(replace(env_cfg, min_lines=0))
    model_id = args.model
    if model_id == "plumbing":
        model_id = str(ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ))))
    model_id = resolve_model(model_id, cache_dir(os.environ))  # a named model or a .gguf: converted once
    out = Path(args.out or f"eval_runs/{time.strftime('%Y%m%d-%H%M%S')}")  # created once there is a report

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
    t_gen = time.time() - t0
    try:
        core, rows = grade_completions(chosen, texts, lens, args.k, args.max_new_tokens, scorer, env_cfg.min_lines)
        if episodes:
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
              "generation_seconds": round(t_gen, 1), "problem_ids": [p.id for p in chosen]}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    print(render_markdown(report))
    print(f"report: {out / 'report.md'}")
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
