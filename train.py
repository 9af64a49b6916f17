"""GRPO + LoRA training of a small code model to write OCaml, rewarded by compiling and testing.

Modes:
    python train.py                        # train (GRPO) with the config below (env vars / .envrc override)
    python train.py --help                 # every variable, its default and meaning (no torch import)
    python train.py --check [--gpu GB]     # the run's peak memory, estimated, beside what the device has; no training
    python train.py sft                    # SFT warm start on reference solutions (python train.py sft --help)
    python train.py demo                   # offline demo that learns: SFT warm start, GRPO, before/after table
    python train.py merge grpo_runs/final_adapter merged_model   # fold the LoRA adapter into a standalone model
    python train.py model qwen2.5-coder-0.5b-instruct          # verify and convert a named model once (make model-qwen05)

    GRPO_PLUMBING=1 python train.py        # the plumbing run: tiny random Qwen2, bundled problems, CPU, ~1 min
    GRPO_RESUME=never python train.py      # start over even if the output dir has checkpoints
    accelerate launch train.py             # several GPUs; only the main process writes logs

Outputs (GRPO_OUTPUT_DIR, default grpo_runs/):
    config.json                              resolved config, keys = env var names
    metrics.jsonl                            the record of every log step (pandas: pd.read_json(path, lines=True))
    learning.log                             the same as text: a metric line per log step + [Health]/[Stop] lines (also on the console)
    reward_logs/completions.jsonl            every completion with its reward
    reward_logs/syntax_aware_breakdown.jsonl the reward split into structural/type/compile/tests
    reward_logs/problem_tracking.jsonl       each GRPO group's kind and its problem's state (GRPO_TRACK_PROBLEMS)
    problem_selection.jsonl                  kept/dropped problems with the reason (GRPO_PROBLEM_STATS)
    checkpoint-*/                            every GRPO_SAVE_STEPS; GRPO_RESUME=auto picks up the last
    final_adapter/                           the LoRA adapter (+ tokenizer) at the end
    finished.json                            where and why the run ended; the same command then trains nothing
    previous_runs/<time>/                    an earlier run's logs and config.json, moved aside by a fresh run

Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint and stops; run the same command
to resume from it. A second Ctrl-C stops at once (the last checkpoint is kept).

Config precedence: process environment > GRPO_PLUMBING defaults > ./.envrc > the defaults defined in
ocaml_grpo/config/ (grpo.py the trainer's, scoring.py the reward's, isolation.py the sandbox's);
`--help` lists them.
"""
import atexit
import gc
import os
import sys
from pathlib import Path

# None of these imports torch: --help, a config error or a missing toolchain answer in a second.
from ocaml_grpo.commands import demo as demo_command
from ocaml_grpo.commands import preflight
from ocaml_grpo.commands import sft as sft_command
from ocaml_grpo.config import AUDIT_SETTINGS, PLUMBING_DEFAULTS, REWARD_SETTINGS, SANDBOX_SETTINGS, SftConfig, TrainConfig
from ocaml_grpo.config.settings import cache_dir, describe, settings_of
from ocaml_grpo.models import named as named_models
from ocaml_grpo.models.loading import adapter_base, merge_adapter

# The interpreter's last garbage collections walk torch's, transformers' and datasets' object graphs
# for ~1.7 s at exit. Nothing needs them: our logs are written with os.write, the libraries save
# with `with` blocks. Freezing the heap at exit skips them.
atexit.register(gc.freeze)


def fail(message: str) -> int:
    """sys.exit(message) as main's return value: the message on stderr, status 1."""
    print(message, file=sys.stderr)
    return 1


def print_help() -> None:
    print(__doc__)
    print("Environment variables (default: meaning; accepted values):")
    print("The trainer's (ocaml_grpo/config/grpo.py):")
    print(describe(settings_of(TrainConfig)))
    print(f"  GRPO_PLUMBING=1 sets: {' '.join(f'{k}={v}' for k, v in PLUMBING_DEFAULTS.items())} "
          f"BASE_MODEL_ID={preflight.plumbing_model_folder()}")
    print("The reward's (ocaml_grpo/config/scoring.py):")
    print(describe(REWARD_SETTINGS))
    print("The dataset audit's (ocaml_grpo/config/grpo.py):")
    print(describe(AUDIT_SETTINGS))
    print("The sandbox's (ocaml_grpo/config/isolation.py):")
    print(describe(SANDBOX_SETTINGS))
    print("python train.py sft also reads (python train.py sft --help): "
          + " ".join(s.name for s in settings_of(SftConfig)))


def merge(adapter_dir: str, merged_dir: str) -> int:
    """Fold a LoRA adapter into its base model so it loads without peft (e.g. for vLLM / llama.cpp export)."""
    if not (Path(adapter_dir) / "adapter_config.json").is_file():
        return fail(f"merge: {adapter_dir} is not a LoRA adapter (no adapter_config.json there); "
                    "e.g. python train.py merge grpo_runs/final_adapter merged_model")
    merge_adapter(adapter_dir, merged_dir)
    print(f"merged {adapter_dir} into {adapter_base(adapter_dir)} -> {merged_dir}")
    return 0


def main(argv: list[str]) -> int:
    # ------------------------------------------------------------------------- modes
    if argv and argv[0] in ("-h", "--help"):
        print_help()
        return 0
    if argv and argv[0] == "sft":  # the SFT warm start: ocaml_grpo/commands/sft.py
        return sft_command.main(argv[1:])
    if argv and argv[0] == "demo":  # SFT warm start + GRPO + before/after table: ocaml_grpo/commands/demo.py
        return demo_command.main(argv[1:])
    if argv and argv[0] == "model":  # a named model, installed, verified and converted once: ocaml_grpo/models/named.py
        return named_models.main(argv[1:], cache_dir(os.environ))
    if argv and argv[0] == "merge":
        return merge(*argv[1:]) if len(argv) == 3 else fail("usage: python train.py merge ADAPTER_DIR OUT_DIR")
    # --check: everything up to the memory estimate, then stop (nothing written to the output folder).
    # --gpu GB sizes a GPU run on a machine without that GPU: bf16, checkpointing, GB free.
    check, gpu_gb = bool(argv) and argv[0] == "--check", None
    if check:
        argv = argv[1:]
        if argv[:1] == ["--gpu"]:
            try:
                gpu_gb, argv = float(argv[1]), argv[2:]
            except (IndexError, ValueError):
                return fail("usage: python train.py --check [--gpu GB]  (GB: the GPU's free memory, e.g. 80)")
    if argv:
        return fail(f"unknown argument {argv[0]!r}; see python train.py --help")

    # ------------------------------------------------------------------------- GRPO, phase by phase
    try:
        plan = preflight.config()                        # every setting validated, the engine, the checkpoint to resume
        data = preflight.data(plan, check)               # the grader's toolchain, the problems a run keeps, the tokenizer
        fit = preflight.memory_fit(plan, data, gpu_gb, check)  # the peak memory beside the device's, before any model loads
    except preflight.Stop as stop:
        if stop.status == 0:
            print(stop.message)
            return 0
        return fail(stop.message)
    from ocaml_grpo.commands import grpo_run             # torch, TRL and the trainer: only once every check has passed
    built = grpo_run.build(plan, data, fit)              # the model, the output folder, the reward, the trainer
    return grpo_run.run(plan, data, built)               # to the end or a stop; the adapter and finished.json


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
