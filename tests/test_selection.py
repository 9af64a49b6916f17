"""Learnable-problem selection, per-group truth and the problem tracker (issue 21).

Real grader on hand-made completions for the statistics; a real train.py run (the tiny plumbing
model) for selection from a stats file and for the tracker's records across a resume.
"""
import asyncio
import json
import os
from collections import Counter
from dataclasses import asdict, replace

import pytest

from ocaml_grpo.report import run_report
import preloaded
from conftest import ADD, ROOT, fenced, log_lines, read_jsonl, run_env, small_dataset, train
from ocaml_grpo.reward import group_kinds
from ocaml_grpo.report.groups import read_group_report, render
from ocaml_grpo.reward.group_kinds import METRIC_FRAC_ZERO_STD, METRIC_GROUP, group_stat
from ocaml_grpo.training.tracker import ProblemTracker
from ocaml_grpo.training.learning_log import groups_line, metric_line
from ocaml_grpo.training.metrics import StepRecord
from ocaml_grpo.commands.probe import grade
from ocaml_grpo.training.selection import ProblemStats, read_stats, sampling_differences, select
from ocaml_grpo.training.tracking import TrackedSampler
from rewards import make_reward_function

RIGHT = fenced("let add a b = a + b")   # 1.0
WRONG = fenced("let add a b = a - b")   # compiles, passes add 0 0 and add 7 0: 0.35 + 0.65 * 2/7
EMPTY = ""                              # no code: 0
SAMPLING = {"model": "m", "temperature": 0.5}


def test_probe_statistics_on_hand_made_completions(scorer):
    """One problem's k completions graded by the real grader, as one group: mean, population std,
    shares, kind; and the kinds of a mastered and an impossible problem."""
    stats = grade([ADD, replace(ADD, id="mastered"), replace(ADD, id="impossible")],
                  [[RIGHT, RIGHT, WRONG, EMPTY], [RIGHT] * 4, [EMPTY] * 4], [[20, 20, 20, 0], [20] * 4, [0] * 4],
                  scorer, 64, SAMPLING)
    wrong = 0.35 + 0.65 * 2 / 7
    rewards = [1.0, 1.0, wrong, 0.0]
    mean = sum(rewards) / 4
    std = (sum((r - mean) ** 2 for r in rewards) / 4) ** 0.5
    s = stats[0]
    assert (s.id, s.k, s.kind, s.sampling) == ("add", 4, "mixed", SAMPLING)
    assert s.reward_mean == pytest.approx(mean, abs=1e-5) and s.reward_std == pytest.approx(std, abs=1e-5)
    assert s.solved == 0.5 and s.passed_any == 0.75
    assert (stats[1].kind, stats[1].reward_mean, stats[1].reward_std, stats[1].solved) == ("too_easy", 1.0, 0.0, 1.0)
    assert (stats[2].kind, stats[2].reward_mean, stats[2].reward_std, stats[2].passed_any) == ("too_hard", 0.0, 0.0, 0.0)


def test_probe_command_appends_resumes_and_refuses_other_settings(tmp_path, cache_home):
    """`evaluate.py --probe` with the tiny model: one line per problem after each batch, a rerun
    samples only what is missing, a file probed at another temperature is refused by name."""
    from ocaml_grpo.models.tiny import build_plumbing_model, is_built
    model = cache_home / "ocaml-grpo" / "plumbing-qwen2-tiny"
    if not is_built(model):
        build_plumbing_model(model)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "REWARD_", "LORA_"))}
    env.update(HF_HUB_OFFLINE="1", XDG_CACHE_HOME=str(cache_home), BASE_MODEL_ID=str(model), GRPO_TEMPERATURE="1.0",
               TRAINING_DATASET=str(small_dataset(tmp_path / "p.jsonl", 3)), GRPO_MAX_COMPLETION="16",
               MIN_NON_EMPTY_LINES="0", REWARD_WORKERS="2")
    out = tmp_path / "stats.jsonl"
    probe = lambda env: preloaded.run(ROOT / "evaluate.py", ["--probe", out, "--k", "2", "--batch-size", "2"],  # noqa: E731
                                      cwd=tmp_path, env=env, timeout=300)
    r = probe(env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "probed 2/3 problems" in r.stdout and "probed 3/3 problems" in r.stdout
    stats = read_stats(out)
    assert [s.k for s in stats] == [2, 2, 2] and stats[0].sampling["model"] == str(model)
    assert stats[0].sampling["temperature"] == 1.0 and stats[0].sampling["max_completion"] == 16
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:40])  # killed while writing the second batch
    r = probe(env)
    assert r.returncode == 0 and "2 already in" in r.stdout and "1 to sample" in r.stdout
    assert sorted(s.id for s in read_stats(out)) == sorted(s.id for s in stats)
    r = probe({**env, "GRPO_TEMPERATURE": "0.7"})
    assert r.returncode == 2 and "temperature: the file has 1.0, this run has 0.7" in r.stderr
    r = probe({**env, "GRPO_PROMPT_EXAMPLES": "0"})  # another prompt samples another policy
    assert r.returncode == 2 and "prompt_examples: the file has null, this run has 0" in r.stderr


def stats_row(pid, mean, std, solved, passed_any, kind, sampling=SAMPLING):
    return ProblemStats(pid, 8, mean, std, solved, passed_any, kind, sampling)


def test_selection_keeps_what_groups_can_learn_from():
    stats = [stats_row("mastered", 1.0, 0.0, 1.0, 1.0, "too_easy"),
             stats_row("nearly", 0.97, 0.09, 0.95, 1.0, "mixed"),          # 95% solved: most groups all pass
             stats_row("impossible", 0.0, 0.0, 0.0, 0.0, "too_hard"),
             stats_row("stuck", 0.35, 0.0, 0.0, 0.5, "identical"),        # same partial score every time
             stats_row("learnable", 0.5, 0.4, 0.4, 0.5, "mixed"),
             stats_row("partial_credit", 0.2, 0.1, 0.0, 0.0, "mixed")]    # no test passes, but the rewards differ
    choices = select([s.id for s in stats] + ["unprobed"], stats, min_std=0.05, max_solved=0.9)
    assert {c.id: c.reason for c in choices} == {
        "mastered": "too_easy", "nearly": "too_easy", "impossible": "too_hard", "stuck": "identical",
        "learnable": None, "partial_credit": None, "unprobed": "not_probed"}
    assert [c.id for c in choices if c.ok] == ["learnable", "partial_credit", "unprobed"]
    assert sampling_differences(stats, {"model": "m", "temperature": 0.9}) == [
        "temperature: the file has 0.5, this run has 0.9"]
    # a setting the run leaves at its default (absent) while the file has it is a difference too
    assert sampling_differences([stats_row("x", 0.5, 0.4, 0.4, 0.5, "mixed", {**SAMPLING, "prompt_examples": 0})],
                                SAMPLING) == ["prompt_examples: the file has 0, this run has null"]


def test_groups_are_classified_per_group_whatever_the_batch(scorer):
    """A batch whose rewards differ overall but not within its first group: frac_zero_std is 0.5
    (TRL's batch-wide value under scale_rewards="batch" would be 0)."""
    logged, seen = {}, []
    fn = make_reward_function(None, group_size=2, scorer=scorer, on_groups=lambda step, gs: seen.extend(gs))
    rewards = asyncio.run(fn([ADD.prompt] * 4, [RIGHT, RIGHT, RIGHT, WRONG], id=["add"] * 4, problem=[ADD.prompt] * 4,
                             tests=[ADD.tests] * 4, log_metric=logged.__setitem__))
    assert rewards[:3] == [1.0, 1.0, 1.0] and rewards[3] < 1
    assert [g.kind for g in seen] == ["too_easy", "mixed"]
    assert logged[METRIC_FRAC_ZERO_STD] == 0.5 and logged[METRIC_GROUP["too_easy"]] == 0.5
    record = StepRecord.from_logs(1, 1.0, {"loss": 0.0, "reward": 0.8, "frac_reward_zero_std": 0.0, **logged})
    assert metric_line(record).endswith("frac_zero_std=0.50")
    assert groups_line(record) == "[Groups] epoch 1.00  too_easy=0.50  too_hard=0.00  identical=0.00  mixed=0.50"


def test_sampler_draws_zero_variance_problems_less_and_uniformly_when_nothing_is_known(tmp_path):
    from trl.trainer.utils import RepeatSampler
    ids = [f"p{i}" for i in range(8)]
    tracker = ProblemTracker(low_weight=0.2)
    fresh = TrackedSampler(ids, tracker, mini_repeat_count=3, batch_size=2, repeat_count=1, seed=7)
    assert list(fresh)[:6] == list(RepeatSampler(ids, mini_repeat_count=3, batch_size=2, seed=7))[:6]
    tracker.update(0, [group_stat(p, [0.0, 0.0], [False] * 2, [False] * 2) for p in ids[:4]])  # too hard
    tracker.update(0, [group_stat(p, [0.0, 1.0], [False, True], [False, True]) for p in ids[4:]])  # mixed
    draws = Counter()
    sampler = TrackedSampler(ids, tracker, mini_repeat_count=1, batch_size=2, repeat_count=1, seed=0)
    for _ in range(250):
        draws.update(ids[i] for i in sampler.next_batch())
    hard, mixed = sum(draws[p] for p in ids[:4]), sum(draws[p] for p in ids[4:])
    # weight 0.2 against 1: a first draw is hard with probability 0.8 / 4.8 = 0.17, a second 0.21 (uniform: 0.5)
    assert hard + mixed == 500 and 0.12 < hard / 500 < 0.25


def test_tracker_records_survive_a_torn_line_and_a_replay(tmp_path):
    path = tmp_path / "reward_logs" / group_kinds.TRACKING_FILE
    t = ProblemTracker()
    t.open(path)
    t.update(3, [group_stat("a", [1.0, 1.0], [True] * 2, [True] * 2), group_stat("b", [0.0, 0.5], [False] * 2, [False, True])])
    t.close()
    with open(path, "a") as f:
        f.write('{"step": 4, "problem_id": "a", "ki')   # a crash mid-line
    again = ProblemTracker()
    assert again.load(path) == 2
    assert (again.state("a"), again.state("b"), again.state("c")) == ("too_easy", "mixed", "unseen")
    # a stray END marker's 0.05 makes the rewards differ, not teach: with the default threshold it is too hard
    noise = group_stat("d", [0.0, 0.05, 0.0, 0.0], [False] * 4, [False] * 4)
    judged = ProblemTracker(min_std=0.05, max_solved=0.9)
    judged.update(0, [noise])
    assert noise.kind == "mixed" and judged.state("d") == "too_hard" and judged.keep_probability("d") == 0.2
    again.open(path)   # the torn line is closed, later lines stay whole
    again.update(5, [group_stat("a", [0.0, 1.0], [False, True], [False, True])])
    again.close()
    assert ProblemTracker().load(path) == 3 and json.loads(path.read_text().splitlines()[-1])["step"] == 5


def test_report_counts_problem_states_over_time_and_the_selection(tmp_path):
    logs = tmp_path / "reward_logs"
    t = ProblemTracker(min_std=0.05, max_solved=0.9)
    t.open(logs / group_kinds.TRACKING_FILE)
    t.update(0, [group_stat("a", [0.0, 0.0], [False] * 2, [False] * 2), group_stat("b", [0.0, 1.0], [False, True], [False, True])])
    t.update(1, [group_stat("a", [0.0, 1.0], [False, True], [False, True])])  # too hard no more
    t.close()
    (tmp_path / "problem_selection.jsonl").write_text("".join(json.dumps(c) + "\n" for c in (
        {"id": "a", "ok": True}, {"id": "b", "ok": True}, {"id": "c", "ok": True}, {"id": "d", "ok": False, "reason": "too_easy"})))
    g = read_group_report(tmp_path, [], run_report.read_jsonl, run_report.drop_superseded)
    assert g.selection == {"kept": 3, "problems": 4, "dropped": {"too_easy": 1}}
    assert [(step, c["unseen"], c["too_hard"], c["mixed"]) for step, c in g.states] == [(0, 1, 1, 1), (1, 1, 0, 2)]
    md = "\n".join(render(g))
    assert "| 0 | 1 | 0 | 1 | 0 | 1 |" in md and "3 of 4 problems kept; dropped: too_easy 1." in md


@pytest.mark.slow
def test_train_selects_from_stats_and_tracking_survives_a_resume(tmp_path, cache_home):
    """train.py keeps exactly the learnable problems of a stats file (warning that it was probed with
    another model), and a resumed run replays the tracker's records before drawing."""
    env = run_env(tmp_path, cache_home, GRPO_MAX_STEPS="2", GRPO_SAVE_STEPS="2", GRPO_SCALE_REWARDS="batch")
    ids = [json.loads(l)["id"] for l in open(env["TRAINING_DATASET"])]
    sampling = {"model": "another-model", "adapter": None, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                "max_completion": 24, "reward": {}}
    rows = [stats_row(ids[0], 1.0, 0.0, 1.0, 1.0, "too_easy", sampling), stats_row(ids[1], 0.0, 0.0, 0.0, 0.0, "too_hard", sampling)]
    rows += [stats_row(i, 0.4, 0.3, 0.3, 0.5, "mixed", sampling) for i in ids[2:]]
    stats = tmp_path / "stats.jsonl"
    stats.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    env["GRPO_PROBLEM_STATS"] = str(stats)
    first = train(tmp_path, env)
    run = tmp_path / "run"
    assert "selection (GRPO_PROBLEM_STATS=" in first.stdout and "dropped 1 too_easy, 1 too_hard" in first.stdout
    assert "was probed with other settings than this run's (model: the file has \"another-model\"" in first.stdout
    chosen = [json.loads(l) for l in (run / "problem_selection.jsonl").read_text().splitlines()]
    assert [c["id"] for c in chosen if not c["ok"]] == ids[:2]
    tracked = read_jsonl(run / "reward_logs" / group_kinds.TRACKING_FILE)
    assert [e["step"] for e in tracked] == [0, 0, 1, 1] and not {e["problem_id"] for e in tracked} & set(ids[:2])
    # under batch scaling too, learning.log's frac_zero_std is the per-group share: 1 - mixed on the [Groups] line
    lines = log_lines(run)
    pairs = [(a, b) for a, b in zip(lines, lines[1:]) if a.startswith("[Epoch") and b.startswith("[Groups] ")]
    assert len(pairs) == 2 and json.loads((run / "config.json").read_text())["GRPO_SCALE_REWARDS"] == "batch"
    for metric, kinds in pairs:
        mixed = float(kinds.split("mixed=")[1])
        assert metric.endswith(f"frac_zero_std={1 - mixed:.2f}")

    second = train(tmp_path, {**env, "GRPO_MAX_STEPS": "3"})
    assert "resume from: " + str(run / "checkpoint-2") in second.stdout
    assert "problem tracking: 4 groups replayed" in second.stdout
    tracked = read_jsonl(run / "reward_logs" / group_kinds.TRACKING_FILE)
    assert [e["step"] for e in tracked] == [0, 0, 1, 1, 2, 2]
    # the resumed process knows the first session's problems too: its final states are all six groups'
    last = {e["problem_id"]: e["state"] for e in tracked}
    counts = Counter(last.values())
    assert "problem states at the end: unseen=%d  " % (len(ids) - 2 - len(last)) + "  ".join(
        f"{k}={counts[k]}" for k in group_kinds.KINDS) in second.stdout

