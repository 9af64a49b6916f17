"""Training-health report for a GRPO run: the hand-written epoch-0.28 analysis, computed from data.

Usage:  python analyze.py [RUN_DIR]          (default: grpo_runs)

Reads RUN_DIR/learning.log (required; missing -> exit 2), and when present
reward_logs/syntax_aware_breakdown.jsonl, config.json and dataset_audit.jsonl. Writes
RUN_DIR/analysis.md and RUN_DIR/plots/*.png and prints the executive summary. Safe while training
still writes: an unterminated last line of learning.log and unparsable .jsonl lines are skipped.

Status rule (every threshold lives in THRESHOLDS below):
  red    - any critical finding: mode collapse (the `zero_std_smooth`-line rolling mean of
           frac_zero_std reaches `zero_std_critical` in the recent window), recent mean reward below
           `reward_far_below` x the expected reward for the epoch, entropy collapse, non-finite
           loss/grad, or the stop criteria met at/after `stop_epoch`;
  yellow - any warning: reward diversity, reward level or variance, entropy, grad norm, runaway or
           gated share outside band, no test passes by epoch 0.5;
  green  - otherwise. Informational findings (the learning-rate schedule, audit failures) never
           change the status. "Recent window" = the last `recent_lines` metric lines.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path


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
    # Expected mean reward by epoch, interpolated (seed's trajectory; 0.30 at 0.5 is its stricter value).
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
    recent_lines: int = 10


THRESHOLDS = Thresholds()
ICON = {"ok": "✅", "info": "ℹ️", "warning": "⚠️", "critical": "🔴"}
STATUS_ICON = {"green": "🟢", "yellow": "🟡", "red": "🔴"}
RUNAWAY, GATED, PASS_ANY = "runaway (no END at max length)", "gated (MIN_NON_EMPTY_LINES)", "passes some tests"

# ----------------------------------------------------------------------------- results


@dataclass
class LogLine:
    epoch: float
    raw: str
    values: dict[str, float]            # reward=0.1±0.07 -> values["reward"], values["reward_std"]
    text: dict[str, str] = field(default_factory=dict)   # non-numeric extra fields, kept as-is


@dataclass
class MetricRange:
    name: str
    lo: float | None
    hi: float | None
    expected: str
    assessment: str
    level: str                          # ok / info / warning / critical
    fmt: str = ".3f"


@dataclass
class Finding:
    title: str
    severity: str                       # info / warning / critical
    detail: str


@dataclass
class Action:
    var: str
    value: str
    reason: str

    @property
    def line(self) -> str:
        return f"export {self.var}={self.value}"


@dataclass
class Check:
    name: str
    status: str                         # met / not met / failing / ok / not yet reached / unknown
    detail: str


@dataclass
class BreakdownStats:
    n: int
    groups: int                         # GRPO groups = distinct (step, problem_id)
    problems: int
    shares: dict[str, float]            # share of completions with END marker, compiling, ...
    component_means: dict[str, float]
    zero_var_groups: int                # groups whose completions all got the same reward
    zero_var_all_zero: int              # ... of which every completion scored 0
    zero_var_unsolved: int              # ... of which the problem never passed any test
    top_errors: list[tuple[str, int]]
    error_kinds: dict[str, int]
    never_solved: list[str]             # no completion passed all tests
    never_passed_any: list[str]
    per_step: dict[int, dict[str, float]]   # step -> component means (plot)
    passes_by_epoch: list[tuple[float, bool]]  # (epoch, tests_passed > 0) per completion


@dataclass
class Report:
    run_dir: Path
    status: str                         # green / yellow / red
    recommendation: str
    epoch: float                        # latest logged epoch (0.0 with no lines)
    header: list[str]
    lines: list[LogLine]
    skipped_lines: int
    config: dict
    lr_schedule: str
    reward_trend: str
    ranges: list[MetricRange]
    findings: list[Finding]
    actions: list[Action]
    stop_verdict: str
    stop_checks: list[Check]
    checkpoints: list[Check]
    breakdown: BreakdownStats | None
    audit: dict | None                  # {"problems", "failed", "reasons"}
    bad_records: int = 0                # unparsable jsonl lines (e.g. a half-written last record)

# ----------------------------------------------------------------------------- parsing

METRIC_RE = re.compile(r"^\[Epoch\s+([-+0-9.eE]+)\]\s+(.*)$")
FIELD_RE = re.compile(r"^([A-Za-z_][\w.]*)=(.*)$")


def parse_learning_log(path: Path) -> tuple[list[str], list[LogLine], int]:
    """Return (header lines, metric lines, skipped malformed/truncated metric lines)."""
    raw_lines = Path(path).read_text(encoding="utf-8", errors="replace").split("\n")
    # The trainer writes whole lines; text after the last "\n" is a line still being written.
    skipped = 1 if raw_lines[-1].strip() else 0
    header, out = [], []
    for raw in raw_lines[:-1]:
        raw = raw.rstrip("\r")
        if raw.startswith("#"):
            header.append(raw)
            continue
        m = METRIC_RE.match(raw.strip())
        if not m:                       # [Health], [Stop], blank and other lines are not metrics
            continue
        values, text = {}, {}
        try:
            for tok in m.group(2).split():
                if not (fm := FIELD_RE.match(tok)):
                    raise ValueError(tok)   # e.g. a token cut in half
                key, val = fm.groups()
                if "±" in val:
                    mean, std = val.split("±", 1)
                    values[key], values[key + "_std"] = float(mean), float(std)
                elif re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf)", val, re.I):
                    values[key] = float(val)
                else:
                    text[key] = val
            out.append(LogLine(float(m.group(1)), raw, values, text))
        except ValueError:
            skipped += 1
    return header, out, skipped


def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """Return (records, unparsable line count); a half-written line is counted, never fatal."""
    recs, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(obj, dict):
                    recs.append(obj)
    return recs, bad


def drop_superseded(items: list, position) -> list:
    """A run killed and resumed from a checkpoint redoes the steps after it, so the logs hold
    them twice; when the position (epoch, step) goes back, the later copy replaces the earlier."""
    out: list = []
    for item in items:
        pos = position(item)
        if out and pos < position(out[-1]):
            out = [x for x in out if position(x) < pos]
        out.append(item)
    return out


def cfg_float(config: dict, key: str) -> float | None:
    try:
        return float(config[key])
    except (KeyError, TypeError, ValueError):
        return None


def series(lines: list[LogLine], key: str) -> list[float]:
    return [l.values[key] for l in lines if key in l.values]


def mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None

# ----------------------------------------------------------------------------- breakdown log


def normalize_error(msg: str | None) -> str:
    """Collapse a compiler message to its kind, so the same mistake on different names groups."""
    lines = [l.strip() for l in str(msg or "").splitlines() if l.strip()]
    err = next((l for l in lines if l.startswith("Error")), lines[0] if lines else "")
    err = re.sub(r'File "[^"]*", line \d+(, characters \d+-\d+)?:?', "", err)
    err = re.sub(r"(Unbound (?:value|module|constructor|type constructor|field|record field|type))\s+\S+",
                 r"\1 <name>", err)
    err = re.sub(r"has type .+? but an expression was expected of type .+",
                 "has type <t> but an expression was expected of type <t>", err)
    err = re.sub(r"\b\d+\b", "N", re.sub(r'"[^"]*"', '"<s>"', err))
    return re.sub(r"\s+", " ", err).strip()[:100]


def summarize_breakdown(recs: list[dict]) -> BreakdownStats:
    n = len(recs)
    passed_any = lambda r: (r.get("tests_passed") or 0) > 0
    passed_all = lambda r: (r.get("tests_total") or 0) > 0 and r.get("tests_passed") == r.get("tests_total")
    share = lambda pred: sum(1 for r in recs if pred(r)) / n
    shares = {
        "END marker": share(lambda r: bool(r.get("has_end_marker"))),
        "type-checks (0 type & 0 syntax errors)":
            share(lambda r: r.get("type_errors", 1) == 0 and r.get("syntax_errors", 1) == 0),
        "compiles": share(lambda r: bool(r.get("compiled"))),
        PASS_ANY: share(passed_any),
        "passes all tests": share(passed_all),
        GATED: share(lambda r: bool(r.get("gated_min_lines"))),
        RUNAWAY: share(lambda r: bool(r.get("runaway"))),
        "timed out": share(lambda r: bool(r.get("timed_out"))),
    }
    comps = ("reward", "structural", "type_check", "compile", "tests")
    groups, by_problem, by_step = defaultdict(list), defaultdict(list), defaultdict(list)
    for r in recs:
        groups[(r.get("step"), str(r.get("problem_id")))].append(float(r.get("reward") or 0.0))
        by_problem[str(r.get("problem_id"))].append(r)
        by_step[r.get("step")].append(r)
    never_any = sorted(p for p, rs in by_problem.items() if not any(map(passed_any, rs)))
    unsolved = set(never_any)
    # Identical rewards in a group mean zero advantage: the group contributes no gradient.
    zero = [(k, v) for k, v in groups.items() if len(v) > 1 and max(v) - min(v) < 1e-9]
    errors = Counter(normalize_error(r["first_error"]) for r in recs if r.get("first_error"))
    cmean = lambda rs, c: statistics.fmean(float(r.get(c) or 0.0) for r in rs)
    return BreakdownStats(
        n=n, groups=len(groups), problems=len(by_problem), shares=shares,
        component_means={c: cmean(recs, c) for c in comps},
        zero_var_groups=len(zero), zero_var_all_zero=sum(1 for _, v in zero if max(v) == 0.0),
        zero_var_unsolved=sum(1 for (_, p), _ in zero if p in unsolved),
        top_errors=errors.most_common(8),
        error_kinds=dict(Counter(k for r in recs for k in (r.get("error_kinds") or [])).most_common()),
        never_solved=sorted(p for p, rs in by_problem.items() if not any(map(passed_all, rs))),
        never_passed_any=never_any,
        per_step={s: {c: cmean(rs, c) for c in comps} for s, rs in sorted(by_step.items())
                  if isinstance(s, int)},
        passes_by_epoch=[(float(r.get("epoch") or 0.0), passed_any(r)) for r in recs])

# ----------------------------------------------------------------------------- analysis


def expected_reward(epoch: float, th: Thresholds = THRESHOLDS) -> float:
    pts = th.reward_trajectory
    for (e0, r0), (e1, r1) in zip(pts, pts[1:]):
        if epoch <= e1:
            return r0 + (r1 - r0) * max(0.0, epoch - e0) / (e1 - e0)
    return pts[-1][1]


def lr_schedule(lrs: list[float]) -> str:
    """Classify from consecutive differences (the log's 3-digit rounding gives equal neighbours)."""
    if len(lrs) < 2:
        return "unknown"
    up = sum(1 for a, b in zip(lrs, lrs[1:]) if b > a * (1 + 1e-6))
    down = sum(1 for a, b in zip(lrs, lrs[1:]) if b < a * (1 - 1e-6))
    if up and down:
        return "warm-up then decay" if 0 < lrs.index(max(lrs)) < len(lrs) - 1 else "mixed"
    return "decay" if down else "warm-up" if up else "constant"


def reward_trend(rewards: list[float], th: Thresholds = THRESHOLDS) -> tuple[str, float]:
    """Least-squares slope over log-line index -> (rising/flat/falling, fitted change over the log)."""
    n = len(rewards)
    if n < 3:
        return "unknown", 0.0
    xm, ym = (n - 1) / 2, statistics.fmean(rewards)
    slope = sum((i - xm) * (y - ym) for i, y in enumerate(rewards)) / sum((i - xm) ** 2 for i in range(n))
    delta = slope * (n - 1)
    return ("rising" if delta > th.trend_flat_delta else "falling" if delta < -th.trend_flat_delta
            else "flat"), delta


def analyze(run_dir: str | Path, th: Thresholds = THRESHOLDS) -> Report:
    """Read a run directory and compute the report; writes nothing. Raises FileNotFoundError."""
    run_dir = Path(run_dir)
    log_path = run_dir / "learning.log"
    if not log_path.is_file():
        raise FileNotFoundError(f"learning log not found: {log_path}")
    header, lines, skipped = parse_learning_log(log_path)
    lines = drop_superseded(lines, lambda l: l.epoch)
    config, audit, bd, bad = {}, None, None, 0
    try:
        config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        pass                            # absent or mid-write: only config-based advice is lost
    if (p := run_dir / "reward_logs" / "syntax_aware_breakdown.jsonl").is_file():
        recs, bad = read_jsonl(p)
        recs = drop_superseded(recs, lambda r: r.get("step") or 0)
        bd = summarize_breakdown(recs) if recs else None
    if (p := run_dir / "dataset_audit.jsonl").is_file():
        arecs, b = read_jsonl(p)
        bad += b
        failed = [a for a in arecs if not a.get("ok")]
        audit = {"problems": len(arecs), "failed": [a.get("id") for a in failed],
                 "reasons": Counter(str(a.get("reason")) for a in failed).most_common(5)}

    findings, ranges = [], []
    add = lambda title, sev, detail: findings.append(Finding(title, sev, detail))
    row = lambda name, xs, exp, assess, level, fmt=".3f": ranges.append(
        MetricRange(name, min(xs) if xs else None, max(xs) if xs else None, exp, assess, level, fmt))
    recent = lines[-th.recent_lines:]
    epoch = lines[-1].epoch if lines else 0.0
    rewards = series(lines, "reward")
    trend, delta = reward_trend(rewards, th)
    if not lines:
        add("No metric lines yet", "warning", f"{log_path} has no complete `[Epoch ...]` line yet.")

    # Policy-gradient loss oscillates around 0 by design; only non-finite values matter.
    nonfinite = [k for k in ("loss", "grad") if any(not math.isfinite(v) for v in series(lines, k))]
    if nonfinite:
        add("Non-finite loss/grad", "critical", f"NaN/inf seen in: {', '.join(nonfinite)}.")
    row("Loss", series(lines, "loss"), "oscillating around 0 (policy gradient)",
        "non-finite" if "loss" in nonfinite else "normal", "critical" if "loss" in nonfinite else "ok", ".4f")

    grad = series(lines, "grad")
    g_ok = not grad or (th.grad_low <= min(grad) and max(grad) <= th.grad_high)
    row("Gradient norm", grad, f"{th.grad_low} - {th.grad_high}", "healthy" if g_ok else "outside band",
        "ok" if g_ok else "warning", ".4f")
    if not g_ok:
        add("Gradient norm outside band", "warning",
            f"grad norm {min(grad):.4f} - {max(grad):.4f}, expected {th.grad_low} - {th.grad_high}.")

    # Learning rate: read the schedule from the values instead of assuming warm-up.
    lrs, peak = series(lines, "lr"), cfg_float(config, "GRPO_LEARNING_RATE")
    sched = lr_schedule(lrs)
    row("Learning rate", lrs, f"configured peak {peak:g}" if peak else "configured peak", sched, "info", ".3g")
    if sched in ("decay", "warm-up", "warm-up then decay"):
        detail = f"{lrs[0]:.3g} → {lrs[-1]:.3g} over epochs {lines[0].epoch:g}-{epoch:g}"
        if peak:
            detail += f"; last value is {lrs[-1] / peak:.0%} of GRPO_LEARNING_RATE={peak:g}"
            total = cfg_float(config, "GRPO_NUM_EPOCHS") or 1.0
            linear = peak * max(0.0, 1 - epoch / total)
            if sched == "decay" and linear > 0 and abs(lrs[-1] - linear) / linear < 0.05:
                detail += f", consistent with linear decay to 0 at epoch {total:g} (expects {linear:.3g})"
        add({"decay": "Learning rate decaying", "warm-up": "Learning rate warming up"}
            .get(sched, "Learning rate past warm-up, decaying"), "info", detail + ".")

    ent, r_ent = series(lines, "entropy"), series(recent, "entropy")
    e_level = "ok"
    if r_ent and mean(r_ent) < th.entropy_collapse:
        e_level = "critical"
        add("Entropy collapse", "critical", f"recent mean entropy {mean(r_ent):.3f} < {th.entropy_collapse}.")
    elif r_ent:
        out_band = [v for v in r_ent if not th.entropy_low <= v <= th.entropy_high]
        swing = max(r_ent) - min(r_ent)
        if out_band or swing > th.entropy_swing_max:
            e_level = "warning"
            add("Unstable entropy", "warning", f"recent entropy {min(r_ent):.3f} - {max(r_ent):.3f} (swing "
                f"{swing:.3f}); {len(out_band)}/{len(r_ent)} values outside {th.entropy_low}-{th.entropy_high}.")
    row("Entropy", ent, f"{th.entropy_low} - {th.entropy_high}, stable",
        {"ok": "stable, in band", "warning": "unstable / out of band", "critical": "collapsed"}[e_level], e_level)

    exp_r, r_mean = expected_reward(epoch, th), mean(series(recent, "reward"))
    r_level = "ok"
    if r_mean is not None and r_mean < exp_r:
        r_level = "critical" if r_mean < th.reward_far_below * exp_r else "warning"
        add("Low absolute rewards", r_level, f"recent mean reward {r_mean:.3f} vs expected ≥ {exp_r:.3f} at "
            f"epoch {epoch:g}; fitted trend over the log: {trend} ({delta:+.3f}).")
    row("Reward (mean)", rewards, f"≥ {exp_r:.3f} at epoch {epoch:g}; > 0.30 by 0.5, > 0.35 by 1.0",
        {"ok": "on track", "warning": "below trajectory", "critical": "far below"}[r_level], r_level)

    cv = lambda ls: [l.values["reward_std"] / l.values["reward"] for l in ls
                     if l.values.get("reward") and "reward_std" in l.values]
    cvs, r_cv = cv(lines), cv(recent)
    cv_bad = bool(r_cv) and statistics.median(r_cv) > th.cv_max
    row("Reward (std)", series(lines, "reward_std"), "see CV", "", "info")
    row("Reward CV (std/mean)", cvs, f"< {th.cv_max}", "too high" if cv_bad else "ok",
        "warning" if cv_bad else "ok", ".2f")
    if cv_bad:
        add("High reward variance", "warning", f"reward CV {min(cvs):.0%} - {max(cvs):.0%} (recent median "
            f"{statistics.median(r_cv):.0%}), expected < {th.cv_max:.0%}. This is the batch spread across "
            "problems; the within-group spread is what GRPO learns from.")

    zs, r_z = series(lines, "frac_zero_std"), series(recent, "frac_zero_std")
    z_level = "ok"
    if r_z:
        k = min(th.zero_std_smooth, len(r_z))
        rolled = max(statistics.fmean(r_z[i:i + k]) for i in range(len(r_z) - k + 1))
        why = ""
        if bd and bd.zero_var_groups:
            why = (f" In the breakdown log {bd.zero_var_groups}/{bd.groups} groups had zero reward variance: "
                   f"{bd.zero_var_unsolved / bd.zero_var_groups:.0%} from problems where no completion passed "
                   f"any test, {bd.zero_var_all_zero / bd.zero_var_groups:.0%} scored 0 on every completion "
                   "(identical scores, not necessarily identical outputs).")
        if rolled >= th.zero_std_critical:
            z_level = "critical"
            add("Mode collapse", "critical", f"frac_zero_std peaked at {max(r_z):.2f} in the last {len(r_z)} "
                f"lines; its {k}-line rolling mean reached {rolled:.2f} (≥ {th.zero_std_critical}). That share of "
                "GRPO groups got identical rewards: zero advantage, no learning signal." + why)
        elif mean(r_z) >= th.zero_std_healthy:
            z_level = "warning"
            add("Low reward diversity", "warning", f"recent mean frac_zero_std {mean(r_z):.2f} "
                f"≥ {th.zero_std_healthy}." + why)
    row("frac_zero_std", zs, f"< {th.zero_std_healthy} (critical ≥ {th.zero_std_critical})",
        {"ok": "healthy", "warning": "elevated", "critical": "critical"}[z_level], z_level, ".2f")

    if bd and bd.shares[RUNAWAY] >= th.runaway_share_max:
        add("Many runaway completions", "warning",
            f"{bd.shares[RUNAWAY]:.0%} of completions hit the length limit without the END marker.")
    if bd and bd.shares[GATED] >= th.gated_share_max:
        add("Many completions gated", "warning", f"{bd.shares[GATED]:.0%} got no reward for having fewer than "
            f"MIN_NON_EMPTY_LINES={config.get('MIN_NON_EMPTY_LINES', '?')} code lines.")
    if bd and not bd.shares[PASS_ANY] and epoch >= 0.5:
        add("No test passes", "warning", f"none of {bd.n} scored completions passed a test by epoch {epoch:g}.")
    if audit and audit["failed"]:
        add("Dataset audit failures", "info", f"{len(audit['failed'])}/{audit['problems']} problems failed the "
            f"audit (top reasons: {audit['reasons']}); their tests can never pass.")

    # Seed's stop criteria: any one failing at/after epoch 1.0 -> STOP.
    z_mean = mean(r_z)
    state = lambda bad_: "unknown" if bad_ is None else "failing" if bad_ else "ok"
    stop_checks = [
        Check(f"mean reward < {th.stop_reward}", state(None if r_mean is None else r_mean < th.stop_reward),
              "no data" if r_mean is None else f"recent mean {r_mean:.3f}"),
        Check(f"frac_zero_std > {th.stop_zero_std}", state(None if z_mean is None else z_mean > th.stop_zero_std),
              "no data" if z_mean is None else f"recent mean {z_mean:.2f}"),
        Check("no test passes seen", state(None if bd is None else bd.shares[PASS_ANY] == 0),
              "no breakdown log" if bd is None else f"{bd.shares[PASS_ANY]:.1%} of completions pass ≥ 1 test"),
        Check("flat or falling reward trend", state(None if trend == "unknown" else trend != "rising"),
              f"{trend} (fitted change {delta:+.3f})"),
    ]
    failing = [c.name for c in stop_checks if c.status == "failing"]
    if epoch >= th.stop_epoch:
        stop_verdict = f"STOP ({'; '.join(failing)})" if failing else "CONTINUE (no stop criterion met)"
        if failing:
            add("Stop criteria met", "critical", stop_verdict)
    else:
        stop_verdict = (f"not yet evaluable (epoch {epoch:g} < {th.stop_epoch:g}); currently failing: "
                        + (", ".join(failing) or "none"))

    titles = lambda sev: [f.title for f in findings if f.severity == sev]
    status = "red" if titles("critical") else "yellow" if titles("warning") else "green"
    actions = _actions(findings, config, bd, th)
    todo = "apply the exports below" if actions else "fix the causes listed below"
    rec = {"red": f"Intervene now ({', '.join(titles('critical'))}): {todo}, restart, and reassess at the "
                  "next checkpoint.",
           "yellow": f"Continue but watch ({', '.join(titles('warning'))}); {todo}.",
           "green": "Healthy: continue training and re-run this analysis at the next checkpoint."}[status]
    if stop_verdict.startswith("STOP"):
        rec = "Stop this run; try the contingency plans (curriculum rewards, stronger base model, easier data)."
    return Report(run_dir, status, rec, epoch, header, lines, skipped, config, sched, trend, ranges, findings,
                  actions, stop_verdict, stop_checks,
                  _checkpoints(lines, bd, epoch, th), bd, audit, bad)


def _checkpoints(lines: list[LogLine], bd: BreakdownStats | None, epoch: float, th: Thresholds) -> list[Check]:
    """The seed's expected trajectory at epochs 0.5 and 1.0, judged on lines near each epoch."""
    out = []
    for cp, names in ((0.5, ["frac_zero_std < 0.10", "reward > 0.30", "entropy stable in band",
                             "some test passes"]),
                      (1.0, ["reward > 0.35", "upward reward trend", "regular test passes (10-20%)"])):
        near = lambda e: abs(e - cp) <= th.checkpoint_window
        win = [l for l in lines if near(l.epoch)]
        if epoch < cp or not win:
            out += [Check(f"epoch {cp}: {n}", "not yet reached" if epoch < cp else "unknown",
                          f"latest epoch {epoch:g}" if epoch < cp else "no log lines near this epoch")
                    for n in names]
            continue
        rw, zs, en = series(win, "reward"), series(win, "frac_zero_std"), series(win, "entropy")
        passes = [p for e, p in bd.passes_by_epoch if near(e)] if bd else []
        share = sum(passes) / len(passes) if passes else None
        trend = reward_trend(series([l for l in lines if l.epoch <= cp + th.checkpoint_window], "reward"), th)[0]
        pass_txt = "no breakdown records near this epoch" if share is None else f"{share:.1%} pass ≥ 1 test"
        res = {
            "frac_zero_std < 0.10": (bool(zs) and mean(zs) < th.zero_std_healthy, f"mean {mean(zs) or 0:.2f}"),
            "reward > 0.30": (bool(rw) and mean(rw) > expected_reward(0.5, th), f"mean {mean(rw) or 0:.3f}"),
            "entropy stable in band": (bool(en) and th.entropy_low <= mean(en) <= th.entropy_high
                                       and max(en) - min(en) <= th.entropy_swing_max,
                                       f"{min(en or [0]):.3f} - {max(en or [0]):.3f}"),
            "some test passes": (bool(share), pass_txt),
            "reward > 0.35": (bool(rw) and mean(rw) > expected_reward(1.0, th), f"mean {mean(rw) or 0:.3f}"),
            "upward reward trend": (trend == "rising", trend),
            "regular test passes (10-20%)": (share is not None and share >= th.test_pass_share_1_0, pass_txt),
        }
        for n in names:
            ok, detail = res[n]
            out.append(Check(f"epoch {cp}: {n}",
                             "unknown" if "test passes" in n and share is None else "met" if ok else "not met", detail))
    return out


def _actions(findings: list[Finding], config: dict, bd: BreakdownStats | None, th: Thresholds) -> list[Action]:
    """Exact exports, computed from the config in use (none when the config lacks the variable)."""
    titles = {f.title for f in findings}
    temp, gens = cfg_float(config, "GRPO_TEMPERATURE"), cfg_float(config, "GRPO_NUM_GENERATIONS")
    lr, maxc = cfg_float(config, "GRPO_LEARNING_RATE"), cfg_float(config, "GRPO_MAX_COMPLETION")
    acts = []
    if titles & {"Mode collapse", "Low reward diversity", "Entropy collapse"}:
        if temp is not None and temp < th.max_temperature:
            acts.append(Action("GRPO_TEMPERATURE", f"{round(temp + 0.2, 2):g}",
                               f"from {temp:g}: more diverse samples, so rewards differ within a group"))
        if gens is not None:
            acts.append(Action("GRPO_NUM_GENERATIONS", str(int(gens) + 2),
                               f"from {int(gens)}: more samples per prompt, better odds one of them differs"))
    if "Low absolute rewards" in titles and lr is not None and "Gradient norm outside band" not in titles:
        acts.append(Action("GRPO_LEARNING_RATE", f"{float(f'{lr * 1.6:.2g}'):g}",
                           f"from {lr:g}: rewards lag the trajectory while the grad norm is healthy"))
    if "Many runaway completions" in titles and maxc is not None:
        acts.append(Action("GRPO_MAX_COMPLETION", str(int(math.ceil(maxc * 1.25 / 64) * 64)),
                           f"from {int(maxc)}: {bd.shares[RUNAWAY]:.0%} of completions end without END"))
    if bd is not None and bd.shares[PASS_ANY] == 0:
        acts.append(Action("REWARD_CURRICULUM", "1",
                           f"no completion passed a test ({bd.n} scored): weight syntax/compile first"))
    return acts

# ----------------------------------------------------------------------------- rendering


def render_summary(r: Report) -> str:
    out = [f"Status: {STATUS_ICON[r.status]} {r.status.upper()}  (epoch {r.epoch:g}, {len(r.lines)} log lines)",
           f"Recommendation: {r.recommendation}"]
    out += [f"  {ICON[f.severity]} {f.title}" for f in r.findings if f.severity != "info"]
    out += [f"  {a.line}" for a in r.actions]
    return "\n".join(out + [f"Stop criteria: {r.stop_verdict}"])


def render_markdown(r: Report, plots: list[Path] = ()) -> str:
    c, bd = r.config, r.breakdown
    er = f"{r.lines[0].epoch:g}-{r.epoch:g}" if r.lines else "n/a"
    skipped = (f"; skipped {r.skipped_lines} malformed/truncated log lines" if r.skipped_lines else "") + \
              (f"; skipped {r.bad_records} unparsable jsonl lines" if r.bad_records else "")
    md = [f"# Training Analysis - Epoch {er}", "", f"**Run dir:** `{r.run_dir}`  ",
          f"**Model:** {c.get('BASE_MODEL_ID', 'unknown')}  ",
          f"**Dataset:** {c.get('TRAINING_DATASET', 'unknown')}"
          + (f" ({r.audit['problems']} problems audited)" if r.audit else "") + "  ",
          f"**Progress:** epoch {er}, {len(r.lines)} metric lines"
          + (f", {bd.n} scored completions in {bd.groups} groups" if bd else "") + skipped, "",
          "## Executive Summary", "", f"**Status:** {STATUS_ICON[r.status]} **{r.status.upper()}**", "",
          f"**Recommendation:** {r.recommendation}", ""]
    md += [f"- {ICON[f.severity]} {f.title}" for f in r.findings if f.severity != "info"] or ["- no issues"]
    md += ["", "## Configuration in Use", ""]
    env_value = lambda v: int(v) if isinstance(v, bool) else v  # noqa: E731  (as it would be exported)
    md += ["```bash"] + [f"{k}={env_value(v)}" for k, v in sorted(c.items())] + ["```"] if c else ["_no config.json_"]
    if r.header:
        md += ["", "Log header:", "```"] + r.header + ["```"]
    head, tail = (r.lines, []) if len(r.lines) <= 6 else (r.lines[:3], r.lines[-3:])
    md += ["", "## Training Log", "", "### Sample log lines (first and last)", "```"]
    md += [l.raw for l in head] + (["..."] + [l.raw for l in tail] if tail else []) + ["```"]
    md += ["", "### Metric ranges", "", "| Metric | Range seen | Expected | Assessment |", "|---|---|---|---|"]
    md += [f"| **{m.name}** | {'n/a' if m.lo is None else f'{m.lo:{m.fmt}} - {m.hi:{m.fmt}}'} | {m.expected} "
           f"| {ICON[m.level]} {m.assessment} |" for m in r.ranges]
    md += ["", f"Learning-rate schedule read from the log: **{r.lr_schedule}**. "
           f"Reward trend (least squares over log lines): **{r.reward_trend}**.", ""]
    if bd:
        md += ["## Reward Breakdown", "", f"From `reward_logs/syntax_aware_breakdown.jsonl`: {bd.n} completions, "
               f"{bd.groups} GRPO groups (step × problem), {bd.problems} problems.", "",
               "| Share of completions | Value |", "|---|---|"]
        md += [f"| {k} | {v:.1%} |" for k, v in bd.shares.items()]
        md += ["", "| Component | Mean |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in bd.component_means.items()]
        if bd.zero_var_groups:
            md += ["", f"Zero-variance groups: {bd.zero_var_groups}/{bd.groups}; "
                   f"{bd.zero_var_unsolved / bd.zero_var_groups:.0%} from problems where no completion passed any "
                   f"test, {bd.zero_var_all_zero / bd.zero_var_groups:.0%} with every reward 0."]
        md += ["", "Most common compiler errors (normalized `first_error`):", ""]
        md += [f"- {n}× `{e}`" for e, n in bd.top_errors] or ["- none"]
        if bd.error_kinds:
            md += ["", "Error kinds: " + ", ".join(f"{k} {n}" for k, n in bd.error_kinds.items())]
        md += ["", f"Problems never solved (no completion passed all tests): {len(bd.never_solved)}/{bd.problems}; "
               f"never passed any test: {len(bd.never_passed_any)}/{bd.problems}."]
        md += ["Never solved: " + ", ".join(f"`{p}`" for p in bd.never_solved[:20])
               + (" ..." if len(bd.never_solved) > 20 else "")] if bd.never_solved else []
        md.append("")
    if r.audit:
        md += ["## Dataset Audit", "", f"{len(r.audit['failed'])}/{r.audit['problems']} problems failed the audit. "
               "Reasons: " + (", ".join(f"{k} ({n})" for k, n in r.audit["reasons"]) or "none"), ""]
    md += ["## Issues Found", ""]
    for i, f in enumerate(r.findings, 1):
        md += [f"### {i}. {f.title} ({ICON[f.severity]} {f.severity})", "", f.detail, ""]
    md += [] if r.findings else ["None.", ""]
    md += ["## Recommended Actions", ""]
    md += ["```bash"] + [f"{a.line}  # {a.reason}" for a in r.actions] + ["```"] if r.actions else ["None."]
    md += ["", f"## Stop Criteria (epoch {r.epoch:g})", "", f"**Verdict:** {r.stop_verdict}", "",
           "| Criterion (STOP if true at epoch 1.0) | State | Detail |", "|---|---|---|"]
    md += [f"| {s.name} | {s.status} | {s.detail} |" for s in r.stop_checks]
    md += ["", "## Expected Trajectory Checkpoints", "", "| Checkpoint | State | Detail |", "|---|---|---|"]
    md += [f"| {s.name} | {s.status} | {s.detail} |" for s in r.checkpoints]
    md += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] if plots else []
    return "\n".join(md) + "\n"

def write_report(r: Report) -> tuple[Path, list[Path]]:
    """Write RUN_DIR/analysis.md and RUN_DIR/plots/*.png; return their paths."""
    from ocaml_grpo.analyze_plots import make_plots  # matplotlib only when writing

    plots = make_plots(r, r.run_dir / "plots")
    path, tmp = r.run_dir / "analysis.md", r.run_dir / "analysis.md.tmp"
    tmp.write_text(render_markdown(r, plots), encoding="utf-8")
    os.replace(tmp, path)
    return path, plots


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    try:
        report = analyze(Path(args[0] if args else "grpo_runs"))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path, _ = write_report(report)
    print(render_summary(report))
    print(f"Full report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
