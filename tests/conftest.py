"""Fixtures and helpers shared by the test files.

The external problem sets (`../shared/benchmarks/`, or wherever BENCHMARKS_DIR points) are not
part of the repository (their licences do not allow copying them in), so a fresh clone does not
have them: the tests that read them ask for the `benchmarks` fixture, which skips them with the
reason. Every behaviour they check is also checked on rows the project wrote itself
(tests/fixtures/problems_*.jsonl), so coverage does not depend on them.
"""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import preloaded
from ocaml_grpo.problems import Problem
from ocaml_grpo.grading.grader import OcamlGrader
from ocaml_grpo.grading.sandbox import Sandbox
from rewards import RewardConfig, RewardScorer

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BENCHMARKS_DIR = Path(os.environ.get("BENCHMARKS_DIR") or ROOT.parent / "shared" / "benchmarks")
# Rows written for these tests: OUnit-style tests, a problem that needs `base`, a MultiPL-E-style
# `let candidate = ...` block, an invalid entry point and an abstract type the tests compare (each
# with a solution and a stub) ...
GRADED = FIXTURES / "problems_graded.jsonl"
# ... and rows no answer can pass, each with the audit reason it must get (`expect`).
BROKEN = FIXTURES / "problems_broken.jsonl"
END = "(* END *)"

# One torch thread per process, for the pytest processes and every command they start: with torch's
# default of a thread per core, torch processes running side by side on 2 cores spin-wait on each
# other (measured: two 8-step trainings at once took 66 s, against 8 s with one thread each).
os.environ["OMP_NUM_THREADS"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: the slow tier (`make test-slow`, which CI runs too): end-to-end training "
                                       "runs, the offline bundle, the real model; `make test` runs -m 'not slow'")


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


ADD_PROMPT = "(** Add two integers.\n * >>> add 1 2\n * 3\n*)\nlet add (a : int) (b : int) : int ="
ADD_TESTS = """let () =
  assert (add 1 2 = 3);
  assert (add 0 0 = 0);
  assert (add (-1) 1 = 0);
  assert (add 10 5 = 15);
  assert (add 2 2 = 4);
  assert (add 100 1 = 101);
  assert (add 7 0 = 7)
;;"""


ADD = Problem(id="add", prompt=ADD_PROMPT, tests=ADD_TESTS)

# Rows the oracle cannot run, by set: none (a functor entry point is graded through its signature;
# ocaml.org's 5 multi-function rows through their "Implement all of:" list). They would earn no
# test credit.
UNVERIFIABLE: dict[str, set[str]] = {}




@pytest.fixture(scope="module")
def scorer():
    """A real grader (bubblewrap, two workers) with the minimum-lines rule off."""
    s = RewardScorer(RewardConfig(min_lines=0, workers=2))
    yield s
    s.close()


@pytest.fixture(scope="module")
def sandbox_scorer():
    """The same grader with the library allowlist off: for the tests of the sandbox alone, which
    must hold even for code the allowlist would stop (files, Sys.command, exit)."""
    s = RewardScorer(RewardConfig(min_lines=0, workers=2),
                     grader=OcamlGrader(Sandbox(), cores=2, check_library=False))
    yield s
    s.close()


def fenced(code: str) -> str:
    """A well-formed answer: one ```ocaml block, then the END marker."""
    return f"```ocaml\n{code}\n```\n{END}"


@pytest.fixture(scope="session")
def benchmarks() -> Path:
    """The external sets' directory; the test is skipped, with the reason, when it is absent."""
    if not BENCHMARKS_DIR.is_dir():
        pytest.skip(f"external benchmark sets not found at {BENCHMARKS_DIR} (set BENCHMARKS_DIR to run this test)")
    return BENCHMARKS_DIR


@pytest.fixture(scope="session")
def cache_home(tmp_path_factory) -> Path:
    """XDG cache holding the plumbing model, built once per session (train.py builds it on first use)."""
    return tmp_path_factory.mktemp("xdg_cache")


def problem_set(name: str) -> Path:
    """A set by file name: the project's own (tests/fixtures), or an external one, whose test is
    skipped, naming the set, when the external sets are absent."""
    if (FIXTURES / name).is_file():
        return FIXTURES / name
    if not BENCHMARKS_DIR.is_dir():
        pytest.skip(f"{name}: external benchmark sets not found at {BENCHMARKS_DIR} (set BENCHMARKS_DIR to run this test)")
    return BENCHMARKS_DIR / name


# ----------------------------------------------------------------------------- train.py runs (test_train, test_scale, test_sft)
TRAIN = ROOT / "train.py"
BUNDLED = ROOT / "data" / "ocaml_problems.jsonl"
METRIC_RE = re.compile(
    r"^\[Epoch \d+\.\d{2}\]  loss=-?\d+\.\d{4}  grad=\d+\.\d{4}  lr=\d\.\d{2}e[-+]\d{2}  "
    r"reward=-?\d+\.\d{3}±\d+\.\d{3}  syntax_rew=-?\d+\.\d{3}±\d+\.\d{3}  entropy=\d+\.\d{3}  frac_zero_std=\d\.\d{2}$")
GROUPS_RE = re.compile(r"^\[Groups\] epoch \d+\.\d{2}  too_easy=\d\.\d{2}  too_hard=\d\.\d{2}  identical=\d\.\d{2}  mixed=\d\.\d{2}$")
REPAIR_RE = re.compile(r"^\[Repair\] epoch \d+\.\d{2}  pass_turn1=\d\.\d{2}  pass_final=\d\.\d{2}  turns=\d\.\d{2}  "
                       r"too_hard_turn1=\d\.\d{2}  too_hard_to_mixed=\d\.\d{2}$")
DYNAMIC_RE = re.compile(r"^\[Dynamic\] epoch \d+\.\d{2}  groups_generated=\d+\.\d{2}  groups_kept=\d+\.\d{2}  "
                        r"generation_rounds=\d+\.\d{2}  frac_zero_std_trained=\d\.\d{2}  dropped_too_hard=\d+\.\d{2}  "
                        r"dropped_too_easy=\d+\.\d{2}  dropped_identical=\d+\.\d{2}  dropped_surplus=\d+\.\d{2}  "
                        r"tokens_trained=\d\.\d{2}$")
ENGINE_RE = re.compile(r"^\[Engine\] epoch \d+\.\d{2}  is_ratio=\d+\.\d{3}  clipped_share=\d\.\d{3}  logp_gap=\d+\.\d{3}$")


def small_dataset(path: Path, n: int) -> Path:
    lines = [line for line in BUNDLED.read_text().splitlines() if line.strip()][:n]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_env(tmp: Path, cache_home: Path, **overrides) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "LORA_", "REWARD_"))}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", XDG_CACHE_HOME=str(cache_home),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", GRPO_PLUMBING="1", AUDIT_CACHE_DIR=str(cache_home),
               TRAINING_DATASET=str(small_dataset(tmp / "problems.jsonl", 16)),  # 8 steps per epoch
              GRPO_AUTO_STOP="0", GRPO_OUTPUT_DIR=str(tmp / "run"),
               GRPO_BATCH_SIZE="2", GRPO_NUM_GENERATIONS="2", GRPO_MAX_COMPLETION="24", GRPO_MAX_STEPS="4",
               GRPO_SAVE_STEPS="2", GRPO_SAVE_TOTAL_LIMIT="5", REWARD_WORKERS="2")
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def train(tmp: Path, env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    # cwd = tmp: no .envrc there, so only `env` configures the run.
    res = preloaded.run(TRAIN, cwd=tmp, env=env, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def log_lines(run: Path) -> list[str]:
    text = (run / "learning.log").read_text(encoding="utf-8")
    assert text.endswith("\n")
    return text.splitlines()


def check_log_wellformed(lines: list[str]) -> list[str]:
    """Every line is a header, a health/stop line, or an exact metric line; returns the metric lines."""
    for line in lines:
        assert (line.startswith(("# ", "[Health] ", "[Stop] ", "[Curriculum] ")) or METRIC_RE.match(line)
                or GROUPS_RE.match(line) or REPAIR_RE.match(line) or DYNAMIC_RE.match(line)
                or ENGINE_RE.match(line)), repr(line)
    return [line for line in lines if line.startswith("[Epoch")]


def read_jsonl(path: Path) -> list[dict]:
    raw = path.read_text(encoding="utf-8")
    assert raw.endswith("\n")
    return [json.loads(line) for line in raw.splitlines() if line.strip()]  # a torn line would raise here


def checkpoints(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*") if (p / "trainer_state.json").exists())
