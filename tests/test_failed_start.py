"""A failed start changes nothing in the output folder, and a run folder belongs to one model.

One real 2-step plumbing run fills a folder (checkpoints, finished.json, config.json, logs); then
every failure train.py can meet before training (a bad setting, a missing dataset or model, a
checkpoint of another model or LoRA shape, a run that cannot fit in memory, a missing toolchain)
is started against a copy of it, and the copy's files are compared byte for byte with the
original's.
"""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import preloaded
from conftest import TRAIN, run_env, train
from ocaml_grpo.models.tiny import ensure_learner_model, learner_model_dir


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`: its content's hash ("dir" for a folder)."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def populated(tmp_path_factory, cache_home) -> Path:
    """A finished 2-step plumbing run with two checkpoints."""
    tmp = tmp_path_factory.mktemp("populated")
    train(tmp, run_env(tmp, cache_home, GRPO_MAX_STEPS=2, GRPO_SAVE_STEPS=1))
    run = tmp / "run"
    assert (run / "finished.json").is_file() and (run / "checkpoint-2" / "adapter_config.json").is_file()
    return run


def start(tmp_path: Path, populated: Path, cache_home: Path, preload: bool = False, **env) -> tuple[subprocess.CompletedProcess, Path]:
    """train.py against a copy of the populated folder, asking for a longer run (so that, without
    the failure, it would resume and train on)."""
    run = tmp_path / "run"
    shutil.copytree(populated, run)
    environ = run_env(tmp_path, cache_home, GRPO_MAX_STEPS=4, **env)
    if preload:
        res = preloaded.run(TRAIN, cwd=tmp_path, env=environ, timeout=240)
    else:
        res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, env=environ, capture_output=True, text=True,
                             timeout=240)
    return res, run


FAILURES = {
    "config": ({"GRPO_TEMPERATURE": "abc"}, "GRPO_TEMPERATURE"),
    "dataset": ({"TRAINING_DATASET": "/no/such/problems.jsonl"}, "/no/such/problems.jsonl"),
    "model": ({"BASE_MODEL_ID": "/no/such/model"}, "BASE_MODEL_ID=/no/such/model"),
    "lora_shape": ({"LORA_R": "4"}, "r=8 there, 4 here"),
    "toolchain": ({"PATH": "/nonexistent"}, "ocamlc"),
    # far past any machine's memory: refused before the model loads
    "memory": ({"GRPO_BATCH_SIZE": "16", "GRPO_NUM_GENERATIONS": "1024", "GRPO_MAX_COMPLETION": "100000"}, "memory error"),
}


@pytest.mark.parametrize("kind", FAILURES)
def test_a_failed_start_changes_no_byte_of_the_run_folder(tmp_path, populated, cache_home, kind):
    env, says = FAILURES[kind]
    before = snapshot(populated)
    res, run = start(tmp_path, populated, cache_home, preload=kind == "memory", **env)
    assert res.returncode != 0, res.stdout[-2000:]
    assert says in res.stderr, res.stderr[-3000:]
    assert snapshot(run) == before


def test_resume_with_another_model_is_refused_naming_both(tmp_path, populated, cache_home):
    """The issue's case: the plumbing run's folder, then the same command with another model."""
    other = ensure_learner_model(learner_model_dir(cache_home))
    before = snapshot(populated)
    res, run = start(tmp_path, populated, cache_home, BASE_MODEL_ID=str(other))
    assert res.returncode != 0
    first = json.loads((populated / "checkpoint-2" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert "resume error" in res.stderr and first in res.stderr and str(other) in res.stderr, res.stderr
    assert "GRPO_OUTPUT_DIR" in res.stderr and "GRPO_RESUME=never" in res.stderr
    assert "size mismatch" not in res.stderr  # refused before anything loads
    assert snapshot(run) == before


def test_resume_with_another_tokenizer_is_refused(tmp_path, populated, cache_home):
    """Same base path and LoRA shape, but the tokenizer saved in the checkpoint is another one."""
    model = tmp_path / "model"
    shutil.copytree(Path(json.loads((populated / "config.json").read_text())["BASE_MODEL_ID"]), model)
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["model"]["vocab"] = {("x" + k if v == 100 else k): v for k, v in tok["model"]["vocab"].items()}
    (model / "tokenizer.json").write_text(json.dumps(tok))
    copy = tmp_path / "populated"
    shutil.copytree(populated, copy)
    for cfg in copy.glob("checkpoint-*/adapter_config.json"):  # the checkpoints now name the edited model
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "base_model_name_or_path": str(model)}))
    before = snapshot(copy)
    res, run = start(tmp_path, copy, cache_home, BASE_MODEL_ID=str(model))
    assert res.returncode != 0 and "its tokenizer is not the one of" in res.stderr, res.stderr[-3000:]
    assert snapshot(run) == before


def test_the_run_folders_readme_says_what_the_run_is(populated):
    """Not TRL's hub model card ("a fine-tuned version of [None]")."""
    text = (populated / "README.md").read_text()
    base = json.loads((populated / "config.json").read_text())["BASE_MODEL_ID"]
    assert "[None]" not in text and "huggingface.co/None" not in text
    assert base in text and f"python analyze.py {populated}" in text
    # and each adapter folder's is ours, not peft's empty card
    folders = sorted(populated.glob("checkpoint-*")) + [populated / "final_adapter"]
    assert len(folders) >= 2
    for folder in folders:
        card = (folder / "README.md").read_text()
        assert "Model Card for Model ID" not in card and "More Information Needed" not in card, folder
        assert f"--adapter {folder}" in card and f"merge {folder}" in card
