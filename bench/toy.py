"""bench_selection's and bench_dynamic's toy: the demo's learner after a two-stage SFT leaves the
8 bundled problems below mastered (MASTERED), partly learned (PARTIAL) or never seen (NEVER_SEEN);
GRPO then runs with the demo's recipe (RECIPE), BATCH problems a step."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ocaml_grpo.problems import BUNDLED, read_rows
from ocaml_grpo.commands import demo

MASTERED = ("p002_last_element", "p014_list_max")
PARTIAL = ("p001_count_evens", "p003_first_nonempty")  # the demo's: GRPO is known to teach them
NEVER_SEEN = ("p021_sum_abs", "p072_bst_inorder", "p008_digit_sum", "p010_factorial")
RECIPE = replace(demo.RECIPE, train_ids=MASTERED + PARTIAL + NEVER_SEEN, heldout_ids=(), eval_samples=48, heldout_samples=48)
BATCH = 2  # prompts per step: GRPO sees 2 of the 8 problems per step, as it sees a few of thousands


def write_problems(path: Path, ids: tuple) -> Path:
    rows = {r["id"]: r for r in read_rows(BUNDLED)}
    path.write_text("".join(json.dumps(rows[i]) + "\n" for i in ids))
    return path


def sft_start(recipe: "demo.Recipe", model: Path, out: Path, echo) -> Path:
    """The SFT start (`python train.py sft`, full fine-tune): stage 1 memorises MASTERED, stage 2
    adds PARTIAL and stops half-way; returns stage 2's output folder (its final_model)."""
    sft1, sft2 = out / "sft1", out / "sft2"
    stage1 = {**demo.sft_env(recipe, model, write_problems(out / "mastered.jsonl", MASTERED), sft1),
              "SFT_HOLDOUT": "0", "SFT_STOP_LOSS": "0.05", "SFT_BATCH_SIZE": str(len(MASTERED))}
    demo.run_stage("SFT stage 1 (mastered)", [str(demo.TRAIN), "sft"], stage1, out, out / "sft1.out", echo)
    stage2 = {**demo.sft_env(recipe, sft1 / "final_model", write_problems(out / "taught.jsonl", MASTERED + PARTIAL), sft2),
              "SFT_HOLDOUT": "0", "SFT_STOP_LOSS": "0.15", "SFT_BATCH_SIZE": str(len(MASTERED + PARTIAL))}
    demo.run_stage("SFT stage 2 (partly learned)", [str(demo.TRAIN), "sft"], stage2, out, out / "sft2.out", echo)
    return sft2
