"""The training-health rules, once: thresholds, the expected reward trajectory, the reward trend,
the findings judged on the logged metrics, and the stop criteria.

train.py's live monitor (callbacks.LearningLog, on every log step) and analyze.py's report (on a
run directory) both call these functions on the same points, so they cannot disagree: a run
that is red and STOP in the report is stopped by the monitor, and a run the monitor lets go on
is not told to stop by the report. Pure functions, no I/O, no torch.

Sources: the seed analysis (../shared/seed/training-analysis-epoch-0.28.md): its healthy bands,
its expected trajectory and its stop criteria, with the readings noted at each threshold.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from ocaml_grpo.training.metrics import StepRecord


@dataclass(frozen=True)
class Thresholds:
    zero_std_healthy: float = 0.10      # frac_zero_std below this is healthy
    zero_std_critical: float = 0.30     # rolling mean reaching this -> mode collapse (red)
    zero_std_smooth: int = 3            # lines in that rolling mean: one 2-of-4-groups step is noise
    entropy_low: float = 0.10
    entropy_high: float = 0.20
    entropy_swing_max: float = 0.10     # max - min in the recent window above this -> unstable
    entropy_collapse: float = 0.03      # recent mean below this -> critical
    grad_low: float = 0.01
    grad_high: float = 0.5
    cv_max: float = 0.30                # reward std / mean
    # Expected mean reward by epoch, interpolated (seed's trajectory; 0.30 at 0.5 is its stricter
    # value), flat after the last point.
    reward_trajectory: tuple = ((0.0, 0.05), (0.3, 0.15), (0.5, 0.30), (1.0, 0.35))
    reward_far_below: float = 0.5       # recent mean < this x expected -> critical
    test_pass_share_1_0: float = 0.10   # "regular test passes 10-20%" at epoch 1.0
    stop_epoch: float = 1.0
    stop_reward: float = 0.15
    stop_zero_std: float = 0.30
    trend_flat_delta: float = 0.02      # |fitted reward change over the log| below this -> flat
    runaway_share_max: float = 0.20
    gated_share_max: float = 0.20
    max_temperature: float = 1.3        # don't advise raising temperature past this: code turns to noise
    checkpoint_window: float = 0.05     # lines within +-this of a checkpoint epoch are judged
    recent_lines: int = 10              # the "recent window": the last this many log lines
    # GRPO_ENGINE=llamacpp: the engine's sampling policy and the trainer's are one policy in two
    # implementations; past these the rollouts are no longer the trainer's own
    engine_gap_max: float = 0.10        # recent mean per-token |logp gap|
    engine_clipped_max: float = 0.05    # recent mean share of importance ratios masked or clipped
    # A stub (`failwith "todo"`) earns the type-check, compile and END credit, 0.35 by the seed's
    # weights: more than an honest attempt with one type error (0.15). Past this, the policy may be
    # learning to stub.
    stub_max: float = 0.10              # recent mean share of answers whose calls never returned a value
    # An answer that returns one of the prompt's example outputs whatever it is asked passes the
    # assertions expecting that value: 0.43-0.57 by the seed's weights with the line gate off (attempt
    # 6 drifted there: 1-4% of the answers early, 21-26% at steps 110-129, 86-90% at the end). A
    # wrong answer that ignores its input (`bst_member` always false) counts too: attempt 7 saw up
    # to 9% of those in a window of honest answers, hence the margin.
    constant_max: float = 0.20          # recent mean share of answers that gave back one value for different arguments


THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Finding:
    key: str                            # stable id: the live monitor repeats a persisting one sparingly
    title: str
    severity: str                       # info / warning / critical
    detail: str


@dataclass(frozen=True)
class Check:
    name: str
    status: str                         # met / not met / failing / ok / not yet reached / unknown
    detail: str


# A NaN loss or gradient norm is itself a finding; elsewhere it stands for a metric not logged.
NAN_IS_A_VALUE = ("loss", "grad_norm")


def values(points: Sequence[StepRecord], attr: str) -> list[float]:
    """The logged values of `attr` (a StepRecord field or property) over the points."""
    return [v for p in points if (v := logged(p, attr)) is not None]


def logged(point: StepRecord, attr: str) -> float | None:
    v = getattr(point, attr)
    return None if v is None or (attr not in NAN_IS_A_VALUE and math.isnan(v)) else v


def mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def recent(points: Sequence[StepRecord], th: Thresholds = THRESHOLDS) -> Sequence[StepRecord]:
    return points[-th.recent_lines:]


def expected_reward(epoch: float, th: Thresholds = THRESHOLDS) -> float:
    pts = th.reward_trajectory
    for (e0, r0), (e1, r1) in zip(pts, pts[1:]):
        if epoch <= e1:
            return r0 + (r1 - r0) * max(0.0, epoch - e0) / (e1 - e0)
    return pts[-1][1]


def reward_trend(rewards: Sequence[float], th: Thresholds = THRESHOLDS) -> tuple[str, float]:
    """Least-squares slope over log-line index -> (rising/flat/falling, fitted change over the log)."""
    n = len(rewards)
    if n < 3:
        return "unknown", 0.0
    xm, ym = (n - 1) / 2, statistics.fmean(rewards)
    slope = sum((i - xm) * (y - ym) for i, y in enumerate(rewards)) / sum((i - xm) ** 2 for i in range(n))
    delta = slope * (n - 1)
    return ("rising" if delta > th.trend_flat_delta else "falling" if delta < -th.trend_flat_delta
            else "flat"), delta


def zero_std_rolled(recent_fzs: Sequence[float], th: Thresholds = THRESHOLDS) -> float | None:
    """Peak of the `zero_std_smooth`-line rolling mean of frac_zero_std."""
    if not recent_fzs:
        return None
    k = min(th.zero_std_smooth, len(recent_fzs))
    return max(statistics.fmean(recent_fzs[i:i + k]) for i in range(len(recent_fzs) - k + 1))


# ----------------------------------------------------------------------------- findings

def findings(points: Sequence[StepRecord], th: Thresholds = THRESHOLDS) -> list[Finding]:
    """Every rule judged on the logged metrics: non-finite values and the grad band over the whole
    log, entropy, reward level, reward variance and reward diversity over the recent window."""
    out: list[Finding] = []
    add = lambda key, title, severity, detail: out.append(Finding(key, title, severity, detail))  # noqa: E731
    if not points:
        return out
    win, epoch = recent(points, th), points[-1].epoch

    # Policy-gradient loss oscillates around 0 by design; only non-finite values matter.
    nonfinite = [k for k, attr in (("loss", "loss"), ("grad", "grad_norm"))
                 if any(not math.isfinite(v) for v in values(points, attr))]
    if nonfinite:
        add("nonfinite", "Non-finite loss/grad", "critical", f"NaN/inf seen in: {', '.join(nonfinite)}.")

    grad = [g for g in values(points, "grad_norm") if math.isfinite(g)]
    if grad and not (th.grad_low <= min(grad) and max(grad) <= th.grad_high):
        add("grad", "Gradient norm outside band", "warning",
            f"grad norm {min(grad):.4f} - {max(grad):.4f}, expected {th.grad_low} - {th.grad_high}.")

    r_ent = values(win, "entropy")
    if r_ent and mean(r_ent) < th.entropy_collapse:
        add("entropy", "Entropy collapse", "critical", f"recent mean entropy {mean(r_ent):.3f} < {th.entropy_collapse}.")
    elif r_ent:
        out_band = [v for v in r_ent if not th.entropy_low <= v <= th.entropy_high]
        swing = max(r_ent) - min(r_ent)
        if out_band or swing > th.entropy_swing_max:
            # named by what is wrong: a steady entropy below the band is low, not unstable
            title = ("Unstable entropy" if swing > th.entropy_swing_max else
                     "Low entropy" if max(r_ent) < th.entropy_low else
                     "High entropy" if min(r_ent) > th.entropy_high else "Entropy outside its band")
            add("entropy", title, "warning", f"recent entropy {min(r_ent):.3f} - {max(r_ent):.3f} "
                f"(swing {swing:.3f}); {len(out_band)}/{len(r_ent)} values outside {th.entropy_low}-{th.entropy_high}.")

    exp_r, r_mean = expected_reward(epoch, th), mean(values(win, "reward"))
    if r_mean is not None and r_mean < exp_r:
        trend, delta = reward_trend(values(points, "reward"), th)
        add("reward", "Low absolute rewards", "critical" if r_mean < th.reward_far_below * exp_r else "warning",
            f"recent mean reward {r_mean:.3f} vs expected ≥ {exp_r:.3f} at epoch {epoch:g}; "
            f"fitted trend over the log: {trend} ({delta:+.3f}).")

    r_cv, all_cv = reward_cvs(win), reward_cvs(points)
    if r_cv and statistics.median(r_cv) > th.cv_max:
        # Information, not a warning: the batch's spread across problems (a 0-or-1 reward on mixed
        # problems is spread by nature); what GRPO learns from is the spread within groups (frac_zero_std).
        add("cv", "High reward variance", "info", f"reward CV {min(all_cv):.0%} - {max(all_cv):.0%} (recent "
            f"median {statistics.median(r_cv):.0%}), above {th.cv_max:.0%}. This is the batch spread across "
            "problems; the within-group spread is what GRPO learns from.")

    r_z = values(win, "frac_zero_std")
    rolled = zero_std_rolled(r_z, th)
    if rolled is not None and rolled >= th.zero_std_critical:
        add("zero_std", "Mode collapse", "critical", f"frac_zero_std peaked at {max(r_z):.2f} in the last {len(r_z)} "
            f"lines; its {min(th.zero_std_smooth, len(r_z))}-line rolling mean reached {rolled:.2f} "
            f"(≥ {th.zero_std_critical}). That share of GRPO groups got identical rewards: zero advantage, "
            "no learning signal.")
    elif r_z and mean(r_z) >= th.zero_std_healthy:
        add("zero_std", "Low reward diversity", "warning", f"recent mean frac_zero_std {mean(r_z):.2f} "
            f"≥ {th.zero_std_healthy}.")

    r_gap, r_clip = values(win, "logp_gap"), values(win, "clipped_share")
    if (r_gap and mean(r_gap) > th.engine_gap_max) or (r_clip and mean(r_clip) > th.engine_clipped_max):
        add("engine", "Engine and trainer drifted apart", "warning",
            f"recent mean per-token |logp gap| {mean(r_gap) if r_gap else float('nan'):.3f} (healthy ≤ "
            f"{th.engine_gap_max}), importance ratios masked or clipped {mean(r_clip) if r_clip else float('nan'):.1%} "
            f"(healthy ≤ {th.engine_clipped_max:.0%}): the llama.cpp engine no longer samples the trainer's policy "
            "(a stale adapter, or a quantization too coarse for it); the bound drops those samples from the loss.")
    def drift(key: str, limit: float) -> str | None:
        """The recent share of answers flagged `key`, against the run's first lines, when past `limit`."""
        recent = values(win, key)
        if not recent or mean(recent) <= limit:
            return None
        first = values(points[:th.recent_lines], key)
        # (a run resumed from a version that did not log it has no early share to compare with)
        early = f"{mean(first):.0%} in the run's first {len(first)} lines" if first else "not logged early in the run"
        return f"recent mean {mean(recent):.0%} of the answers ({early}; healthy ≤ {limit:.0%})"

    if said := drift("stub", th.stub_max):
        add("stub", "Drift toward stubs", "warning",
            f"{said} only raise or never return (their tests ran and no call returned a value). A stub "
            "earns the type-check, compile and END credit, more than an honest attempt with one type "
            "error: read reward_logs (`stub`) and weigh REWARD_WEIGHT_TESTS up.")
    if said := drift("constant", th.constant_max):
        add("constant", "Drift toward constant answers", "warning",
            f"{said} gave back one value whatever their arguments, and failed an assertion (a wrong "
            "answer that ignores its input counts too). Such an answer earns no test credit, but keeps "
            "its type-check, compile and END credit, more than an honest attempt with a type error: "
            "read reward_logs (`constant`) and weigh REWARD_WEIGHT_TESTS up.")
    return out


def reward_cvs(points: Sequence[StepRecord]) -> list[float]:
    return [std / reward for p in points
            if (reward := logged(p, "reward")) and (std := logged(p, "reward_std")) is not None]


# ----------------------------------------------------------------------------- stop criteria

@dataclass(frozen=True)
class StopVerdict:
    epoch: float
    checks: list[Check]
    evaluable: bool                     # the criteria apply from th.stop_epoch on

    @property
    def failing(self) -> list[Check]:
        return [c for c in self.checks if c.status == "failing"]

    @property
    def stop(self) -> bool:
        return self.evaluable and bool(self.failing)

    @property
    def reasons(self) -> str:
        return "; ".join(f"{c.name} ({c.detail})" for c in self.failing)

    def summary(self, th: Thresholds = THRESHOLDS) -> str:
        names = "; ".join(c.name for c in self.failing)
        if self.evaluable:
            return f"STOP ({names})" if names else "CONTINUE (no stop criterion met)"
        return f"not yet evaluable (epoch {self.epoch:g} < {th.stop_epoch:g}); currently failing: {names or 'none'}"


def stop_verdict(points: Sequence[StepRecord], passes_share: float | None, th: Thresholds = THRESHOLDS) -> StopVerdict:
    """The seed's stop criteria ("Stop if at epoch 1.0"): any one failing at/after stop_epoch
    means STOP. `passes_share`: the share of scored completions that passed at least one test
    (None: unknown).

    A flat trend counts only while the reward is below the expected trajectory: the seed's
    criterion is about a run that is not improving towards its targets, and a run flat at 0.70
    past epoch 1.0 (the trajectory asks 0.35) has reached them; it is a plateau, not a failure."""
    win = recent(points, th)
    epoch = points[-1].epoch if points else 0.0
    r_mean, z_mean = mean(values(win, "reward")), mean(values(win, "frac_zero_std"))
    trend, delta = reward_trend(values(points, "reward"), th)
    exp_r = expected_reward(epoch, th)
    state = lambda bad: "unknown" if bad is None else "failing" if bad else "ok"  # noqa: E731
    checks = [
        Check(f"mean reward < {th.stop_reward}", state(None if r_mean is None else r_mean < th.stop_reward),
              "no data" if r_mean is None else f"recent mean {r_mean:.3f}"),
        Check(f"frac_zero_std > {th.stop_zero_std}", state(None if z_mean is None else z_mean > th.stop_zero_std),
              "no data" if z_mean is None else f"recent mean {z_mean:.2f}"),
        Check("no test passes seen", state(None if passes_share is None else passes_share == 0),
              "unknown" if passes_share is None else f"{passes_share:.1%} of completions pass ≥ 1 test"),
        Check("flat or falling reward trend below the expected reward",
              state(None if trend == "unknown" or r_mean is None else trend != "rising" and r_mean < exp_r),
              f"{trend} (fitted change {delta:+.3f})"
              + ("" if r_mean is None else f"; recent mean {r_mean:.3f} vs {exp_r:.3f} expected")),
    ]
    return StopVerdict(epoch, checks, epoch >= th.stop_epoch)
