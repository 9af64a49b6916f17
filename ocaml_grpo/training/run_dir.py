"""A GRPO run's output directory (GRPO_OUTPUT_DIR): judged before anything is written to it,
prepared only once every check has passed, marked when the run has finished.

- `write_error`: a directory the run could not write is a config error, found before any model loads.
- `last_checkpoint`: the checkpoint GRPO_RESUME=auto resumes from.
- `resume_error`: a checkpoint of another model (base, LoRA shape, tokenizer) is refused before
  anything is written: loading it would fail after the folder was already changed.
- `finished`: a run that reached its end (GRPO_MAX_STEPS, its epochs, or the stop criteria) is
  not trained again by the same command; finished.json records where and why it ended.
- `write_readme`: the folder's README.md says what the run is and where its files are (in place
  of TRL's model card, written for a hub upload: "a fine-tuned version of [None]").
- `prepare`: a fresh run moves the previous run's files (logs, config.json, reports) into
  previous_runs/<time>/, together, then writes its own config.json.

Nothing here imports torch.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from ocaml_grpo.training.metrics import METRICS_FILE

FINISHED = "finished.json"
# What the length of a run depends on: re-running with other values continues a finished run.
LENGTH_SETTINGS = ("GRPO_MAX_STEPS", "GRPO_NUM_EPOCHS")
# A previous run's own files, archived together when a fresh run starts in the same directory.
RUN_FILES = ("learning.log", METRICS_FILE, "reward_logs", "config.json", FINISHED, "dataset_audit.jsonl", "analysis.md", "plots")


def write_error(out_dir: Path) -> str | None:
    """Why the run could not write `out_dir` (None: it can), without creating anything."""
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"GRPO_OUTPUT_DIR={out_dir}: {existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"GRPO_OUTPUT_DIR={out_dir}: {existing} is not writable by this user; choose another directory"
    return None


def last_checkpoint(out_dir: Path) -> Path | None:
    # A checkpoint is complete once trainer_state.json is written (the trainer writes it last).
    done = [p for p in out_dir.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)
            and (p / "trainer_state.json").exists()]
    return max(done, key=checkpoint_step) if done else None


def resume_error(checkpoint: Path, model_id: str, model_dir: str, lora: dict[str, Any]) -> str | None:
    """Why `checkpoint` cannot continue a run of `model_id` (loaded from `model_dir`) with this
    LoRA shape (None: it can). Read from the checkpoint's adapter_config.json and tokenizer.json and
    the model folder's tokenizer.json; nothing is loaded. `lora`: r, lora_alpha, target_modules, bias
    as peft writes them (the LORA_* settings', or GRPO_INIT_ADAPTER's own)."""
    way_out = ("keep that run and train this one elsewhere (another GRPO_OUTPUT_DIR), or start over in this "
               f"folder with GRPO_RESUME=never (its logs move to previous_runs/, its checkpoints are replaced)")
    try:
        saved = json.loads((checkpoint / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        return f"cannot resume from {checkpoint}: no readable adapter_config.json there ({e}); {way_out}"
    base = saved.get("base_model_name_or_path") or "(unrecorded)"
    if not same_model(base, model_dir) and not same_model(base, model_id):
        return (f"cannot resume from {checkpoint}: it was trained on the model {base}, and this run's BASE_MODEL_ID is "
                f"{model_id}" + (f" ({model_dir})" if model_dir != model_id else "") + f"; {way_out}")
    diff = [f"{k}={saved.get(k)!r} there, {v!r} here" for k, v in lora.items()
            if (sorted(saved.get(k) or []) if k == "target_modules" else saved.get(k)) != v]
    if diff:
        return f"cannot resume from {checkpoint}: its LoRA adapter differs from this run's ({'; '.join(diff)}); {way_out}"
    here, there = vocabulary(Path(model_dir)), vocabulary(checkpoint)
    if here is not None and there is not None and here != there:
        return (f"cannot resume from {checkpoint}: its tokenizer is not the one of {model_id} ({there[0]} tokens there, "
                f"{here[0]} here, or the same number with other tokens); {way_out}")
    return None


def same_model(a: str, b: str) -> bool:
    """Two model ids name the same model: the same string, or paths to the same folder."""
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def vocabulary(folder: Path) -> tuple[int, str] | None:
    """(size, hash) of the vocabulary in `folder`'s tokenizer.json, added tokens included; None
    without one (a hub id, or a model saved with a slow tokenizer only)."""
    try:
        tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    vocab = (tok.get("model") or {}).get("vocab") or {}
    added = sorted((t.get("id"), t.get("content")) for t in tok.get("added_tokens") or [])
    pairs = sorted(vocab.items()) if isinstance(vocab, dict) else list(map(tuple, vocab))
    return len(vocab) + len(added), hashlib.sha256(json.dumps([pairs, added]).encode()).hexdigest()


def checkpoint_step(checkpoint: Path) -> int:
    return int(checkpoint.name.split("-")[1])


def finished(out_dir: Path, checkpoint: Path | None, cfg: dict[str, Any]) -> str | None:
    """What to tell the user when resuming from `checkpoint` would train a finished run again
    (None: there is training left to do)."""
    try:
        done = json.loads((out_dir / FINISHED).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if checkpoint is None or checkpoint_step(checkpoint) != done.get("step"):
        return None  # trained further since, or its checkpoints are gone: not the finished state
    if any(done.get(k) != cfg[k] for k in LENGTH_SETTINGS):
        return None  # a longer (or shorter) run was asked for
    return (f"the run in {out_dir} finished at step {done['step']} (epoch {done.get('epoch', 0):.2f}: "
            f"{done.get('why', '')}); its adapter is in {out_dir / 'final_adapter'}. Nothing to train. "
            "To train longer, raise GRPO_MAX_STEPS or GRPO_NUM_EPOCHS; to start over, GRPO_RESUME=never.")


def mark_finished(out_dir: Path, step: int, epoch: float, why: str, cfg: dict[str, Any]) -> None:
    record = {"step": step, "epoch": round(epoch, 4), "why": why, **{k: cfg[k] for k in LENGTH_SETTINGS},
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out_dir / FINISHED).write_text(json.dumps(record, indent=2) + "\n")


def write_whole(path: Path, text: str) -> None:
    """Write the file whole or not at all: a crash mid-write leaves the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def prepare(out_dir: Path, cfg: dict[str, Any], resumed: bool) -> Path | None:
    """Create the directory and write config.json. A fresh run first moves the previous run's
    files into previous_runs/<time>/ (returned), so it never appends to another run's logs and
    the old run keeps its config beside its logs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = None
    old = [out_dir / name for name in RUN_FILES if (out_dir / name).exists()]
    if not resumed and any(p.name in ("learning.log", METRICS_FILE, "reward_logs") for p in old):
        archive = out_dir / "previous_runs" / time.strftime("%Y%m%d-%H%M%S")
        archive.mkdir(parents=True)
        for p in old:
            p.rename(archive / p.name)
    elif resumed and (out_dir / FINISHED).exists():
        (out_dir / FINISHED).unlink()  # it trains on: finished again only when it ends again
    write_whole(out_dir / "config.json", json.dumps(cfg, indent=2) + "\n")
    return archive


def write_readme(out_dir: Path) -> None:
    """README.md for the run folder, from its config.json."""
    try:
        cfg = json.loads((out_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        cfg = {}
    text = (f"# GRPO run: {cfg.get('BASE_MODEL_ID', 'a model')} + LoRA on {cfg.get('TRAINING_DATASET', 'OCaml problems')}\n\n"
            "Written by ocaml-grpo's `python train.py`. Every setting is in `config.json`; the run step by step in "
            "`learning.log` and `metrics.jsonl`; every completion and its reward in `reward_logs/`.\n\n"
            f"- health report: `python analyze.py {out_dir}`\n"
            f"- the adapter: `final_adapter/` at the end, `checkpoint-N/` on the way; "
            f"`python train.py merge {out_dir}/final_adapter merged` folds it into the base model\n"
            f"- re-score the completions as training did: `python rewards.py score PROBLEMS {out_dir}/reward_logs/completions.jsonl`\n")
    write_whole(out_dir / "README.md", text)


def write_adapter_readme(folder: Path, made_by: str) -> None:
    """README.md for an adapter folder (a checkpoint, final_adapter), in place of peft's empty hub
    card ("Model Card for Model ID", every field "More Information Needed")."""
    try:
        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path") or "a model"
    except (OSError, json.JSONDecodeError):
        return  # not an adapter: nothing of peft's to replace
    text = (f"# A LoRA adapter of {base}\n\n{made_by}\n\n"
            f"- continue training from it: `GRPO_INIT_ADAPTER={folder} python train.py`\n"
            f"- evaluate it: `python evaluate.py --model {base} --adapter {folder}`\n"
            f"- fold it into the base model: `python train.py merge {folder} merged`\n")
    write_whole(folder / "README.md", text)
