"""A user's everyday mistakes cost no work (issue #20): a failed start leaves the previous run as it
was, a finished run is not trained again, Ctrl-C saves a checkpoint that a re-run resumes from
with every step counted once, and a misnamed or missing setting is an error naming the variable
before torch is imported. Real train.py runs (tiny model, real grader), as in test_train.py."""
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import analyze
import preloaded
from conftest import ROOT, TRAIN, checkpoints, run_env, small_dataset, train


def snapshot(run: Path) -> dict[str, str]:
    """Every file under `run`, by its path, with its content's hash."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def no_torch(tmp: Path) -> dict:
    """PYTHONPATH under which `import torch` fails: an error that comes before it is proved to."""
    fake = tmp / "no_torch" / "torch"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('torch was imported before the error')\n")
    return {"PYTHONPATH": str(fake.parent)}


# ----------------------------------------------------------------------------- settings named wrong

@pytest.mark.parametrize("var,value,expected", [
    ("TRAINING_DATASE", "x.jsonl", "did you mean TRAINING_DATASET?"),  # typos without a project prefix
    ("BASE_MODEL_IDD", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "did you mean BASE_MODEL_ID?"),
    ("OCAML_CPU_LIMT_S", "3", "did you mean OCAML_CPU_LIMIT_S?"),
    ("MIN_NON_EMPTY_LINE", "2", "did you mean MIN_NON_EMPTY_LINES?"),
    ("BASE_MODEL_ID", "/no/such/model", "BASE_MODEL_ID=/no/such/model: no such directory"),
    ("BASE_MODEL_ID", "{tmp}", "is not a model directory (no config.json in it)"),
    ("BASE_MODEL_ID", "someone/not-downloaded", "the hub is offline (HF_HUB_OFFLINE=1)"),
    ("BASE_MODEL_ID", "smollm2-135m", "did you mean smollm2-135m-instruct"),  # a named model's typo, not a hub id
])
def test_setting_errors_name_the_variable_before_torch_is_imported(tmp_path, cache_home, var, value, expected):
    env = run_env(tmp_path, cache_home, **{var: value.format(tmp=tmp_path)}, HF_HOME=tmp_path / "hf", **no_torch(tmp_path))
    t0 = time.time()
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 10
    assert res.returncode != 0 and "torch was imported" not in res.stderr, res.stderr
    assert expected in res.stderr and "config error" in res.stderr, res.stderr
    assert not (tmp_path / "run").exists()


def test_an_unreachable_hub_is_found_in_seconds_and_named(tmp_path, cache_home):
    # No HF_HUB_OFFLINE: the libraries would retry the hub for 25-50 s. A closed port stands for
    # a machine without network.
    env = run_env(tmp_path, cache_home, BASE_MODEL_ID="someone/not-downloaded", HF_HOME=tmp_path / "hf",
                  HF_ENDPOINT="http://127.0.0.1:9", **no_torch(tmp_path))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(name)
    t0 = time.time()
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 10
    assert res.returncode != 0 and "hub cannot be reached" in res.stdout, res.stdout + res.stderr
    assert "BASE_MODEL_ID=someone/not-downloaded" in res.stderr and "hf download" in res.stderr


def test_an_unwritable_output_dir_is_a_config_error(tmp_path, cache_home):
    (tmp_path / "afile").write_text("")
    env = run_env(tmp_path, cache_home, GRPO_OUTPUT_DIR=tmp_path / "afile" / "run", **no_torch(tmp_path))
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "GRPO_OUTPUT_DIR=" in res.stderr and "is a file, not a directory" in res.stderr
    assert "Traceback" not in res.stderr


def test_merge_without_an_adapter_and_an_audit_piped_into_head(tmp_path, cache_home):
    res = subprocess.run([sys.executable, str(TRAIN), "merge", str(tmp_path / "nothing"), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "is not a LoRA adapter (no adapter_config.json there)" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home), "AUDIT_CACHE_DIR": str(cache_home)}
    res = subprocess.run(f"{sys.executable} {ROOT / 'rewards.py'} audit bundled --json | head -1", shell=True,
                         capture_output=True, text=True, timeout=120, env=env)
    assert len(res.stdout.splitlines()) == 1 and "Error" not in res.stderr, res.stderr


# ----------------------------------------------------------------------------- a finished run

@pytest.mark.slow
def test_a_finished_run_survives_failed_starts_and_is_not_trained_again(tmp_path, cache_home):
    # One finished run for both checks: a training run costs more than either check.
    env = run_env(tmp_path, cache_home, GRPO_MAX_STEPS=2)
    train(tmp_path, env)
    run = Path(env["GRPO_OUTPUT_DIR"])
    before = snapshot(run)
    assert {"config.json", "learning.log", "final_adapter/adapter_config.json"} <= set(before)

    # A failed start leaves the previous run's files byte-identical.
    one_problem = small_dataset(tmp_path / "one.jsonl", 1)  # fewer usable problems than GRPO_BATCH_SIZE: after the audit
    for overrides in ({"TRAINING_DATASET": tmp_path / "missing.jsonl", "GRPO_RESUME": "never"},  # a fresh run's
                      {"TRAINING_DATASET": tmp_path / "missing.jsonl", "GRPO_MAX_STEPS": 4},     # a resumed run's
                      {"TRAINING_DATASET": one_problem, "GRPO_RESUME": "never"},
                      {"PATH": tmp_path / "no_bin", "GRPO_RESUME": "never"}):                   # no OCaml toolchain
        res = preloaded.run(TRAIN, cwd=tmp_path, env={**env, **{k: str(v) for k, v in overrides.items()}}, timeout=120)
        assert res.returncode != 0, overrides
        assert snapshot(run) == before, overrides
        assert not (run / "previous_runs").exists()

    # Run again as it was, it says it has finished, exits 0 and trains nothing.
    res = train(tmp_path, env)
    assert "finished at step 2" in res.stdout and "Nothing to train" in res.stdout
    assert snapshot(run) == before  # final_adapter/, the logs and the checkpoints untouched


# ----------------------------------------------------------------------------- Ctrl-C

def open_lines(run: Path) -> list[str]:
    """The metric lines learning.log holds so far."""
    path = run / "learning.log"
    return [line for line in path.read_text().splitlines() if line.startswith("[Epoch")] if path.exists() else []


def interrupt(tmp: Path, env: dict, after_lines: int, signals: int) -> subprocess.CompletedProcess:
    """Start a long run, send SIGINT `signals` times once learning.log holds `after_lines` metric
    lines, and return how the run ended (its exit status in `returncode`)."""
    run = Path(env["GRPO_OUTPUT_DIR"])
    proc = preloaded.Command(TRAIN, [], tmp, env)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and len(open_lines(run)) < after_lines:
            assert proc.poll() is None, "training ended before it could be interrupted"
            time.sleep(0.2)
        for _ in range(signals):
            os.kill(proc.pid, signal.SIGINT)
            time.sleep(0.1)  # two signals at once would reach the handler as one
        proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.result()


@pytest.mark.slow
def test_sigint_saves_the_current_step_and_a_rerun_counts_each_step_once(tmp_path, cache_home):
    run = tmp_path / "run"
    res = interrupt(tmp_path, run_env(tmp_path, cache_home, GRPO_MAX_STEPS=200, GRPO_SAVE_STEPS=50), 2, signals=1)
    assert res.returncode == 128 + signal.SIGINT, res.stdout[-2000:] + res.stderr[-2000:]
    steps = len(open_lines(run))
    assert checkpoints(run) == [steps]  # the step in progress was finished and saved, none lost
    assert f"checkpoint saved in {run / f'checkpoint-{steps}'}" in res.stdout and "Resume with" in res.stdout
    assert "Traceback" not in res.stderr and "AttributeError" not in res.stderr
    assert not (run / "final_adapter").exists() and not (run / "finished.json").exists()

    res = train(tmp_path, run_env(tmp_path, cache_home, GRPO_MAX_STEPS=steps + 2, GRPO_SAVE_STEPS=50))
    assert f"resume from: {run / f'checkpoint-{steps}'}" in res.stdout
    report = analyze.analyze(run)
    assert len(report.lines) == steps + 2
    assert report.breakdown.n == (steps + 2) * 2 * 2 and report.breakdown.groups == (steps + 2) * 2
    assert (run / "finished.json").exists()


@pytest.mark.slow
def test_a_second_sigint_stops_at_once(tmp_path, cache_home):
    res = interrupt(tmp_path, run_env(tmp_path, cache_home, GRPO_MAX_STEPS=200, GRPO_SAVE_STEPS=50), 1, signals=2)
    assert res.returncode == 128 + signal.SIGINT and "SIGINT again: stopping now" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert (tmp_path / "run" / "learning.log").read_text().endswith("\n")  # whole lines only


@pytest.mark.parametrize("content,needle", [
    (None, "cannot read the completions file (No such file or directory)"),
    ('{"problem_id": "p001_count_evens", "completion": oops}\n', "line 1 is not JSON (Expecting value at column 50)"),
])
def test_rewards_score_names_a_bad_completions_file_without_a_traceback(tmp_path, content, needle):
    path = tmp_path / "completions.jsonl"
    if content is not None:
        path.write_text(content)
    res = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "score", "bundled", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and needle in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("spec,expected", [
    ("{root}/data/ocaml_problem.jsonl", "did you mean {root}/data/ocaml_problems.jsonl?"),  # the nearest file
    ("/no/such/problems.jsonl", "or `bundled`: the project's own problems"),
    ("bundeld", "did you mean bundled"),
])
def test_a_dataset_typo_names_the_nearest_file_and_the_bundled_set(tmp_path, cache_home, spec, expected):
    env = run_env(tmp_path, cache_home, TRAINING_DATASET=spec.format(root=ROOT), **no_torch(tmp_path))
    res = subprocess.run([sys.executable, str(TRAIN)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "dataset error" in res.stderr, res.stderr
    assert expected.format(root=ROOT) in res.stderr, res.stderr


def test_a_dataset_given_as_a_path_object_loads():
    """The typo check reads text: a Path (how the benchmarks name the bundled file) must still load."""
    from ocaml_grpo.problems import BUNDLED, load_problems
    assert len(load_problems(BUNDLED)) == len(load_problems("bundled")) == 128
