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
import os
import sys

from ocaml_grpo import prompting
from ocaml_grpo.commands import model_eval, probe
from ocaml_grpo.training.sampling import generate_hf, generate_vllm

atexit.register(gc.freeze)  # skips ~1.7 s of collecting torch's and transformers' objects at exit (see train.py)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--probe" or a.startswith("--probe=") for a in argv):  # the probe for selection: ocaml_grpo/commands/probe.py
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

    try:
        chosen = model_eval.choose_problems(args)  # the data and the model checked before any model loads
    except model_eval.InputError as e:
        print(e, file=sys.stderr)
        return 2
    model_eval.evaluate(args, chosen, samples, temperature, examples, stop_at_end)  # sample, grade, report
    return 0


if __name__ == "__main__":
    sys.exit(main())
