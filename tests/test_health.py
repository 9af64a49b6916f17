"""The health rules themselves (ocaml_grpo/training/health.py), and one verdict from both of their users:
train.py's live monitor (callbacks.LearningLog, fed the logs a real trainer would pass it) and
analyze.py's report (on the learning.log that monitor wrote). No training run needed."""
import json

import pytest
from transformers import TrainerControl, TrainerState

import analyze
from ocaml_grpo.report import run_report
import rewards
from ocaml_grpo.jsonl import read_jsonl
from ocaml_grpo.training import health
from ocaml_grpo.training.learning_log import render
from ocaml_grpo.training.metrics import METRICS_FILE, StepRecord
from ocaml_grpo.training.callbacks import LearningLog


def point(epoch: float, reward=None, reward_std=None, fzs=None, entropy=None, grad=None, loss=None) -> StepRecord:
    """A log step as the rules read it, with only what they judge."""
    return StepRecord(0, epoch, reward=reward, reward_std=reward_std, frac_zero_std=fzs, entropy=entropy,
                      grad_norm=grad, loss=loss)


def flat(reward: float, n: int = 24, until: float = 1.5, fzs: float = 0.05) -> list[StepRecord]:
    return [point(round(until * (i + 1) / n, 4), reward, 0.2 * reward, fzs, 0.15, 0.05, 0.01) for i in range(n)]


def by_name(verdict: health.StopVerdict) -> dict[str, str]:
    return {c.name: c.status for c in verdict.checks}


def test_expected_trajectory_interpolates_and_stays_flat_after_epoch_one():
    assert health.expected_reward(0.0) == 0.05
    assert health.expected_reward(0.15) == pytest.approx(0.10)
    assert health.expected_reward(0.5) == pytest.approx(0.30)
    assert health.expected_reward(0.75) == pytest.approx(0.325)
    assert health.expected_reward(1.0) == health.expected_reward(3.0) == pytest.approx(0.35)


def test_trend_is_a_least_squares_fit_over_the_whole_log():
    assert health.reward_trend([0.1, 0.2]) == ("unknown", 0.0)
    label, delta = health.reward_trend([0.1, 0.2, 0.3, 0.4])
    assert label == "rising" and delta == pytest.approx(0.3)
    assert health.reward_trend([0.5, 0.49, 0.51, 0.5])[0] == "flat"
    assert health.reward_trend([0.5, 0.4, 0.3])[0] == "falling"
    # one outlier at the end does not make a flat run rise: the fit weighs every line
    assert health.reward_trend([0.3] * 20 + [0.35])[0] == "flat"


def test_plateau_on_target_is_not_a_stop():
    verdict = health.stop_verdict(flat(0.70), passes_share=0.4)
    assert verdict.evaluable and not verdict.stop
    assert by_name(verdict)["flat or falling reward trend below the expected reward"] == "ok"
    assert verdict.summary() == "CONTINUE (no stop criterion met)"


def test_flat_below_the_trajectory_is_a_stop():
    verdict = health.stop_verdict(flat(0.25), passes_share=0.1)  # flat, 0.25 < 0.35 expected at epoch 1.5
    assert verdict.stop and [c.name for c in verdict.failing] == ["flat or falling reward trend below the expected reward"]
    assert verdict.summary().startswith("STOP (flat or falling reward trend")


def test_each_stop_criterion_and_unknowns():
    low = health.stop_verdict(flat(0.05, fzs=0.5), passes_share=0.0)
    assert by_name(low) == {"mean reward < 0.15": "failing", "frac_zero_std > 0.3": "failing",
                            "no test passes seen": "failing",
                            "flat or falling reward trend below the expected reward": "failing"}
    assert "recent mean 0.050" in low.reasons and "0.0% of completions pass ≥ 1 test" in low.reasons
    unknown = health.stop_verdict(flat(0.05, n=2), passes_share=None)
    assert by_name(unknown)["no test passes seen"] == "unknown"
    assert by_name(unknown)["flat or falling reward trend below the expected reward"] == "unknown"
    early = health.stop_verdict(flat(0.05, until=0.9), passes_share=0.0)
    assert not early.evaluable and not early.stop and early.failing
    assert early.summary().startswith("not yet evaluable (epoch 0.9 < 1)")
    assert health.stop_verdict([], None).summary() == "not yet evaluable (epoch 0 < 1); currently failing: none"


def test_findings_on_the_recent_window():
    healthy = flat(0.70)
    assert health.findings(healthy) == []
    keys = lambda pts: {f.key: f.severity for f in health.findings(pts)}  # noqa: E731
    # one noisy step of 2 identical groups out of 4 is not a collapse; three in a row are
    assert "zero_std" not in keys(healthy[:-1] + [point(1.5, 0.7, 0.14, 0.5, 0.15, 0.05)])
    collapsed = healthy[:-3] + [point(1.5, 0.7, 0.14, 0.5, 0.15, 0.05)] * 3
    assert keys(collapsed)["zero_std"] == "critical"
    assert keys(healthy[:-10] + [point(1.5, 0.7, 0.14, 0.15, 0.15, 0.05)] * 10)["zero_std"] == "warning"
    assert keys(flat(0.30))["reward"] == "warning" and keys(flat(0.10))["reward"] == "critical"
    assert keys(healthy + [point(1.6, 0.7, 0.14, 0.0, 0.01, 0.05)] * 10)["entropy"] == "critical"
    assert keys(healthy[:-1] + [point(1.5, 0.7, 0.14, 0.0, 0.25, 0.05)])["entropy"] == "warning"
    # the entropy finding is named by what is wrong with it
    title = lambda pts: {f.key: f.title for f in health.findings(pts)}["entropy"]  # noqa: E731
    assert title(healthy + [point(1.6, 0.7, 0.14, 0.0, 0.08, 0.05)] * 10) == "Low entropy"  # steady, below
    assert title(healthy + [point(1.6, 0.7, 0.14, 0.0, 0.25, 0.05)] * 10) == "High entropy"
    swinging = healthy + [point(1.6 + i / 100, 0.7, 0.14, 0.0, (0.12, 0.19, 0.30)[i % 3], 0.05) for i in range(9)]
    assert title(swinging) == "Unstable entropy"
    assert keys(flat(0.70) + [point(1.6, 0.7, 0.5, 0.0, 0.15, 0.05)] * 10)["cv"] == "info"  # the batch's spread
    assert keys(healthy + [point(1.6, 0.7, 0.14, 0.0, 0.15, 0.9)])["grad"] == "warning"
    assert keys(healthy + [point(1.6, 0.7, 0.14, 0.0, 0.15, float("nan"), float("nan"))])["nonfinite"] == "critical"


# ---------------------------------------------------------------------------------------------
# One verdict from both users of the rules.

def trl_logs(p: StepRecord, passes: float, crashed: float = 0.0) -> dict:
    """What TRL 1.16 hands on_log at a log step, reward metrics included."""
    return {"loss": p.loss, "grad_norm": p.grad_norm, "learning_rate": 5e-6, "reward": p.reward, "reward_std": p.reward_std,
            "rewards/syntax_aware_reward/mean": p.reward, "rewards/syntax_aware_reward/std": p.reward_std,
            "entropy": p.entropy, "frac_reward_zero_std": p.frac_zero_std, "epoch": p.epoch,
            rewards.METRIC_PASSED_ANY: passes, rewards.METRIC_CRASHED: crashed}


def monitor(tmp_path, points: list[StepRecord], passes: float, crashed: float = 0.0) -> tuple[TrainerControl, list[str]]:
    run = tmp_path / "run"
    run.mkdir()
    log = LearningLog(run / "learning.log", ["# started"], resumed=False, auto_stop=True, curriculum=None)
    state, control = TrainerState(), TrainerControl()
    log.on_train_begin(None, state, control)
    for step, p in enumerate(points, 1):
        state.global_step = step
        control = log.on_log(None, state, control, logs=trl_logs(p, passes, crashed))
        if control.should_training_stop:
            break
    log.on_train_end(None, state, control)
    return control, (run / "learning.log").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("reward,stops", [(0.70, False), (0.10, True)])
def test_live_monitor_and_report_agree(tmp_path, reward, stops):
    points = flat(reward, n=24, until=1.5)
    control, lines = monitor(tmp_path, points, passes=0.3)
    assert control.should_training_stop is stops
    assert any(l.startswith("[Stop] ") for l in lines) is stops
    # the report reads the log the monitor wrote (cut where the monitor stopped)
    (tmp_path / "run" / "config.json").write_text(json.dumps({"GRPO_TEMPERATURE": 0.9}))
    report = analyze.analyze(tmp_path / "run")
    assert report.stop_verdict.startswith("STOP" if stops else "CONTINUE"), report.stop_verdict
    assert ("Stop criteria met" in {f.title for f in report.findings}) is stops
    if not stops:
        assert report.status == "green" and not any(l.startswith("[Health]") for l in lines)


def test_monitor_reads_crashes_and_test_passes_from_the_logged_metrics(tmp_path):
    # no test passes reported by the reward: a stop at epoch 1.0 even with rewards on target
    control, lines = monitor(tmp_path, flat(0.70, n=12, until=1.2), passes=0.0, crashed=0.25)
    assert control.should_training_stop
    [stop] = [l for l in lines if l.startswith("[Stop] ")]
    assert stop.startswith("[Stop] no test passes seen (0.0% of completions pass ≥ 1 test) at epoch 1.00")
    assert lines.count("[Health] grading crashed on 25.0% of the completions scored since the last log "
                       "(reward None: left out of the group baseline; see first_error in the breakdown log and "
                       "stderr)") == 10  # every log step up to the stop at epoch 1.0


def test_learning_log_is_rendered_from_the_records_and_the_report_reads_them(tmp_path):
    """metrics.jsonl holds every log step; learning.log's lines after its `#` lines are those records
    rendered, byte for byte; analyze.py needs nothing else (learning.log deleted), and reads the
    unrounded values the monitor judged."""
    import pandas as pd
    control, lines = monitor(tmp_path, flat(0.10, n=24, until=1.5), passes=0.3, crashed=0.1)
    run = tmp_path / "run"
    records = [StepRecord.from_json(r) for r in read_jsonl(run / METRICS_FILE)[0]]
    assert len(records) == 16 and records[-1].notes[-1].startswith("[Stop] ")  # stopped at epoch 1.0
    live = b"".join(l for l in (run / "learning.log").read_bytes().splitlines(keepends=True) if not l.startswith(b"#"))
    assert "".join(line + "\n" for line in render(records)).encode() == live
    from_log = analyze.analyze(run)
    (run / "learning.log").unlink()
    report = analyze.analyze(run)
    assert (report.status, report.stop_verdict) == (from_log.status, from_log.stop_verdict)
    assert report.stop_verdict.startswith("STOP")
    assert [l.epoch for l in report.lines] == [p.epoch for p in flat(0.10, n=24, until=1.5)[:16]]  # 0.0625, ..., 1.0
    assert [run_report.shown(l) for l in report.lines] == [l for l in lines if l.startswith("[Epoch ")]
    table = pd.read_json(run / METRICS_FILE, lines=True)
    assert list(table["step"]) == list(range(1, 17)) and table["reward"].iloc[0] == 0.10


def test_an_engine_that_drifts_from_the_trainer_is_reported_from_its_logged_record():
    """GRPO_ENGINE=llamacpp: TRL's ratio and gap and our masked share go from the trainer's logs into
    metrics.jsonl, the [Engine] line and the health rule; a run without the engine has none of them."""
    def record(gap: float, clipped: float, step: int) -> StepRecord:
        return StepRecord.from_logs(step, step / 10, {
            "loss": 0.0, "reward": 0.3, "sampling/importance_sampling_ratio/mean": 0.98,
            "sampling/importance_sampling_ratio/clipped_share": clipped, "sampling/sampling_logp_difference/mean": gap})

    healthy = [record(0.03, 0.0, i) for i in range(1, 6)]
    drifted = healthy + [record(0.25, 0.125, i) for i in range(6, 11)]
    for records, expected in ((healthy, False), (drifted, True)):
        back = [StepRecord.from_json(json.loads(json.dumps(r.to_json()))) for r in records]  # metrics.jsonl and back
        assert back == records and back[-1].engine == records[-1].engine
        assert any(line.startswith("[Engine] epoch") and "clipped_share=" in line for line in render(back))
        points = back
        found = [f for f in health.findings(points) if f.key == "engine"]
        assert bool(found) == expected, found
    assert "engine_logp_gap" in healthy[0].to_json()
    plain = StepRecord.from_logs(1, 0.1, {"loss": 0.0, "reward": 0.3})
    assert plain.engine is None and not any(k.startswith("engine_") for k in plain.to_json())
    assert not any(line.startswith("[Engine]") for line in render([plain]))


def test_a_run_drifting_toward_stubs_is_reported_from_its_logged_record(tmp_path):
    """The reward function's stub share (`ocaml/stub`: answers whose calls never returned a value)
    goes into metrics.jsonl as `stub`, the health rule and analyze.py's table; 5% is fine, 40% is
    a drift."""
    def record(share: float, step: int) -> StepRecord:
        return StepRecord.from_logs(step, step / 10, {"loss": 0.0, "reward": 0.3, "ocaml/stub": share})

    steady = [record(0.05, i) for i in range(1, 11)]
    drifting = steady + [record(0.4, i) for i in range(11, 21)]
    for records, expected in ((steady, False), (drifting, True)):
        back = [StepRecord.from_json(json.loads(json.dumps(r.to_json()))) for r in records]  # metrics.jsonl and back
        assert back == records and back[-1].stub == records[-1].stub
        points = back
        found = [f for f in health.findings(points) if f.key == "stub"]
        assert bool(found) == expected, found
        if expected:
            assert "40%" in found[0].detail and "5% in the run's first 10 lines" in found[0].detail
    assert StepRecord.from_logs(1, 0.1, {"loss": 0.0, "reward": 0.3}).stub is None  # not logged: not judged
    # a run resumed from a version that did not log it: judged on what it logged, no early share
    unlogged = [StepRecord.from_logs(i, i / 10, {"loss": 0.0, "reward": 0.3}) for i in range(1, 11)]
    [found] = [f for f in health.findings(unlogged + drifting[10:]) if f.key == "stub"]
    assert "40%" in found.detail and "not logged early in the run" in found.detail


def test_a_run_drifting_toward_constant_answers_is_reported_from_its_logged_record():
    """`ocaml/constant` (answers that gave back one value for different arguments and failed an
    assertion) goes into metrics.jsonl as `constant`, its health rule and analyze.py's table."""
    def record(share: float, step: int) -> StepRecord:
        return StepRecord.from_logs(step, step / 10, {"loss": 0.0, "reward": 0.3, "ocaml/constant": share})

    steady = [record(0.02, i) for i in range(1, 11)]
    drifting = steady + [record(0.9, i) for i in range(11, 21)]
    for records, expected in ((steady, False), (drifting, True)):
        back = [StepRecord.from_json(json.loads(json.dumps(r.to_json()))) for r in records]
        assert back == records and back[-1].constant == records[-1].constant
        found = [f for f in health.findings(back) if f.key == "constant"]
        assert bool(found) == expected, found
        if expected:
            assert "90%" in found[0].detail and "2% in the run's first 10 lines" in found[0].detail
    assert not [f for f in health.findings(drifting) if f.key == "stub"]  # one drift is not the other
