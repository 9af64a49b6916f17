"""End-to-end tests of train.py: real TRL, a tiny random Qwen2 (demo_model.py), the real OCaml
grader, offline. Each training run is a process of its own, forked with torch and TRL already
imported (tests/preloaded.py): 3-5 s for a 4-step run; `-m "not slow"` keeps only the fast checks."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import analyze
import preloaded
from ocaml_grpo.reward.parts import PARTS
from ocaml_grpo.reward.group_kinds import KINDS
from ocaml_grpo.training.learning_log import render
from ocaml_grpo.training.metrics import StepRecord
from conftest import TRAIN, check_log_wellformed, checkpoints, log_lines, read_jsonl, run_env, small_dataset, train

COMPLETION_FIELDS = {"step", "epoch", "problem_id", "completion", "reward", "completion_tokens"}
BREAKDOWN_FIELDS = {"step", "epoch", "problem_id", "reward", "structural", "type_check", "compile", "tests",
                    "has_end_marker", "tests_passed", "tests_total", "runaway"}


# ----------------------------------------------------------------------------- fast checks

@pytest.mark.parametrize("var,value,accepts", [
    ("GRPO_TEMPERATURE", "abc", "a number in"),
    ("GRPO_BATCH_SIZE", "-1", "an integer >= 1"),
    ("GRPO_LOSS_TYPE", "ppo", "one of grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo"),
    ("GRPO_RESUME", "/no/such/checkpoint", "auto, never"),
    ("RUNAWAY_PENALTY_MULTIPLIER", "2", "[0, 1]"),
    ("GRPO_PROMPT_EXAMPLES", "4", "an integer from 0 to 3"),
    ("GRPO_LEARNIG_RATE", "1e-5", "not a variable of this project: did you mean GRPO_LEARNING_RATE?"),  # a typo
    ("REWARD_END_MARKER", "(* DONE *)", "no longer read: the END marker is fixed"),
    ("GRPO_DEMO", "1", "renamed GRPO_PLUMBING"),
    ("GRPO_KEEP_ADAPTERS", "3", "must be a multiple of GRPO_SAVE_STEPS=2"),  # it copies what a checkpoint saved
    ("OCAML_TOOLCHAIN_DIR", "/no/such/toolchain", "the `ocaml` directory install-offline.sh unpacked"),  # the plumbing run's old name (`train.py demo` is the learning demo)
])
def test_config_error_exits_fast_naming_the_variable(tmp_path, cache_home, var, value, accepts):
    t0 = time.time()
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, env=run_env(tmp_path, cache_home, **{var: value}),
                         capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 10
    assert res.returncode != 0
    assert var in res.stderr and accepts in res.stderr, res.stderr
    assert not (tmp_path / "run").exists()  # nothing written for a config that never ran


def test_help_lists_every_variable_fast(tmp_path):
    t0 = time.time()
    res = subprocess.run([sys.executable, str(TRAIN), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and time.time() - t0 < 10
    for var in ("BASE_MODEL_ID", "TRAINING_DATASET", "GRPO_BATCH_SIZE", "GRPO_MAX_PROMPT", "LORA_TARGET_MODULES",
                "GRPO_LOSS_TYPE", "GRPO_RESUME", "GRPO_PLUMBING", "GRPO_AUTO_STOP", "MIN_NON_EMPTY_LINES",
                "OCAML_TOOLCHAIN_DIR"):
        assert f"{var}=" in res.stdout


def test_envrc_is_read_with_export_prefix(tmp_path, cache_home):
    (tmp_path / ".envrc").write_text("export GRPO_BETA=bogus\n")  # a variable the demo does not set
    env = run_env(tmp_path, cache_home)
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "GRPO_BETA='bogus'" in res.stderr


def test_missing_ocaml_toolchain_stops_before_training(tmp_path, cache_home):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    t0 = time.time()
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path,
                         env=run_env(tmp_path, cache_home, PATH=str(empty_bin)), capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 10  # no torch import, no model load
    assert res.returncode != 0
    assert "ocamlc" in res.stderr and "ocaml-nox" in res.stderr, res.stderr
    assert not (tmp_path / "run" / "learning.log").exists()


# ----------------------------------------------------------------------------- training runs

def rendered_from_records(run) -> list[StepRecord]:
    """learning.log's lines after its `#` lines, rendered from metrics.jsonl, are the ones the run
    wrote live, byte for byte; returns the records."""
    records = [StepRecord.from_json(r) for r in read_jsonl(run / "metrics.jsonl")]
    live = b"".join(l for l in (run / "learning.log").read_bytes().splitlines(keepends=True) if not l.startswith(b"#"))
    assert "".join(line + "\n" for line in render(records)).encode() == live
    return records


@pytest.mark.slow
def test_train_logs_checkpoints_resume_and_merge(tmp_path, cache_home):
    run = tmp_path / "run"
    train(tmp_path, run_env(tmp_path, cache_home, GRPO_SAVE_TOTAL_LIMIT=1, GRPO_KEEP_ADAPTERS=2))
    config = json.loads((run / "config.json").read_text())
    assert config["GRPO_NUM_GENERATIONS"] == 2 and config["GRPO_LOSS_TYPE"] == "dapo"
    lines = log_lines(run)
    assert lines[0].startswith("# started") and any(line.startswith("# model:") for line in lines)
    assert len(check_log_wellformed(lines)) == 4
    assert any(line.startswith("[Health] ") for line in lines)  # a random model is unhealthy by every rule
    completions = read_jsonl(run / "reward_logs" / "completions.jsonl")
    breakdown = read_jsonl(run / "reward_logs" / "syntax_aware_breakdown.jsonl")
    assert len(completions) == len(breakdown) == 4 * 2 * 2  # steps x prompts x generations
    assert all(COMPLETION_FIELDS <= set(r) for r in completions)
    assert all(BREAKDOWN_FIELDS <= set(r) for r in breakdown)
    assert checkpoints(run) == [4]  # rotated away; the adapters kept along the run stay
    for step in (2, 4):
        kept = sorted(f.name for f in (run / "adapters" / f"step-{step}").iterdir())
        assert kept == ["README.md", "adapter_config.json", "adapter_model.safetensors"], kept
    assert (run / "final_adapter" / "adapter_config.json").exists()
    assert len(read_jsonl(run / "dataset_audit.jsonl")) == 16  # the audit ran and recorded its verdicts
    records = rendered_from_records(run)
    assert [r.step for r in records] == [1, 2, 3, 4] and records[0].epoch == 2 / 16  # unrounded (the log: 0.12)
    assert all(r.groups and set(r.groups) == set(KINDS) and set(r.parts) == {p.name for p in PARTS}
               and r.clipped_ratio is not None and r.grad_norm is not None for r in records)
    assert all(0.3 < r.rss_gb <= r.peak_rss_gb < 20 for r in records)  # the training process's, in GB
    assert all(0 < r.step_time < 600 for r in records)  # seconds each step took
    assert all(r.stub is not None and 0 <= r.stub <= 1 for r in records)  # the reward function's stub share
    # analyze.py reports from the records alone
    records_only = tmp_path / "records_only"
    shutil.copytree(run, records_only, ignore=shutil.ignore_patterns("checkpoint-*", "final_adapter", "learning.log"))
    assert analyze.main([str(records_only)]) == 0
    report = analyze.analyze(records_only)
    assert any(m.name == "Step time (s)" and 0 < m.lo <= m.hi for m in report.ranges)
    assert [l.epoch for l in report.lines] == [r.epoch for r in records] and report.breakdown.n == 16
    assert (records_only / "analysis.md").is_file() and (records_only / "plots" / "training_curves.png").is_file()

    # Second run: resumes from checkpoint-4, appends to the same logs.
    res = train(tmp_path, run_env(tmp_path, cache_home, GRPO_MAX_STEPS=6))
    assert "resume from: " + str(run / "checkpoint-4") in res.stdout
    lines = log_lines(run)
    assert len(check_log_wellformed(lines)) == 6
    assert any(line.startswith("# resumed from") for line in lines) and lines[0].startswith("# started")
    assert len(read_jsonl(run / "reward_logs" / "completions.jsonl")) == 6 * 2 * 2
    assert [r.step for r in rendered_from_records(run)] == [1, 2, 3, 4, 5, 6]
    assert checkpoints(run)[-1] == 6

    # Third run, GRPO_RESUME=never: a fresh run; the earlier logs are kept aside, not appended to.
    res = train(tmp_path, run_env(tmp_path, cache_home, GRPO_RESUME="never", GRPO_MAX_STEPS=2))
    [archive] = (run / "previous_runs").iterdir()
    assert len(read_jsonl(archive / "reward_logs" / "completions.jsonl")) == 6 * 2 * 2
    assert len(check_log_wellformed(log_lines(archive))) == 6 and len(read_jsonl(archive / "metrics.jsonl")) == 6
    assert json.loads((archive / "config.json").read_text())["GRPO_MAX_STEPS"] == 6  # its config stays with it
    assert json.loads((run / "config.json").read_text())["GRPO_MAX_STEPS"] == 2
    assert len(check_log_wellformed(log_lines(run))) == 2 and len(read_jsonl(run / "metrics.jsonl")) == 2
    assert len(read_jsonl(run / "reward_logs" / "completions.jsonl")) == 2 * 2 * 2

    merged = tmp_path / "merged"
    res = preloaded.run(TRAIN, ["merge", run / "final_adapter", merged], cwd=tmp_path, env=run_env(tmp_path, cache_home),
                        timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (merged / "config.json").exists() and (merged / "tokenizer_config.json").exists()
    assert not (merged / "adapter_config.json").exists()


@pytest.mark.slow
def test_sigkill_mid_training_then_resume(tmp_path, cache_home):
    run = tmp_path / "run"
    env = run_env(tmp_path, cache_home, GRPO_MAX_STEPS=200, GRPO_SAVE_STEPS=2)
    proc = preloaded.Command(TRAIN, [], tmp_path, env)  # in a session of its own, like start_new_session
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not checkpoints(run):
            assert proc.poll() is None, "training ended before it could be killed"
            time.sleep(0.2)
        assert checkpoints(run), "no checkpoint within 180 s"
        time.sleep(1.5)  # well inside the next steps: generation, grading, logging
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the trainer and any grader children it started
        proc.wait()
    last = checkpoints(run)[-1]
    read_jsonl(run / "reward_logs" / "completions.jsonl")
    read_jsonl(run / "reward_logs" / "syntax_aware_breakdown.jsonl")

    res = train(tmp_path, run_env(tmp_path, cache_home, GRPO_MAX_STEPS=last + 2, GRPO_SAVE_STEPS=2))
    assert f"checkpoint-{last}" in res.stdout
    lines = log_lines(run)
    check_log_wellformed(lines)
    assert any(line.startswith(f"# resumed from {run / f'checkpoint-{last}'}") for line in lines)
    assert checkpoints(run)[-1] == last + 2
    for name in ("completions.jsonl", "syntax_aware_breakdown.jsonl"):
        records = read_jsonl(run / "reward_logs" / name)
        assert max(r["step"] for r in records) >= last + 1


@pytest.mark.slow
@pytest.mark.parametrize("auto_stop", [1, 0])
def test_stop_criteria_at_epoch_one(tmp_path, cache_home, auto_stop):
    # 2 problems, 1 prompt per step: epoch 1.0 is step 2. A random model fails every stop criterion.
    run = tmp_path / "run"
    env = run_env(tmp_path, cache_home, TRAINING_DATASET=small_dataset(tmp_path / "two.jsonl", 2), GRPO_BATCH_SIZE=1,
                  GRPO_NUM_EPOCHS=3, GRPO_MAX_STEPS=-1, GRPO_SAVE_STEPS=50, GRPO_AUTO_STOP=auto_stop)
    train(tmp_path, env)
    lines = log_lines(run)
    stop = [line for line in lines if line.startswith("[Stop] ")]
    if auto_stop:
        assert len(check_log_wellformed(lines)) == 2
        assert len(stop) == 1 and "mean reward" in stop[0] and "no test passes" in stop[0]
        assert checkpoints(run) == [2]  # saved by the stop, not by GRPO_SAVE_STEPS
    else:
        assert len(check_log_wellformed(lines)) == 6 and not stop  # all 3 epochs
        assert any(line.startswith("[Health] stop criteria met") for line in lines)


def test_activation_checkpointing_takes_the_name_this_transformers_knows():
    # The lent H100's image (transformers 5.17) rejected GRPOConfig(activation_checkpointing=...):
    # its TrainingArguments took only the older name.
    from trl import GRPOConfig
    from ocaml_grpo.models.loading import checkpointing_kwargs

    class OlderTrainingArguments:
        def __init__(self, output_dir=None, gradient_checkpointing=False):
            pass

    assert checkpointing_kwargs(OlderTrainingArguments, True) == {"gradient_checkpointing": True}
    assert checkpointing_kwargs(GRPOConfig, True) == {"activation_checkpointing": True}


def test_torch_takes_half_the_cores_unless_told():
    """GRPO_TORCH_THREADS=auto: torch's default (a thread per core) spin-waits against the grader and any
    neighbour (bench/bench_load.py); OMP_NUM_THREADS, when exported, still decides."""
    from ocaml_grpo.config import resolve
    cores = os.cpu_count()
    assert resolve({})[0].train.torch_threads == max(1, cores // 2)
    assert resolve({"LOCAL_WORLD_SIZE": str(cores)})[0].train.torch_threads == 1
    assert resolve({"OMP_NUM_THREADS": "3"})[0].train.torch_threads == 3
    assert resolve({"GRPO_TORCH_THREADS": "2", "OMP_NUM_THREADS": "3"})[0].train.torch_threads == 2
