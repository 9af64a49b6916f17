"""The bundled problem set: well-formed, every reference solution scores 1.0 through the real
grader, and a stub with the prompt's signature earns no test credit."""
import collections
import json

import pytest

from ocaml_grpo.grading import source as src
from ocaml_grpo.problems import BUNDLED, load_problems
from ocaml_grpo.config.settings import from_env
from rewards import RewardConfig, RewardScorer


@pytest.fixture(scope="module")
def problems():
    return load_problems("bundled")


def test_schema_size_and_mix(problems):
    assert len(problems) >= 120
    assert len({p.id for p in problems}) == len(problems)
    mix = collections.Counter(p.difficulty for p in problems)
    assert set(mix) == {"easy", "medium", "hard"}
    assert 0.35 <= mix["easy"] / len(problems) <= 0.45 and 0.15 <= mix["hard"] / len(problems) <= 0.25
    for p in problems:
        sig = src.parse_signature(p.prompt)
        assert sig is not None and p.prompt.rstrip().endswith("="), p.id
        assert ">>>" in p.prompt, p.id
        plan = src.parse_assert_tests(p.tests)
        assert plan is not None and plan.n_assertions >= 6, p.id
    rows = [json.loads(line) for line in open(BUNDLED)]
    assert all({"id", "prompt", "tests", "solution", "difficulty"} <= set(r) for r in rows)


def test_every_solution_scores_one_and_every_stub_gets_no_test_credit(problems, monkeypatch):
    # correctness, not speed: a generous budget so a loaded machine cannot time a solution out
    scorer = RewardScorer(from_env(RewardConfig, {"OCAML_WALL_LIMIT_S": "30", "MIN_NON_EMPTY_LINES": "0",
                                                 "REWARD_WORKERS": "2"}))
    try:
        sols = scorer.score_batch(problems, [f"```ocaml\n{p.solution}\n```\n(* END *)" for p in problems])
        assert [(b.problem_id, b.reward, b.first_error) for b in sols if b.reward != 1.0] == []
        stubs = [f"```ocaml\n{src.parse_signature(p.prompt).signature}\n  failwith \"todo\"\n```\n(* END *)" for p in problems]
        graded = scorer.score_batch(problems, stubs)
        assert all(b.compiled for b in graded)
        assert [b.problem_id for b in graded if b.tests_passed] == []
    finally:
        scorer.close()
