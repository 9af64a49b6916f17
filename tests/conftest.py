"""Fixtures and helpers shared by the test files.

The external problem sets (`../shared/benchmarks/`, or wherever BENCHMARKS_DIR points) are not
part of the repository (their licences do not allow copying them in), so a fresh clone does not
have them: the tests that read them ask for the `benchmarks` fixture, which skips them with the
reason. Every behaviour they check is also checked on rows the project wrote itself
(tests/fixtures/problems_*.jsonl), so coverage does not depend on them.
"""
import json
import os
from pathlib import Path

import pytest

from ocaml_grpo.problems import Problem
from rewards import RewardConfig, RewardScorer

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BENCHMARKS_DIR = Path(os.environ.get("BENCHMARKS_DIR") or ROOT.parent / "shared" / "benchmarks")
# Rows written for these tests: OUnit-style tests, a problem that needs `base`, a MultiPL-E-style
# `let candidate = ...` block and an invalid entry point (each with a solution and a stub) ...
GRADED = FIXTURES / "problems_graded.jsonl"
# ... and rows no answer can pass, each with the audit reason it must get (`expect`).
BROKEN = FIXTURES / "problems_broken.jsonl"
END = "(* END *)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: end-to-end training runs (tens of seconds each); deselect with -m 'not slow'")


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


@pytest.fixture(scope="module")
def scorer():
    """A real grader (bubblewrap, two workers) with the minimum-lines rule off."""
    s = RewardScorer(RewardConfig(min_lines=0, workers=2))
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
    """XDG cache holding the demo model, built once per session (train.py builds it on first use)."""
    return tmp_path_factory.mktemp("xdg_cache")


def problem_set(name: str) -> Path:
    """A set by file name: the project's own (tests/fixtures), or an external one, whose test is
    skipped, naming the set, when the external sets are absent."""
    if (FIXTURES / name).is_file():
        return FIXTURES / name
    if not BENCHMARKS_DIR.is_dir():
        pytest.skip(f"{name}: external benchmark sets not found at {BENCHMARKS_DIR} (set BENCHMARKS_DIR to run this test)")
    return BENCHMARKS_DIR / name
