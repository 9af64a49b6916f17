"""Scale-out: train.py under `accelerate launch` with 2 CPU processes (gloo), the optional
engines' clear errors, reward workers per process, and bench_train.py on the tiny model."""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TRAIN, check_log_wellformed, checkpoints, log_lines, read_jsonl, run_env, train

ACCELERATE = Path(sys.executable).parent / "accelerate"


def launch(tmp: Path, env: dict) -> subprocess.CompletedProcess:
    # --multi_gpu picks torch.distributed's launcher; with no GPU the processes train on CPU over gloo.
    cmd = [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29533", str(TRAIN)]
    res = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


@pytest.mark.slow
def test_two_processes_log_once_checkpoint_and_resume(tmp_path, cache_home):
    env = run_env(tmp_path, cache_home, GRPO_BATCH_SIZE=1, GRPO_MAX_STEPS=2, GRPO_SAVE_STEPS=2,
                  AUDIT_DATASET=0, REWARD_CURRICULUM=1)  # (two more switches checked on the way)
    res = launch(tmp_path, env)
    assert "AUDIT_DATASET=0: dataset audit skipped" in res.stdout
    run = tmp_path / "run"
    assert not (run / "dataset_audit.jsonl").exists()
    lines = log_lines(run)
    assert "[Curriculum] phase syntax from epoch 0.12: structural 0.10  type 0.40  compile 0.30  tests 0.20" in lines
    assert {r["phase"] for r in read_jsonl(run / "reward_logs" / "syntax_aware_breakdown.jsonl")} == {"syntax"}
    metrics = check_log_wellformed(lines)
    assert len(metrics) == 2  # rank 0 alone writes learning.log
    assert metrics[-1].startswith("[Epoch 0.25]")  # 2 steps x 2 processes x 1 prompt of 16 problems
    rows = read_jsonl(run / "reward_logs" / "completions.jsonl")
    # each process logs the completions it scored, once: 2 steps x 2 ranks x 1 prompt x 2 generations
    assert sorted((r["rank"], r["step"]) for r in rows) == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0), (1, 1), (1, 1)]
    assert len(read_jsonl(run / "reward_logs" / "syntax_aware_breakdown.jsonl")) == 8
    # the problem tracker: both ranks' groups gathered, written once by rank 0; both ranks drew from
    # the same states, so a step's two prompts are two different problems
    tracked = read_jsonl(run / "reward_logs" / "problem_tracking.jsonl")
    assert [e["step"] for e in tracked] == [0, 0, 1, 1]
    assert all(tracked[i]["problem_id"] != tracked[i + 1]["problem_id"] for i in (0, 2))
    assert checkpoints(run) == [2]

    res = launch(tmp_path, {**env, "GRPO_MAX_STEPS": "3"})
    assert "resume from: " + str(run / "checkpoint-2") in res.stdout
    metrics = check_log_wellformed(log_lines(run))
    assert len(metrics) == 3 and metrics[-1].startswith("[Epoch 0.38]")
    assert len(read_jsonl(run / "reward_logs" / "completions.jsonl")) == 12


@pytest.mark.slow
def test_two_processes_take_repair_turns(tmp_path, cache_home):
    """Repair turns under accelerate: the first answers' grades are gathered from both processes
    (training/trainer.py) and each process's episodes are logged by the rank that scored them."""
    env = run_env(tmp_path, cache_home, GRPO_BATCH_SIZE=1, GRPO_MAX_STEPS=2, GRPO_SAVE_STEPS=10,
                  GRPO_REPAIR_TURNS=1, AUDIT_DATASET=0)
    launch(tmp_path, env)
    run = tmp_path / "run"
    assert len(check_log_wellformed(log_lines(run))) == 2
    assert sum(line.startswith("[Repair]") for line in log_lines(run)) == 2
    rows = read_jsonl(run / "reward_logs" / "completions.jsonl")
    assert sorted((r["rank"], r["step"]) for r in rows) == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0), (1, 1), (1, 1)]
    assert all(1 <= len(r["turns"]) <= 2 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("engine,steps", [("GRPO_CONTINUOUS_BATCHING", 1), ("GRPO_COMPILED_GENERATION", 2)])
def test_train_generates_with_the_other_transformers_engines(tmp_path, cache_home, engine, steps):
    env = run_env(tmp_path, cache_home, **{engine: 1}, GRPO_MAX_STEPS=steps, GRPO_SAVE_STEPS=10)
    train(tmp_path, env)
    run = tmp_path / "run"
    assert len(check_log_wellformed(log_lines(run))) == steps
    rows = read_jsonl(run / "reward_logs" / "completions.jsonl")
    assert len(rows) == 4 * steps and all(0 < r["completion_tokens"] <= 24 for r in rows)


@pytest.mark.parametrize("extra,needle", [
    ({"GRPO_USE_VLLM": "1"}, "pip install -r requirements-vllm.txt"),
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, "pip install deepspeed"),
    ({"GRPO_VLLM_MODE": "local"}, "GRPO_VLLM_MODE"),
    ({"GRPO_COMPILED_GENERATION": "1", "GRPO_CONTINUOUS_BATCHING": "1"},
     "GRPO_CONTINUOUS_BATCHING=1 and GRPO_COMPILED_GENERATION=1: choose one generation engine"),
    ({"GRPO_STOP_AT_END": "1", "GRPO_CONTINUOUS_BATCHING": "1"},
     "GRPO_STOP_AT_END=1 and GRPO_CONTINUOUS_BATCHING=1: continuous batching cannot stop an answer"),
    ({"GRPO_COMPILED_GENERATION": "1", "CXX": "/nonexistent/g++"},  # a machine without a C compiler
     "GRPO_COMPILED_GENERATION=1 but torch.compile cannot build kernels here"),
])
def test_missing_or_bad_engine_is_a_clear_config_error(tmp_path, cache_home, extra, needle):
    if "vllm" in needle and importlib.util.find_spec("vllm"):
        pytest.skip("vLLM is installed here")
    t0 = time.time()
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, env=run_env(tmp_path, cache_home, **extra),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and needle in res.stderr, res.stderr
    # before any model loads: the compile check imports torch and tries one kernel (12.7 s seen on 2
    # loaded cores); the others stop before torch is imported
    assert time.time() - t0 < (40 if "torch.compile" in needle else 10)


def test_answers_stop_at_the_end_marker_when_asked():
    from ocaml_grpo.config.grpo import TrainConfig
    from ocaml_grpo.config.settings import from_env
    assert not from_env(TrainConfig, {}).stop_at_end  # opt-in (README, GRPO_STOP_AT_END)
    assert from_env(TrainConfig, {"GRPO_STOP_AT_END": "1"}).stop_at_end


def test_reward_workers_are_shared_between_local_processes(monkeypatch):
    from ocaml_grpo.config import RewardConfig
    from ocaml_grpo.config.settings import from_env
    monkeypatch.delenv("REWARD_WORKERS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    workers = {}
    for n in ("1", "2", "3", "16"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", n)
        workers[n] = from_env(RewardConfig, os.environ).workers
    assert workers == {"1": 8, "2": 4, "3": 2, "16": 1}


@pytest.mark.slow
def test_bench_train_runs_the_transformers_engines_on_the_tiny_model(tmp_path, cache_home):
    env = run_env(tmp_path, cache_home)
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, "-m", "bench.bench_train", "--engines", "default,compiled,paged",
                          "--steps", "1",
                          "--warmup", "1", "--out", str(tmp_path / "b"), "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert "no CUDA device" in data["device"] and data["model"] == "tiny"
    assert [r["engine"] for r in data["results"]] == ["default", "compiled", "paged"], res.stdout[-3000:]
    compiled = data["results"][1]
    assert compiled["graphs_compiled"] >= 1 and compiled["recompiles_after_warmup"] == 0
    for r in data["results"]:
        assert r["steps"] == 1 and r["prompts_kept"] == 128 and r["warmup_step_s"] > 0
        assert r["step_s"] > r["generation_s"] > 0 and 0 < r["reward_share"] < 1 and r["generation_tok_per_s"] > 0
        # random weights: the 4 answers are graded as stand-ins: correct, failing tests, type error, correct
        # (the type error is in the entry point's own definition: no type-check or compile credit)
        assert r["reward_mean"] == pytest.approx((1.0 + 0.35 + 0.05 + 1.0) / 4)
        assert 0 < r["generation_tokens_per_step"] <= 2 * 2 * 32
    assert data["results"][0]["graphs_compiled"] == 0  # the default engine compiles nothing
    # progress per step, and each engine's row as soon as it is measured: a run cut off by a time
    # limit (a lent GPU's call) keeps the engines it finished
    out_lines = res.stdout.splitlines()
    at = {k: next(i for i, line in enumerate(out_lines) if line.startswith(k))
          for k in ("default: step 1 (warm-up)", "default: step 2 (measured)", "default ", "compiled: step 1 (warm-up)",
                    "paged: step 1 (warm-up)")}
    assert list(at.values()) == sorted(at.values()), res.stdout[-3000:]


def test_engine_caches_are_sized_to_one_step():
    from ocaml_grpo.training.engines import engine_kwargs
    assert engine_kwargs("default", 24, 704, 512) == {"use_vllm": False, "use_transformers_continuous_batching": False}
    paged = engine_kwargs("paged", 24, 704, 512)
    assert paged["use_transformers_continuous_batching"] and not paged["use_vllm"]
    assert paged["transformers_continuous_batching_config"] == {"num_blocks": 24 * 5}  # 1216 tokens: 5 pages of 256
    colocate = engine_kwargs("vllm", 24, 704, 512, vllm_gpu_memory=0.15)
    assert colocate["vllm_max_model_length"] == 1216 and colocate["vllm_gpu_memory_utilization"] == 0.15
    assert colocate["vllm_server_base_url"] is None
    server = engine_kwargs("vllm", 24, 704, 512, vllm_mode="server", vllm_server_url="http://h:8000")
    assert server["vllm_server_base_url"] == "http://h:8000" and "vllm_max_model_length" not in server
    with pytest.raises(ValueError, match="paged"):
        engine_kwargs("sglang", 24, 704, 512)


@pytest.mark.parametrize("args,needle", [
    (["--engines", "default,sglang"], "--engines: unknown engine 'sglang'"),
    (["--model", "/nonexistent/model"], "--model /nonexistent/model: not `tiny`"),
])
def test_bench_train_bad_arguments_are_named(args, needle):
    res = subprocess.run([sys.executable, "-m", "bench.bench_train", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode != 0 and needle in res.stderr, res.stderr[-2000:]


@pytest.mark.slow
def test_two_processes_take_the_same_dynamic_sampling_rounds(tmp_path, cache_home):
    """Dynamic sampling under accelerate: the keep decision comes from the rewards gathered from
    both processes, so both take the same rounds (a process that stopped early would leave the
    other waiting in a collective); each logs what it generated, and rank 0 the step's figures."""
    env = run_env(tmp_path, cache_home, GRPO_BATCH_SIZE=1, GRPO_MAX_STEPS=2, GRPO_SAVE_STEPS=10,
                  GRPO_DYNAMIC_SAMPLING=1, GRPO_DYNAMIC_SAMPLING_ROUNDS=1, AUDIT_DATASET=0)
    launch(tmp_path, env)
    run = tmp_path / "run"
    lines = log_lines(run)
    assert len(check_log_wellformed(lines)) == 2 and sum(line.startswith("[Dynamic]") for line in lines) == 2
    rows = read_jsonl(run / "reward_logs" / "completions.jsonl")
    # the random model's groups all score 0: every step takes its 2 rounds, on both ranks
    assert sorted((r["rank"], r["step"]) for r in rows) == sorted([(rank, step) for rank in (0, 1) for step in (0, 1)] * 4)
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [(m["generation_rounds"], m["groups_generated"], m["frac_zero_std_trained"]) for m in metrics] == [(2, 4, 1.0)] * 2
    # both ranks' groups reach the tracker, the dropped ones too: 2 steps x 2 rounds x 2 ranks
    assert len(read_jsonl(run / "reward_logs" / "problem_tracking.jsonl")) == 8
