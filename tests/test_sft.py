"""`python train.py sft`: the SFT warm start (ocaml_grpo/commands/sft.py), and GRPO starting from its output.
Real TRL, the tiny plumbing model (demo_model.py), offline."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import preloaded
from ocaml_grpo.problems import Problem
from ocaml_grpo.config.settings import Holdout
from ocaml_grpo.commands.sft import split_problems

from conftest import TRAIN, log_lines, read_jsonl, run_env, small_dataset


def sft_env(tmp: Path, cache_home: Path, **overrides) -> dict:
    env = run_env(tmp, cache_home)
    env.update(BASE_MODEL_ID=str(cache_home / "ocaml-grpo" / "plumbing-qwen2-tiny"),
               TRAINING_DATASET=str(small_dataset(tmp / "problems.jsonl", 6)), SFT_OUTPUT_DIR=str(tmp / "sft"),
               SFT_HOLDOUT="2", SFT_MAX_STEPS="3", SFT_BATCH_SIZE="2", SFT_LEARNING_RATE="1e-3",
               GRPO_MAX_COMPLETION="512", GRPO_MAX_PROMPT="4096", GRPO_REPORT_TO="none")
    env.pop("GRPO_PLUMBING")
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def problems(n: int) -> list[Problem]:
    return [Problem(id=f"p{i}", prompt="let f (x : int) : int =", tests="", solution="let f x = x") for i in range(n)]


@pytest.mark.parametrize("raw,value", [("0.1", 0.1), ("0", 0.0), ("3", 3), ("a, b", ["a", "b"])])
def test_holdout_accepts_a_fraction_a_count_or_ids(raw, value):
    assert Holdout(raw) == value


@pytest.mark.parametrize("raw", ["1.5", "-1", "", "nan"])
def test_holdout_rejects(raw):
    with pytest.raises(ValueError):
        Holdout(raw)


def test_split_is_seeded_disjoint_and_complete():
    ps = problems(20)
    train, held = split_problems(ps, 0.1, seed=42)
    assert len(held) == 2 and len(train) == 18
    assert {p.id for p in train} | {p.id for p in held} == {p.id for p in ps}
    assert not {p.id for p in train} & {p.id for p in held}
    assert split_problems(ps, 0.1, seed=42)[1] == held  # same seed, same split
    assert [p.id for p in split_problems(ps, ["p3", "p7"], seed=0)[1]] == ["p3", "p7"]
    assert split_problems(ps, 0, seed=0) == (ps, [])
    with pytest.raises(ValueError, match="no problem to train on"):
        split_problems(ps, 20, seed=0)
    with pytest.raises(ValueError, match="p99"):
        split_problems(ps, ["p99"], seed=0)


def test_sft_help_lists_its_variables_fast(tmp_path):
    t0 = time.time()
    res = subprocess.run([sys.executable, str(TRAIN), "sft", "--help"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and time.time() - t0 < 10, res.stderr
    for var in ("SFT_OUTPUT_DIR", "SFT_LORA", "SFT_HOLDOUT", "SFT_STOP_LOSS", "SFT_LEARNING_RATE", "BASE_MODEL_ID",
                "TRAINING_DATASET", "GRPO_MAX_COMPLETION", "GRPO_SEED", "LORA_R"):
        assert f"{var}=" in res.stdout
    main_help = subprocess.run([sys.executable, str(TRAIN), "--help"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=60).stdout
    assert "SFT_HOLDOUT" in main_help and "GRPO_INIT_ADAPTER=" in main_help and "train.py sft" in main_help


@pytest.mark.parametrize("var,value,accepts", [
    ("SFT_HOLDOUT", "1.5", "a fraction in [0, 1)"),
    ("SFT_LORA", "yes", "0 or 1"),
    ("SFT_LR_SCHEDULER", "steep", "one of linear"),
    ("GRPO_SEED", "-3", "an integer >= 0"),
    ("SFT_EPOCH", "2", "did you mean SFT_EPOCHS?"),
])
def test_sft_config_error_exits_fast_naming_the_variable(tmp_path, cache_home, var, value, accepts):
    t0 = time.time()
    res = subprocess.run([sys.executable, str(TRAIN), "sft"], cwd=tmp_path,
                         env=sft_env(tmp_path, cache_home, **{var: value}), capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 10 and res.returncode != 0
    assert var in res.stderr and accepts in res.stderr, res.stderr
    assert not (tmp_path / "sft").exists()


def test_sft_needs_reference_solutions(tmp_path, cache_home):
    rows = [json.loads(line) for line in small_dataset(tmp_path / "p.jsonl", 3).read_text().splitlines()]
    (tmp_path / "nosol.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "solution"}) + "\n"
                                                  for r in rows))
    res = subprocess.run([sys.executable, str(TRAIN), "sft"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=sft_env(tmp_path, cache_home, TRAINING_DATASET=tmp_path / "nosol.jsonl"))
    assert res.returncode != 0 and "solution" in res.stderr, res.stderr


def test_grpo_init_adapter_must_be_an_adapter(tmp_path, cache_home):
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=run_env(tmp_path, cache_home, GRPO_INIT_ADAPTER=tmp_path))
    assert res.returncode != 0 and "GRPO_INIT_ADAPTER" in res.stderr and "adapter_config.json" in res.stderr


@pytest.mark.slow
def test_lora_sft_then_grpo_continues_the_adapter(tmp_path, cache_home):
    # train.py builds the plumbing model only under GRPO_PLUMBING=1; SFT takes a BASE_MODEL_ID, so build it here.
    from ocaml_grpo.models.tiny import build_plumbing_model
    model = cache_home / "ocaml-grpo" / "plumbing-qwen2-tiny"
    if not (model / "config.json").exists():
        build_plumbing_model(model)
    res = preloaded.run(TRAIN, ["sft"], cwd=tmp_path, env=sft_env(tmp_path, cache_home, GRPO_REPORT_TO="tensorboard"),
                        timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sft = tmp_path / "sft"
    assert not (tmp_path / "runs").exists() and any((sft / "tensorboard").iterdir())  # events kept in SFT_OUTPUT_DIR
    split = json.loads((sft / "split.json").read_text())
    assert len(split["heldout"]) == 2 and len(split["train"]) == 4 and not set(split["train"]) & set(split["heldout"])
    train_ids = [r["id"] for r in read_jsonl(sft / "train_problems.jsonl")]
    assert train_ids == split["train"]
    assert [r["id"] for r in read_jsonl(sft / "heldout_problems.jsonl")] == split["heldout"]
    assert len(read_jsonl(sft / "sft_log.jsonl")) == 3  # one line per step (GRPO_LOGGING_STEPS=1)
    summary = json.loads((sft / "sft_summary.json").read_text())
    assert summary["steps"] == 3 and summary["heldout_loss_before"] > 0 and summary["heldout_loss_after"] > 0
    adapter = sft / "final_adapter"
    assert (adapter / "adapter_config.json").exists() and (adapter / "tokenizer_config.json").exists()
    assert f"GRPO_INIT_ADAPTER={adapter}" in res.stdout
    assert "Model Card for Model ID" not in (adapter / "README.md").read_text()  # ours, not peft's empty card

    # GRPO on the training split only, continuing the SFT adapter.
    run = tmp_path / "run"
    res = preloaded.run(TRAIN, cwd=tmp_path, timeout=240,
                        env=run_env(tmp_path, cache_home, GRPO_INIT_ADAPTER=adapter, GRPO_MAX_STEPS=2,
                                    TRAINING_DATASET=sft / "train_problems.jsonl"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"starting from the adapter {adapter}" in res.stdout
    scored = {r["problem_id"] for r in read_jsonl(run / "reward_logs" / "completions.jsonl")}
    assert scored and scored <= set(train_ids)  # held-out problems never reach GRPO either
    assert len([line for line in log_lines(run) if line.startswith("[Epoch")]) == 2
    # The SFT adapter was continued, not replaced: GRPO_PLUMBING's LORA_R=8 would give a fresh adapter rank 8.
    sft_config = json.loads((adapter / "adapter_config.json").read_text())
    grpo_config = json.loads((run / "final_adapter" / "adapter_config.json").read_text())
    assert sft_config["r"] == grpo_config["r"] == 32
    from safetensors.torch import load_file
    assert load_file(adapter / "adapter_model.safetensors").keys() == \
        load_file(run / "final_adapter" / "adapter_model.safetensors").keys()
