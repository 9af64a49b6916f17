"""The reward's settings (one definition, one default, one END marker) and the TRL reward
function's contract: a crashed grading is None, and its metrics go through log_metric."""
import asyncio
import json
from collections import defaultdict

import pytest

import rewards
from conftest import GRADED, fenced, read_rows
from ocaml_grpo import prompting
from ocaml_grpo.grading.completions import assemble_solution, is_value_name
from ocaml_grpo.problems import Problem
from ocaml_grpo.config import (PLUMBING_DEFAULTS, REWARD_SETTINGS, SANDBOX_SETTINGS, SETTINGS, RewardConfig,
                               SandboxConfig, TrainConfig, resolve)
from ocaml_grpo.config.settings import defaults, from_env, settings_of
from ocaml_grpo.grading.grader import OcamlGrader
from ocaml_grpo.grading.sandbox import Sandbox

ADD_PROMPT = "(** Add two integers. *)\nlet add (a : int) (b : int) : int ="
ADD_TESTS = "let () =\n  assert (add 1 2 = 3);\n  assert (add 0 0 = 0)\n;;"


def test_defaults_live_in_the_dataclasses():
    values = defaults(REWARD_SETTINGS + SANDBOX_SETTINGS)
    config = resolve({}, REWARD_SETTINGS + SANDBOX_SETTINGS)[0].reward
    plain = RewardConfig()
    assert (config.weights, config.runaway_multiplier, config.min_lines) == \
        (plain.weights, plain.runaway_multiplier, plain.min_lines) == (rewards.Weights(), 0.3, 8)
    assert config.sandbox == plain.sandbox == SandboxConfig()
    assert values["MIN_NON_EMPTY_LINES"] == 8
    # the trainer resolves the reward's settings with its own: each name defined once
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names)) and "MIN_NON_EMPTY_LINES" not in [s.name for s in settings_of(TrainConfig)]
    assert set(PLUMBING_DEFAULTS) <= set(names)


def test_reward_config_is_built_from_validated_values():
    cfg, errors = resolve({"MIN_NON_EMPTY_LINES": "3", "REWARD_WEIGHT_TESTS": "0.5", "REWARD_WORKERS": "2",
                           "OCAML_CPU_LIMIT_S": "7", "OCAML_COMPILER": "ocamlc"})
    assert errors == []
    config = cfg.reward
    assert (config.min_lines, config.weights.tests, config.workers) == (3, 0.5, 2)
    assert (config.sandbox.limits.cpu_s, config.sandbox.limits.wall_s, config.sandbox.compiler) == (7, 70, "ocamlc")
    _, errors = resolve({"MIN_NON_EMPTY_LINES": "-1", "REWARD_WORKERS": "0", "REWARD_WEIGHT_COMPILE": "-0.1"})
    assert [e.split("=")[0] for e in errors] == ["MIN_NON_EMPTY_LINES", "REWARD_WEIGHT_COMPILE", "REWARD_WORKERS"]
    with pytest.raises(ValueError, match="MIN_NON_EMPTY_LINES='x' is invalid: expected an integer >= 0"):
        from_env(RewardConfig, {"MIN_NON_EMPTY_LINES": "x"})


def test_the_reward_looks_for_the_marker_the_prompt_asks_for():
    assert prompting.END_MARKER in prompting.user_message("let f (x : int) : int =")
    assert not hasattr(rewards.RewardConfig(), "end_marker")  # no second copy to drift from the prompt
    scorer = rewards.RewardScorer(rewards.RewardConfig(min_lines=0, workers=1))
    try:
        problem = Problem("add", ADD_PROMPT, ADD_TESTS)
        assert scorer.score_one(problem, f"```ocaml\nlet add a b = a + b\n```\n{prompting.END_MARKER}").has_end_marker
        assert not scorer.score_one(problem, "```ocaml\nlet add a b = a + b\n```\n(* DONE *)").has_end_marker
    finally:
        scorer.close()


class FaultyGrader(OcamlGrader):
    """The real grader, with a bug injected for solutions that ask for one."""

    def grade(self, solution, *a, **kw):
        if "CRASH" in solution:
            raise RuntimeError("injected grader bug")
        return super().grade(solution, *a, **kw)


def test_a_crashed_grading_is_none_for_trl_and_counted_through_log_metric(tmp_path, capsys):
    config = rewards.RewardConfig(min_lines=0, workers=1)
    scorer = rewards.GuardedScorer(config, grader=FaultyGrader(Sandbox(), cores=1))
    reward_fn = rewards.make_reward_function(tmp_path, scorer=scorer)
    metrics = defaultdict(list)
    completions = [fenced("let add a b = a + b"), fenced("let add a b = a + b (* CRASH *)"), fenced("let add a b = a * b + 1")]
    try:
        # the keyword arguments TRL 1.16's GRPOTrainer passes, dataset columns included
        out = asyncio.run(reward_fn(prompts=["p"] * 3, completions=completions, completion_ids=[[1, 2]] * 3,
                                    trainer_state=None, log_extra=lambda *a: None,
                                    log_metric=lambda k, v: metrics[k].append(v),
                                    id=["add"] * 3, problem=[ADD_PROMPT] * 3, tests=[ADD_TESTS] * 3,
                                    requires=[[]] * 3, entry_point=[""] * 3))
    finally:
        scorer.close()
    assert out == [1.0, None, pytest.approx(0.35 + 0.65 / 2)]  # `a * b + 1` passes add 1 2 and add (-1) 1
    assert metrics[rewards.METRIC_CRASHED] == [pytest.approx(1 / 3)]
    assert metrics[rewards.METRIC_PASSED_ANY] == [pytest.approx(2 / 3)]
    assert scorer.crashes == 1 and "injected grader bug" in capsys.readouterr().err
    [_, crashed, _] = [json.loads(l) for l in (tmp_path / "reward_logs" / "syntax_aware_breakdown.jsonl").open()]
    assert crashed["reward"] is None and crashed["first_error"] == "reward crashed: RuntimeError: injected grader bug"


def test_an_invalid_entry_point_is_replaced_by_the_prompts_signature():
    assert is_value_name("count_upper") and is_value_name("_x'") and not is_value_name("Count_Upper")
    assert not is_value_name("let") and not is_value_name("_") and not is_value_name("a-b")
    [row] = [r for r in read_rows(GRADED) if r["id"] == "entry/count_upper"]
    p = Problem(row["id"], row["prompt"], row["tests"], entry_point=row["entry_point"])
    assert row["entry_point"] == "Count_Upper"  # a constructor name: `let Count_Upper = ...` cannot compile
    assert assemble_solution("  0", p.prompt, p.entry_point)[1] == ["count_upper"]
    scorer = rewards.RewardScorer(rewards.RewardConfig(min_lines=0, workers=1))
    try:
        assert scorer.score_one(p, fenced(row["solution"])).reward == 1.0  # 0.075 while the row's name was bound
    finally:
        scorer.close()


def test_rescoring_a_runs_log_reproduces_every_reward_training_gave(tmp_path):
    """`rewards.py score` on a run folder applies every rule the run's reward function applied:
    the completion limit (runaway: x0.3), the curriculum's weights for each completion's epoch, the
    repair turns' discount. The log is written by the training reward function itself."""
    import subprocess
    import sys
    from types import SimpleNamespace
    from conftest import ROOT
    problem = Problem(id="add", prompt=ADD_PROMPT, tests=ADD_TESTS)
    right, wrong = fenced("let add a b = a + b"), fenced("let add a b = a - b")
    config = RewardConfig(min_lines=0, workers=2)
    run = tmp_path / "run"
    (run / "reward_logs").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"MIN_NON_EMPTY_LINES": 0, "GRPO_MAX_COMPLETION": 16,
                                                 "REWARD_CURRICULUM": True, "GRPO_REPAIR_TURNS": 1,
                                                 "GRPO_REPAIR_DISCOUNT": 0.5}))
    scorer = rewards.RewardScorer(config)
    try:
        fn = rewards.make_reward_function(run, max_completion_tokens=16, curriculum=True, scorer=scorer,
                                          repair_discount=0.5)
        row = problem.to_row()
        columns = {k: [v] * 4 for k, v in row.items()}
        # four answers: right, right but cut at the limit, wrong, right after one repair turn
        episodes = [{"answers": [a], "answer_tokens": [t], "turns": 1, "feedback": []}
                    for a, t in [(right, 9), (right, 16), (wrong, 9)]]
        episodes.append({"answers": [wrong, right], "answer_tokens": [9, 9], "turns": 2, "feedback": ["fix it"]})
        for epoch in (0.2, 0.7, 1.2):  # the curriculum's three phases
            asyncio.run(fn(["p"] * 4, [right, right, wrong, right], trainer_state=SimpleNamespace(epoch=epoch, global_step=1),
                           repair=[dict(e) for e in episodes], **columns))
    finally:
        scorer.close()
    logged = [json.loads(line) for line in (run / "reward_logs" / "completions.jsonl").read_text().splitlines()]
    assert len({r["reward"] for r in logged}) >= 6  # the rules make a difference here
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps(row) + "\n")
    res = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "score", str(problems),
                          str(run / "reward_logs" / "completions.jsonl")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert [json.loads(line)["reward"] for line in res.stdout.splitlines()] == [r["reward"] for r in logged]
    assert "GRPO_MAX_COMPLETION=16" in res.stderr and "REWARD_CURRICULUM=1" in res.stderr
