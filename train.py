"""GRPO + LoRA training of a small code model to write OCaml, rewarded by compiling and testing.

    python train.py                        # train with the config below (env vars / .envrc override)
    python train.py --help                 # every variable, its default and meaning (no torch import)
    GRPO_DEMO=1 python train.py            # offline demo: tiny random Qwen2, bundled problems, CPU, <3 min
    GRPO_RESUME=never python train.py      # start over even if the output dir has checkpoints
    accelerate launch train.py             # several GPUs; only the main process writes logs
    python train.py merge grpo_runs/final_adapter merged_model   # fold the LoRA adapter into a standalone model
    python train.py sft                    # SFT warm start on reference solutions (python train.py sft --help)
    python train.py demo                   # offline demo that learns: SFT warm start, GRPO, before/after table

Outputs (GRPO_OUTPUT_DIR, default grpo_runs/):
    config.json                              resolved config, keys = env var names
    learning.log                             one metric line per log step + [Health]/[Stop] lines
    reward_logs/completions.jsonl            every completion with its reward
    reward_logs/syntax_aware_breakdown.jsonl the reward split into structural/type/compile/tests
    checkpoint-*/                            every GRPO_SAVE_STEPS; GRPO_RESUME=auto picks up the last
    final_adapter/                           the LoRA adapter (+ tokenizer) at the end

Config precedence: process environment > GRPO_DEMO defaults > ./.envrc > defaults below.
"""
import importlib.util
import json
import math
import os
import re
import sys
import time
from pathlib import Path

# ----------------------------------------------------------------------------- config
# (name, default, parser, meaning). Parsers validate and say what they accept; all of this runs
# before torch is imported so a typo fails in a second, not after a model download.
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # trl 1.16 GRPOConfig.loss_type
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                 "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay")


def Int(lo):
    def p(s):
        v = int(s)
        if v < lo:
            raise ValueError
        return v
    p.accepts = f"an integer >= {lo}"
    return p


def Float(lo, hi=math.inf, lo_open=False, hi_open=False):
    def p(s):
        v = float(s)
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
            raise ValueError
        return v
    p.accepts = f"a number in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open or hi == math.inf else ']'}"
    return p


def Choice(*options):
    def p(s):
        if s not in options:
            raise ValueError
        return s
    p.accepts = "one of " + ", ".join(options)
    return p


def Flag(s):
    if s not in ("0", "1"):
        raise ValueError
    return s == "1"
Flag.accepts = "0 or 1"


def Text(s):
    if not s.strip():
        raise ValueError
    return s.strip()
Text.accepts = "a non-empty string"


def Resume(s):
    if s in ("auto", "never"):
        return s
    if not Path(s).is_dir():
        raise ValueError
    return s
Resume.accepts = "auto, never, or an existing checkpoint directory"


def AdapterDir(s):
    if s and not (Path(s) / "adapter_config.json").is_file():
        raise ValueError
    return s
AdapterDir.accepts = "empty, or a directory holding adapter_config.json (e.g. sft_runs/final_adapter)"


def ModuleList(s):
    mods = [m.strip() for m in s.split(",") if m.strip()]
    if not mods or any(not re.fullmatch(r"[\w.]+", m) for m in mods):
        raise ValueError
    return ",".join(mods)
ModuleList.accepts = "comma-separated module names, e.g. q_proj,v_proj"


CONFIG = [
    ("BASE_MODEL_ID", "Qwen/Qwen2.5-Coder-1.5B-Instruct", Text, "hub id or local dir of the base (instruct) model"),
    ("TRAINING_DATASET", "kiranpg/ocaml-training-problems", Text, "hub id, local .jsonl/.json/.csv/.parquet, or 'bundled'"),
    ("GRPO_OUTPUT_DIR", "grpo_runs", Text, "where logs, checkpoints and the adapter go"),
    ("GRPO_BATCH_SIZE", "4", Int(1), "prompts per optimizer step per device (TRL batch = this x generations)"),
    ("GRPO_GRAD_ACCUM_STEPS", "1", Int(1), "gradient accumulation steps"),
    ("GRPO_NUM_GENERATIONS", "6", Int(2), "completions sampled per prompt (the GRPO group)"),
    ("GRPO_MAX_PROMPT", "1024", Int(16), "max prompt tokens; longer prompts are dropped (counted at start)"),
    ("GRPO_MAX_COMPLETION", "512", Int(8), "max completion tokens; hitting it without END is penalized"),
    ("GRPO_NUM_EPOCHS", "1.0", Float(0, lo_open=True), "epochs over the problem set"),
    ("GRPO_LEARNING_RATE", "5e-6", Float(0, 1, lo_open=True), "peak learning rate"),
    ("GRPO_TEMPERATURE", "0.9", Float(0, 5, lo_open=True), "sampling temperature (diversity within a group)"),
    ("GRPO_MAX_GRAD_NORM", "1.0", Float(0, lo_open=True), "gradient clipping norm"),
    ("GRPO_LOGGING_STEPS", "1", Int(1), "optimizer steps between learning.log lines"),
    ("LORA_R", "32", Int(1), "LoRA rank"),
    ("LORA_ALPHA", "64", Int(1), "LoRA alpha (scale = alpha / r)"),
    ("LORA_DROPOUT", "0.05", Float(0, 1, hi_open=True), "LoRA dropout"),
    ("LORA_BIAS", "none", Choice("none", "all", "lora_only"), "which biases LoRA trains"),
    ("LORA_TARGET_MODULES", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", ModuleList, "modules LoRA adapts"),
    ("RUNAWAY_PENALTY_MULTIPLIER", "0.3", Float(0, 1), "reward x this when a completion hits the max length without END"),
    ("MIN_NON_EMPTY_LINES", "8", Int(0), "fewer code lines than this -> reward 0"),
    ("GRPO_MAX_STEPS", "-1", Int(-1), "stop after this many optimizer steps (-1: run the epochs)"),
    ("GRPO_SAVE_STEPS", "50", Int(1), "optimizer steps between checkpoints"),
    ("GRPO_SAVE_TOTAL_LIMIT", "3", Int(1), "checkpoints kept"),
    ("GRPO_SEED", "42", Int(0), "random seed"),
    ("GRPO_BETA", "0.0", Float(0), "KL coefficient (0: no reference model, less memory)"),
    ("GRPO_LOSS_TYPE", "dapo", Choice(*LOSS_TYPES), "TRL loss aggregation"),
    ("GRPO_WARMUP_RATIO", "0.0", Float(0, 1, hi_open=True), "fraction of steps spent warming up the LR"),
    ("GRPO_LR_SCHEDULER", "linear", Choice(*LR_SCHEDULERS), "learning-rate schedule"),
    ("GRPO_TOP_ENTROPY_QUANTILE", "1.0", Float(0, 1, lo_open=True), "train only on the top-entropy tokens (1.0: all)"),
    ("GRPO_MASK_TRUNCATED", "0", Flag, "1: truncated completions get no loss"),
    ("GRPO_REPORT_TO", "tensorboard", Choice("tensorboard", "wandb", "none"), "metric sink besides learning.log"),
    ("REWARD_CURRICULUM", "0", Flag, "1: syntax-first reward weights that shift to tests by epoch 1.0"),
    ("GRPO_AUTO_STOP", "1", Flag, "1: at epoch >= 1.0 save and stop when the stop criteria hold; 0: only warn"),
    ("GRPO_RESUME", "auto", Resume, "auto: resume from the last checkpoint-* in the output dir; never; or a path"),
    ("GRPO_USE_VLLM", "0", Flag, "1: generate with vLLM through TRL (pip install vllm; CUDA only)"),
    ("GRPO_VLLM_MODE", "colocate", Choice("colocate", "server"),
     "colocate: vLLM shares the training GPUs; server: a separate `trl vllm-serve` process"),
    ("GRPO_VLLM_GPU_MEMORY", "0.3", Float(0, 1, lo_open=True), "colocate: share of GPU memory vLLM may take"),
    ("GRPO_VLLM_SERVER_URL", "http://localhost:8000", Text, "server mode: where `trl vllm-serve` listens"),
    ("GRPO_CONTINUOUS_BATCHING", "0", Flag, "1: transformers' paged continuous-batching generation (no vLLM needed)"),
    ("AUDIT_DATASET", "1", Flag, "1: drop problems whose tests cannot compile (cached); 0: only the prompt-length filter"),
    ("GRPO_DEMO", "0", Flag, "1: offline CPU demo (tiny model, bundled problems, ~20 steps)"),
    ("GRPO_INIT_ADAPTER", "", AdapterDir, "a LoRA adapter to continue (python train.py sft with SFT_LORA=1); "
                                          "its own LoRA settings replace LORA_*"),
]
DEMO_DEFAULTS = {  # GRPO_DEMO=1 replaces defaults and .envrc values, never the process environment
    "TRAINING_DATASET": "bundled", "GRPO_OUTPUT_DIR": "grpo_runs/demo", "GRPO_BATCH_SIZE": "2",
    "GRPO_NUM_GENERATIONS": "4", "GRPO_MAX_PROMPT": "4096", "GRPO_MAX_COMPLETION": "64", "GRPO_MAX_STEPS": "20",
    "GRPO_SAVE_STEPS": "10", "GRPO_LEARNING_RATE": "1e-4", "GRPO_TEMPERATURE": "1.0", "MIN_NON_EMPTY_LINES": "0",
    "GRPO_REPORT_TO": "none", "LORA_R": "8", "LORA_ALPHA": "16",
}
from ocaml_grpo.demo_model import DEMO_MODEL_DIR, ensure_demo_model  # noqa: E402  (no torch at import)
from ocaml_grpo import sft as sft_command  # noqa: E402  (no torch at import)

SFT_CONFIG = sft_command.entries(Int, Float, Flag, Text, Choice, LR_SCHEDULERS)

if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    print("Environment variables (default: meaning; accepted values):")
    for name, default, parse, meaning in CONFIG:
        print(f"  {name}={default}\n      {meaning}; {parse.accepts}")
    print(f"  GRPO_DEMO=1 sets: {' '.join(f'{k}={v}' for k, v in DEMO_DEFAULTS.items())} BASE_MODEL_ID={DEMO_MODEL_DIR}")
    print("  Read by the reward and the sandbox (see README): REWARD_WEIGHT_{STRUCTURAL,TYPE_CHECK,COMPILE,TESTS},\n"
          "  REWARD_WORKERS, REWARD_END_MARKER, OCAML_SANDBOX, OCAML_{CPU,WALL,COMPILE}_LIMIT_S, OCAML_MEMORY_MB,\n"
          "  OCAML_FILE_MB, OCAML_MAX_PROCS, OCAML_MAX_FILES, OCAML_OUTPUT_BYTES, OCAML_SANDBOX_TMPDIR, AUDIT_CACHE_DIR")
    print("python train.py sft also reads (python train.py sft --help): " + " ".join(e[0] for e in SFT_CONFIG))
    sys.exit(0)

if len(sys.argv) > 1 and sys.argv[1] == "sft":  # the SFT warm start: ocaml_grpo/sft.py
    sys.exit(sft_command.main(sys.argv[2:], CONFIG, SFT_CONFIG))

if len(sys.argv) > 1 and sys.argv[1] == "demo":  # SFT warm start + GRPO + before/after table: ocaml_grpo/demo.py
    from ocaml_grpo import demo as demo_command
    sys.exit(demo_command.main(sys.argv[2:]))

if len(sys.argv) > 1 and sys.argv[1] == "merge":
    # Fold a LoRA adapter into its base model so it loads without peft (e.g. for vLLM / llama.cpp export).
    if len(sys.argv) != 4:
        sys.exit("usage: python train.py merge ADAPTER_DIR OUT_DIR")
    import torch
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    adapter_dir, out_dir = sys.argv[2], sys.argv[3]
    base_id = PeftConfig.from_pretrained(adapter_dir).base_model_name_or_path
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_id, dtype=dtype), adapter_dir).merge_and_unload()
    merged.save_pretrained(out_dir)
    tok_src = adapter_dir if (Path(adapter_dir) / "tokenizer_config.json").exists() else base_id
    AutoTokenizer.from_pretrained(tok_src).save_pretrained(out_dir)
    print(f"merged {adapter_dir} into {base_id} -> {out_dir}")
    sys.exit(0)

if len(sys.argv) > 1:
    sys.exit(f"unknown argument {sys.argv[1]!r}; see python train.py --help")

# Resolve: remember what the user exported before .envrc fills gaps, so the demo can tell them apart.
from dotenv import load_dotenv  # noqa: E402

user_set = set(os.environ)
load_dotenv(".envrc", override=False)  # python-dotenv understands `export KEY=value` lines
demo = os.environ.get("GRPO_DEMO", "0") == "1"
if demo:
    for k, v in {**DEMO_DEFAULTS, "BASE_MODEL_ID": str(DEMO_MODEL_DIR)}.items():
        if k not in user_set:
            os.environ[k] = v
cfg, errors = {}, []
for name, default, parse, meaning in CONFIG:
    raw = os.environ.get(name, "").strip() or default
    try:
        cfg[name] = parse(raw)
    except ValueError:
        errors.append(f"{name}={raw!r} is invalid: expected {parse.accepts} ({meaning})")
# The reward reads its own knobs (weights, workers) from the environment: validate them now too.
os.environ.setdefault("MIN_NON_EMPTY_LINES", str(cfg.get("MIN_NON_EMPTY_LINES", 8)))
os.environ.setdefault("RUNAWAY_PENALTY_MULTIPLIER", str(cfg.get("RUNAWAY_PENALTY_MULTIPLIER", 0.3)))
import rewards  # noqa: E402  (no torch inside)
from analyze import THRESHOLDS as TH  # noqa: E402  (the health thresholds analyze.py reports against)
from ocaml_grpo.prompting import chat_messages, prompt_token_count  # noqa: E402
from ocaml_grpo.generation_engines import engine_kwargs  # noqa: E402
from ocaml_sandbox import ToolchainError  # noqa: E402
from ocaml_grpo.problems import DatasetError, load_problems  # noqa: E402

try:
    reward_config = rewards.RewardConfig.from_env()
except ValueError as e:
    errors.append(str(e))
# Optional engines: asked for but missing must stop here, with the way to get them.
if cfg.get("GRPO_USE_VLLM") and importlib.util.find_spec("vllm") is None:
    errors.append("GRPO_USE_VLLM=1 but vLLM is not installed: `pip install vllm` on a CUDA machine "
                  "(server mode also needs `trl vllm-serve --model $BASE_MODEL_ID` running), or set GRPO_USE_VLLM=0")
if cfg.get("GRPO_USE_VLLM") and cfg.get("GRPO_CONTINUOUS_BATCHING"):
    errors.append("GRPO_USE_VLLM=1 and GRPO_CONTINUOUS_BATCHING=1: choose one generation engine")
if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and importlib.util.find_spec("deepspeed") is None:
    errors.append("the accelerate config asks for DeepSpeed (configs/zero*.yaml) but it is not installed: "
                  "`pip install deepspeed`, or launch without --config_file configs/zero*.yaml")
if errors:
    sys.exit("config error:\n  " + "\n  ".join(errors) + "\nSee python train.py --help")
if cfg["GRPO_REPORT_TO"] != "none" and importlib.util.find_spec(cfg["GRPO_REPORT_TO"]) is None:
    print(f"note: GRPO_REPORT_TO={cfg['GRPO_REPORT_TO']} but that package is not installed; reporting to learning.log only")
    cfg["GRPO_REPORT_TO"] = "none"

# Only rank 0 writes learning.log, config and checkpoints; each rank logs the completions it
# scored. accelerate/torchrun set RANK for every process.
RANK = int(os.environ.get("RANK", "0"))
IS_MAIN = RANK == 0
out_dir = Path(cfg["GRPO_OUTPUT_DIR"])
resume_from = None
if cfg["GRPO_RESUME"] == "auto":
    # A checkpoint is complete once trainer_state.json is written (the trainer writes it last).
    done = [p for p in out_dir.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)
            and (p / "trainer_state.json").exists()]
    resume_from = str(max(done, key=lambda p: int(p.name.split("-")[1]))) if done else None
elif cfg["GRPO_RESUME"] != "never":
    resume_from = cfg["GRPO_RESUME"]
width = max(len(k) for k in cfg)
print("config:\n" + "\n".join(f"  {k.ljust(width)} = {v}" for k, v in cfg.items()))
print(f"  resume from: {resume_from or '(fresh run)'}")
if IS_MAIN:
    out_dir.mkdir(parents=True, exist_ok=True)
    old_logs = [p for p in (out_dir / "learning.log", out_dir / "reward_logs") if p.exists()]
    if resume_from is None and old_logs:
        # A fresh run must not append to another run's logs; keep them, out of the way.
        archive = out_dir / "previous_runs" / time.strftime("%Y%m%d-%H%M%S")
        archive.mkdir(parents=True)
        for p in old_logs:
            p.rename(archive / p.name)
        print(f"  earlier logs moved to {archive}")
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

# ----------------------------------------------------------------------------- toolchain and data
# Build the grader before any model loads: a missing ocamlc/bwrap should cost seconds, not a GPU hour.
class GuardedScorer(rewards.RewardScorer):
    """A grader bug on one odd completion costs that completion its reward, not the whole run.
    The failure is recorded in the breakdown log (first_error) and printed with its traceback once."""
    crashes = 0

    def score_one(self, problem, completion, *a, **kw):
        try:
            return super().score_one(problem, completion, *a, **kw)
        except Exception as e:  # noqa: BLE001 -- deliberate: see the docstring
            GuardedScorer.crashes += 1
            if GuardedScorer.crashes == 1:
                import traceback
                traceback.print_exc()
            print(f"warning: reward crashed on a completion for {problem.id} ({type(e).__name__}: {e}); reward 0 "
                  f"[{GuardedScorer.crashes} so far]", file=sys.stderr)
            return rewards.Breakdown(problem_id=problem.id, first_error=f"reward crashed: {type(e).__name__}: {e}")


try:
    scorer = GuardedScorer(reward_config)
except ToolchainError as e:
    sys.exit(f"OCaml toolchain check failed, not training: {e}")
print(f"reward grader: {scorer.grader.sandbox.describe()}")
try:
    problems = load_problems(cfg["TRAINING_DATASET"])
except DatasetError as e:
    sys.exit(f"dataset error: {e}")
print(f"dataset: {len(problems)} problems from {cfg['TRAINING_DATASET']}")

import warnings  # noqa: E402

import torch  # noqa: E402
# TRL 1.16 calls a transformers API deprecated in 5.x once per step; the warning says nothing actionable.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
from peft import LoraConfig  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

if demo and cfg["BASE_MODEL_ID"] == str(DEMO_MODEL_DIR):
    ensure_demo_model(DEMO_MODEL_DIR)
tokenizer = AutoTokenizer.from_pretrained(cfg["BASE_MODEL_ID"])
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token

# ----------------------------------------------------------------------------- prompts (text: prompting.py)
def prompt_tokens(problem) -> int:
    return prompt_token_count(tokenizer, problem.prompt)


# TRL 1.16 has no max_prompt_length: prompts longer than GRPO_MAX_PROMPT are dropped here. The audit
# also drops problems no answer could pass (tests that do not compile against a stub, missing
# packages, duplicates) and records why in <output dir>/dataset_audit.jsonl.
if cfg["AUDIT_DATASET"]:
    from ocaml_grpo import dataset_audit
    audit = dataset_audit.audit_problems(problems, out_dir if IS_MAIN else None, prompt_tokens=prompt_tokens,
                                         max_prompt_tokens=cfg["GRPO_MAX_PROMPT"], grader=scorer.grader)
    kept = audit.kept
    too_long = sum(r.reason == "prompt_too_long" for r in audit.records)
else:
    print("AUDIT_DATASET=0: dataset audit skipped; only the prompt length filter applies")
    kept = [p for p in problems if prompt_tokens(p) <= cfg["GRPO_MAX_PROMPT"]]
    too_long = len(problems) - len(kept)
print(f"prompts: dropped {too_long} longer than GRPO_MAX_PROMPT={cfg['GRPO_MAX_PROMPT']} tokens")
if len(kept) < cfg["GRPO_BATCH_SIZE"]:
    sys.exit(f"dataset error: only {len(kept)} usable problems, fewer than GRPO_BATCH_SIZE={cfg['GRPO_BATCH_SIZE']}")
from datasets import Dataset  # noqa: E402

# `prompt` (chat messages) is what TRL generates from; the other columns go to the reward as kwargs.
train_dataset = Dataset.from_list([{"prompt": chat_messages(p.prompt), **p.to_row()}
                                   for p in kept])

# ----------------------------------------------------------------------------- model
on_gpu = torch.cuda.is_available()
model = AutoModelForCausalLM.from_pretrained(cfg["BASE_MODEL_ID"], dtype=torch.bfloat16 if on_gpu else torch.float32)
peft_config = LoraConfig(r=cfg["LORA_R"], lora_alpha=cfg["LORA_ALPHA"], lora_dropout=cfg["LORA_DROPOUT"],
                         bias=cfg["LORA_BIAS"], target_modules=cfg["LORA_TARGET_MODULES"].split(","),
                         task_type="CAUSAL_LM")
if cfg["GRPO_INIT_ADAPTER"]:  # continue the SFT adapter instead of starting a fresh one
    from peft import PeftModel
    adapter_base = json.loads((Path(cfg["GRPO_INIT_ADAPTER"]) / "adapter_config.json").read_text()).get(
        "base_model_name_or_path")
    if adapter_base and adapter_base != cfg["BASE_MODEL_ID"]:
        print(f"warning: GRPO_INIT_ADAPTER was trained on {adapter_base}, BASE_MODEL_ID is {cfg['BASE_MODEL_ID']}")
    model = PeftModel.from_pretrained(model, cfg["GRPO_INIT_ADAPTER"], is_trainable=True)
    peft_config = None
    print(f"starting from the adapter {cfg['GRPO_INIT_ADAPTER']} (its LoRA settings apply, not LORA_*)")
reward_fn = rewards.make_syntax_aware_reward(out_dir, max_completion_tokens=cfg["GRPO_MAX_COMPLETION"],
                                             curriculum=cfg["REWARD_CURRICULUM"], scorer=scorer,
                                             rank=RANK)
if os.environ.get("GRPO_TEST_NEGATE_REWARD") == "1":
    # Tests only (tests/test_learning.py): TRL optimises -reward, i.e. every advantage's sign is flipped, while
    # the reward logs keep the real reward. A trainer that learns must then get worse.
    graded = reward_fn

    async def syntax_aware_reward(*a, **kw):
        return [-r for r in await graded(*a, **kw)]
    reward_fn = syntax_aware_reward
G = cfg["GRPO_NUM_GENERATIONS"]
args = GRPOConfig(
    output_dir=str(out_dir),
    # TRL counts completions per device; the generation batch (this x grad accum) is then a whole
    # number of groups of G, which TRL requires.
    per_device_train_batch_size=cfg["GRPO_BATCH_SIZE"] * G,
    gradient_accumulation_steps=cfg["GRPO_GRAD_ACCUM_STEPS"],
    num_generations=G,
    max_completion_length=cfg["GRPO_MAX_COMPLETION"],
    num_train_epochs=cfg["GRPO_NUM_EPOCHS"],
    max_steps=cfg["GRPO_MAX_STEPS"],
    learning_rate=cfg["GRPO_LEARNING_RATE"],
    lr_scheduler_type=cfg["GRPO_LR_SCHEDULER"],
    warmup_steps=cfg["GRPO_WARMUP_RATIO"],  # transformers 5: a float < 1 is a ratio of total steps
    temperature=cfg["GRPO_TEMPERATURE"],
    max_grad_norm=cfg["GRPO_MAX_GRAD_NORM"],
    beta=cfg["GRPO_BETA"],
    loss_type=cfg["GRPO_LOSS_TYPE"],
    importance_sampling_level="sequence" if cfg["GRPO_LOSS_TYPE"] == "luspo" else "token",  # luspo is sequence-level
    top_entropy_quantile=cfg["GRPO_TOP_ENTROPY_QUANTILE"],
    mask_truncated_completions=cfg["GRPO_MASK_TRUNCATED"],
    logging_steps=cfg["GRPO_LOGGING_STEPS"],
    save_strategy="steps",
    save_steps=cfg["GRPO_SAVE_STEPS"],
    save_total_limit=cfg["GRPO_SAVE_TOTAL_LIMIT"],
    seed=cfg["GRPO_SEED"],
    report_to=[] if cfg["GRPO_REPORT_TO"] == "none" else [cfg["GRPO_REPORT_TO"]],
    bf16=on_gpu,
    use_cpu=not on_gpu,
    activation_checkpointing=on_gpu,  # trades compute for memory; pointless for CPU-sized models
    remove_unused_columns=False,  # the reward needs id/problem/tests/requires/entry_point
    log_completions=False,  # completions go to reward_logs/completions.jsonl instead
    **engine_kwargs("vllm" if cfg["GRPO_USE_VLLM"] else "paged" if cfg["GRPO_CONTINUOUS_BATCHING"] else "default",
                    sequences=cfg["GRPO_BATCH_SIZE"] * G * cfg["GRPO_GRAD_ACCUM_STEPS"],
                    max_prompt=cfg["GRPO_MAX_PROMPT"], max_completion=cfg["GRPO_MAX_COMPLETION"],
                    vllm_mode=cfg["GRPO_VLLM_MODE"], vllm_gpu_memory=cfg["GRPO_VLLM_GPU_MEMORY"],
                    vllm_server_url=cfg["GRPO_VLLM_SERVER_URL"]),
)


# ----------------------------------------------------------------------------- learning.log + health
def fmt(v, spec):
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


class LearningLog(TrainerCallback):
    """Writes learning.log (the seed analysis's line format) and applies the seed's health rules.
    Every process evaluates the rules on the same gathered metrics; only rank 0 writes."""
    REPEAT_EVERY = 10  # a persisting warning is repeated every this many log steps, not every step
    WINDOW = 20  # log steps averaged for level / stop decisions

    def __init__(self, path: Path, header: list[str], resumed: bool, breakdown_path: Path, auto_stop: bool,
                 curriculum: bool):
        self.path, self.header, self.resumed = path, header, resumed
        self.curriculum, self.phase = curriculum, None
        self.breakdown_path, self.auto_stop = breakdown_path, auto_stop
        self.fd = None
        self.history = []  # (epoch, reward, frac_zero_std)
        self.last_warned = {}
        self.n_logs = 0
        self.test_passes, self._offset = 0, 0
        self.crashes_seen = 0

    def write(self, line: str):
        if self.fd is not None:
            os.write(self.fd, (line + "\n").encode())  # one write per whole line: a kill never tears one

    def on_train_begin(self, args, state, control, **kw):
        if state.is_world_process_zero:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if self.resumed else os.O_TRUNC)
            self.fd = os.open(self.path, flags, 0o644)
            for h in self.header:
                self.write("# " + h)
        for old in state.log_history:  # resumed: the trend covers the whole run, not just this session
            if "reward" in old:
                self.history.append((old.get("epoch", 0.0), old["reward"], old.get("frac_reward_zero_std", 0.0)))

    def warn(self, key: str, message: str):
        if self.n_logs - self.last_warned.get(key, -10**9) >= self.REPEAT_EVERY:
            self.last_warned[key] = self.n_logs
            self.write(f"[Health] {message}")

    def count_test_passes(self):
        """Completions that passed at least one test, read incrementally from the breakdown log."""
        try:
            with open(self.breakdown_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self.test_passes
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self._offset += len(whole)
        for line in whole.splitlines():
            try:
                self.test_passes += json.loads(line).get("tests_passed", 0) > 0
            except (ValueError, AttributeError):
                pass
        return self.test_passes

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        if "loss" not in logs or "reward" not in logs:
            return control  # the end-of-training summary, or an eval log
        epoch = logs.get("epoch", state.epoch or 0.0)
        r, r_std = logs.get("reward"), logs.get("reward_std")
        fzs, ent = logs.get("frac_reward_zero_std"), logs.get("entropy")
        self.write(f"[Epoch {epoch:.2f}]  loss={fmt(logs.get('loss'), '.4f')}  grad={fmt(logs.get('grad_norm'), '.4f')}  "
                   f"lr={fmt(logs.get('learning_rate'), '.2e')}  reward={fmt(r, '.3f')}±{fmt(r_std, '.3f')}  "
                   f"syntax_rew={fmt(logs.get('rewards/syntax_aware_reward/mean'), '.3f')}"
                   f"±{fmt(logs.get('rewards/syntax_aware_reward/std'), '.3f')}  "
                   f"entropy={fmt(ent, '.3f')}  frac_zero_std={fmt(fzs, '.2f')}")
        self.n_logs += 1
        self.history.append((epoch, r or 0.0, fzs or 0.0))
        if self.curriculum:
            phase, w = rewards.curriculum_phase(epoch)
            if phase != self.phase:
                self.phase = phase
                self.write(f"[Curriculum] phase {phase} from epoch {epoch:.2f}: structural {w.structural:.2f}  "
                           f"type {w.type_check:.2f}  compile {w.compile:.2f}  tests {w.tests:.2f}")
        recent = self.history[-self.WINDOW:]
        mean_r = sum(h[1] for h in recent) / len(recent)
        mean_fzs = sum(h[2] for h in recent) / len(recent)

        if GuardedScorer.crashes > self.crashes_seen:
            self.write(f"[Health] the reward crashed on {GuardedScorer.crashes - self.crashes_seen} completion(s) "
                       "since the last log (scored 0; see first_error in the breakdown log and stderr)")
            self.crashes_seen = GuardedScorer.crashes
        # Health rules from the seed analysis; thresholds shared with analyze.py (analyze.THRESHOLDS).
        if fzs is not None and fzs >= TH.zero_std_critical:
            self.warn("fzs", f"CRITICAL frac_zero_std={fzs:.2f} >= {TH.zero_std_critical:.2f}: groups with identical "
                             "rewards give no signal (mode collapse); raise GRPO_TEMPERATURE / GRPO_NUM_GENERATIONS")
        elif fzs is not None and fzs >= TH.zero_std_healthy:
            self.warn("fzs", f"warning frac_zero_std={fzs:.2f} >= {TH.zero_std_healthy:.2f} "
                             f"(healthy < {TH.zero_std_healthy:.2f})")
        if ent is not None and not TH.entropy_low <= ent <= TH.entropy_high:
            self.warn("entropy", f"entropy={ent:.3f} outside {TH.entropy_low:.2f}-{TH.entropy_high:.2f} "
                                 f"({'too confident' if ent < TH.entropy_low else 'too random'})")
        if r and r_std is not None and r > 0 and r_std / r > TH.cv_max:
            self.warn("cv", f"reward coefficient of variation {r_std / r:.2f} > {TH.cv_max:.2f}: unstable signal")
        expected = 0.35 if epoch >= 1.0 else 0.30 if epoch >= 0.5 else None
        if expected is not None and mean_r < expected:
            self.warn("level", f"mean reward {mean_r:.3f} over the last {len(recent)} logs is below {expected:.2f} "
                               f"expected by epoch {1.0 if epoch >= 1.0 else 0.5}")

        # Stop criteria at epoch >= 1.0. A flat trend alone is not a red flag for a run already
        # above the epoch-1 level (a plateau at 0.7 is fine), so it counts only below 0.35.
        if epoch >= TH.stop_epoch and not control.should_training_stop:
            reasons = []
            if mean_r < TH.stop_reward:
                reasons.append(f"mean reward {mean_r:.3f} < {TH.stop_reward:.2f}")
            if mean_fzs > TH.stop_zero_std:
                reasons.append(f"mean frac_zero_std {mean_fzs:.2f} > {TH.stop_zero_std:.2f}")
            if self.count_test_passes() == 0 and self.fd is not None:
                reasons.append("no test passes in the breakdown log")
            rs = [h[1] for h in self.history[-50:]]
            if len(rs) >= 4:
                half = len(rs) // 2
                trend = sum(rs[half:]) / (len(rs) - half) - sum(rs[:half]) / half
                if trend <= 0.01 and mean_r < 0.35:
                    reasons.append(f"reward trend flat/falling ({trend:+.3f}) below 0.35")
            reasons = self.agree(reasons)
            if reasons and self.auto_stop:
                self.write(f"[Stop] {'; '.join(reasons)} at epoch {epoch:.2f}; checkpoint saved, training stopped "
                           "(GRPO_AUTO_STOP=0 to only warn)")
                control.should_save = True
                control.should_training_stop = True
            elif reasons:
                self.warn("stop", f"stop criteria met ({'; '.join(reasons)}) but GRPO_AUTO_STOP=0: continuing")
        return control

    @staticmethod
    def agree(reasons):
        """The test-pass count comes from a file only rank 0 writes: rank 0's verdict wins everywhere."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            box = [reasons]
            torch.distributed.broadcast_object_list(box, src=0)
            return box[0]
        return reasons

    def on_train_end(self, args, state, control, **kw):
        self.write(f"# finished at step {state.global_step}, epoch {state.epoch or 0:.2f}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


header = [f"{'resumed from ' + resume_from if resume_from else 'started'} {time.strftime('%Y-%m-%d %H:%M:%S')}",
          f"model: {cfg['BASE_MODEL_ID']}", f"dataset: {cfg['TRAINING_DATASET']} ({len(kept)} problems)",
          f"reward grader: {scorer.grader.sandbox.describe()}",
          "config: " + "  ".join(f"{k}={cfg[k]}" for k in (
              "GRPO_BATCH_SIZE", "GRPO_GRAD_ACCUM_STEPS", "GRPO_NUM_GENERATIONS", "GRPO_MAX_PROMPT",
              "GRPO_MAX_COMPLETION", "GRPO_NUM_EPOCHS", "GRPO_LEARNING_RATE", "GRPO_TEMPERATURE", "GRPO_BETA",
              "GRPO_LOSS_TYPE", "LORA_R", "LORA_ALPHA", "REWARD_CURRICULUM", "MIN_NON_EMPTY_LINES",
              "RUNAWAY_PENALTY_MULTIPLIER"))]
callback = LearningLog(out_dir / "learning.log", header, resumed=resume_from is not None,
                       breakdown_path=out_dir / "reward_logs" / "syntax_aware_breakdown.jsonl",
                       auto_stop=cfg["GRPO_AUTO_STOP"], curriculum=cfg["REWARD_CURRICULUM"])

# ----------------------------------------------------------------------------- train
trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=train_dataset,
                      processing_class=tokenizer, peft_config=peft_config, callbacks=[callback])
if IS_MAIN:
    trainer.model.print_trainable_parameters()
t0 = time.time()
try:
    trainer.train(resume_from_checkpoint=resume_from)
finally:
    scorer.close()
final_dir = out_dir / "final_adapter"
trainer.save_model(str(final_dir))  # PEFT model: saves the adapter only
if IS_MAIN:
    tokenizer.save_pretrained(str(final_dir))
    print(f"done in {time.time() - t0:.0f}s: adapter in {final_dir}; logs in {out_dir / 'learning.log'}")
    print(f"merge with: python train.py merge {final_dir} {out_dir / 'merged'}")
