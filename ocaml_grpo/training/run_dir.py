"""A GRPO run's output directory (GRPO_OUTPUT_DIR): judged before anything is written to it,
prepared only once every check has passed, marked when the run has finished.

- `write_error`: a directory the run could not write is a config error, found before any model loads.
- `last_checkpoint`: the checkpoint GRPO_RESUME=auto resumes from.
- `finished`: a run that reached its end (GRPO_MAX_STEPS, its epochs, or the stop criteria) is
  not trained again by the same command; finished.json records where and why it ended.
- `prepare`: a fresh run moves the previous run's files (logs, config.json, reports) into
  previous_runs/<time>/, together, then writes its own config.json.

Nothing here imports torch.
"""
from __future__ import annotations

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
    tmp = out_dir / "config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2) + "\n")
    os.replace(tmp, out_dir / "config.json")
    return archive
