"""The training-health report of a GRPO run (`python analyze.py RUN_DIR`'s work): read the run's
records (metrics.jsonl, or learning.log as printed; the reward breakdown, config.json, the dataset
audit), judge them by the rules the live monitor uses (training/health.py), and render the report
as the console summary and analysis.md with its plots. The status rule and what each finding
means: analyze.py's --help.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from ocaml_grpo.training import health
from ocaml_grpo.report.advice import Action, actions, cfg_float
from ocaml_grpo.report.outcomes import GATED, PASS_ANY, RUNAWAY, BreakdownStats, summarize_breakdown
from ocaml_grpo.report.plots import make_plots
from ocaml_grpo.report.groups import GroupReport, explain, read_group_report, render as render_groups
from ocaml_grpo.report.kept_groups import DynamicReport, read_dynamic_report, render as render_dynamic
from ocaml_grpo.report.turns import RepairReport, read_repair_report, render as render_repair
from ocaml_grpo.training.health import (THRESHOLDS, Check, Finding, Thresholds, expected_reward, mean,
                                        recent, reward_trend, values)
from ocaml_grpo.jsonl import read_jsonl
from ocaml_grpo.training.learning_log import metric_line, parse_learning_log, series
from ocaml_grpo.training.metrics import METRICS_FILE, StepRecord
from ocaml_grpo.config.settings import defaults
from ocaml_grpo.config import SETTINGS

ICON = {"ok": "✅", "info": "ℹ️", "warning": "⚠️", "critical": "🔴"}
STATUS_ICON = {"green": "🟢", "yellow": "🟡", "red": "🔴"}
DEFAULTS_SOURCE = "train.py's defaults (no config.json in the run directory)"
STOP_MET = "stop criteria met"          # the live monitor's line with GRPO_AUTO_STOP=0 (callbacks.py)

# ----------------------------------------------------------------------------- results


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
class Report:
    run_dir: Path
    status: str                         # green / yellow / red
    recommendation: str
    epoch: float                        # latest logged epoch (0.0 with no lines)
    header: list[str]
    lines: list[StepRecord]
    skipped_lines: int
    config: dict                        # the run's config.json, or the trainer's defaults
    config_source: str                  # "config.json" or DEFAULTS_SOURCE
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
    groups: GroupReport | None = None   # group kinds, problem states, selection (ocaml_grpo/report/groups.py)
    bad_records: int = 0                # unparsable jsonl lines (e.g. a half-written last record)
    repair: RepairReport | None = None  # repair turns (ocaml_grpo/report/turns.py); None without them
    steps: list[int] | None = None      # each line's optimizer step (metrics.jsonl); None: a bare learning.log
    dynamic: DynamicReport | None = None  # dynamic sampling (ocaml_grpo/report/kept_groups.py); None without it

# ----------------------------------------------------------------------------- parsing

def drop_superseded(items: list, position, session=lambda item: None) -> list:
    """A run killed and resumed from a checkpoint redoes the steps after it, so the logs hold
    them twice; where a session starts (or the position goes back), its items replace the
    earlier ones at the same or a later position (epoch, step). Items of the same session that
    share a position (a step's completions) are kept together."""
    out: list = []
    for item in items:
        pos = position(item)
        if out and (pos < position(out[-1]) or (session(item) != session(out[-1]) and pos <= position(out[-1]))):
            out = [x for x in out if position(x) < pos]
        out.append(item)
    return out


def latest_records(recs: list[dict]) -> list[dict]:
    """The breakdown records, each step once: every process (rank) logs its own share, so each
    rank's records are de-duplicated on their own."""
    ranks = sorted({r.get("rank", 0) for r in recs}, key=str)
    return [x for rank in ranks for x in drop_superseded([r for r in recs if r.get("rank", 0) == rank],
                                                          lambda r: r.get("step") or 0, lambda r: r.get("session"))]


# ----------------------------------------------------------------------------- analysis


def lr_schedule(lrs: list[float]) -> str:
    """Classify from consecutive differences (the log's 3-digit rounding gives equal neighbours)."""
    if len(lrs) < 2:
        return "unknown"
    up = sum(1 for a, b in zip(lrs, lrs[1:]) if b > a * (1 + 1e-6))
    down = sum(1 for a, b in zip(lrs, lrs[1:]) if b < a * (1 - 1e-6))
    if up and down:
        return "warm-up then decay" if 0 < lrs.index(max(lrs)) < len(lrs) - 1 else "mixed"
    return "decay" if down else "warm-up" if up else "constant"


@dataclass
class RunData:
    """What a run directory holds, read and cleaned (resumed steps counted once)."""
    run_dir: Path
    header: list[str]
    lines: list[StepRecord]
    skipped_lines: int
    config: dict
    config_source: str
    records: list[dict]                 # the breakdown log's latest records
    breakdown: BreakdownStats | None
    audit: dict | None
    groups: GroupReport
    bad_records: int
    repair: RepairReport | None = None
    steps: list[int] | None = None      # each line's optimizer step; None: a bare learning.log
    stop_notes: list[tuple[float, str]] = field(default_factory=list)  # (epoch, the monitor's stop line)
    dynamic: DynamicReport | None = None


def read_steps(run_dir: Path) -> tuple[list[str], list[StepRecord], int, list[StepRecord] | None]:
    """(learning.log's `#` lines, one line per log step, unreadable lines skipped, their records):
    the steps from metrics.jsonl, else from a bare learning.log (no records). FileNotFoundError with neither."""
    log_path, metrics = run_dir / "learning.log", run_dir / METRICS_FILE
    if metrics.is_file():
        records, skipped = read_jsonl(metrics)
        header = parse_learning_log(log_path)[0] if log_path.is_file() else []
        parsed = [StepRecord.from_json(r) for r in records]
        return header, parsed, skipped, parsed
    if log_path.is_file():
        return *parse_learning_log(log_path), None
    raise FileNotFoundError(f"learning log not found: {log_path} (nor {metrics.name} beside it)")


def read_run(run_dir: str | Path) -> RunData:
    """Read a run directory; writes nothing. Raises FileNotFoundError without metrics.jsonl or learning.log."""
    run_dir = Path(run_dir)
    header, lines, skipped, records = read_steps(run_dir)
    kept = drop_superseded(list(zip(lines, records or [None] * len(lines))), lambda p: p[0].epoch, lambda p: p[0].session)
    lines, kept_records = [l for l, _ in kept], [r for _, r in kept if r is not None]
    # The live monitor's stop lines (met with GRPO_AUTO_STOP=0, or the stop itself): the report
    # judges the run's end, and says when an earlier stop no longer holds.
    stop_notes = [(r.epoch, n) for r in kept_records for n in r.notes if STOP_MET in n or n.startswith("[Stop] ")]
    config, config_source, audit, bd, bad, recs = None, "config.json", None, None, 0, []
    try:
        config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        pass                            # absent or mid-write
    if not isinstance(config, dict):
        # Without the run's config the exports would have nothing to start from: assume the
        # trainer's defaults, and say so wherever the report uses them.
        config, config_source = defaults(SETTINGS), DEFAULTS_SOURCE
    if (p := run_dir / "reward_logs" / "syntax_aware_breakdown.jsonl").is_file():
        recs, bad = read_jsonl(p)
        recs = latest_records(recs)
        bd = summarize_breakdown(recs) if recs else None
    if (p := run_dir / "dataset_audit.jsonl").is_file():
        arecs, b = read_jsonl(p)
        bad += b
        failed = [a for a in arecs if not a.get("ok")]
        audit = {"problems": len(arecs), "failed": [a.get("id") for a in failed],
                 "reasons": Counter(str(a.get("reason")) for a in failed).most_common(5)}
    groups = read_group_report(run_dir, recs, read_jsonl, drop_superseded)
    return RunData(run_dir, header, lines, skipped, config, config_source, recs, bd, audit, groups, bad,
                   read_repair_report(run_dir), [r.step for r in kept_records] if records is not None else None,
                   stop_notes, read_dynamic_report(run_dir))


def analyze(run_dir: str | Path, th: Thresholds = THRESHOLDS) -> Report:
    """Read a run directory and judge it (render_summary / render_markdown render the Report)."""
    return judge(read_run(run_dir), th)


def judge(d: RunData, th: Thresholds = THRESHOLDS) -> Report:
    """The report on a run: health.py's rules (the live monitor's) on the logged metrics, plus the
    breakdown's and the audit's findings, the exports that address them, and the checkpoints."""
    lines, bd = d.lines, d.breakdown
    points = lines
    epoch = lines[-1].epoch if lines else 0.0
    trend, _ = reward_trend(series(lines, "reward"), th)
    findings: list[Finding] = []
    if not lines:
        findings.append(Finding("no_lines", "No metric lines yet", "warning",
                                f"{d.run_dir} has no log step recorded yet (metrics.jsonl, or a complete "
                                "`[Epoch ...]` line in learning.log)."))
    findings += health.findings(points, th)
    level = {f.key: f.severity for f in findings}
    if "zero_std" in level:  # which kind of zero variance it is, and its remedy
        title, why = explain(d.groups, d.config)
        findings = [replace(f, title=title, detail=f.detail + why) if f.key == "zero_std" else f for f in findings]
    sched = lr_schedule(series(lines, "learning_rate"))
    ranges = _ranges(lines, level, d.config, sched, epoch, th)
    findings += _lr_finding(lines, d.config, sched, epoch) + _record_findings(bd, d.audit, d.config, epoch, th)
    verdict = health.stop_verdict(points, bd.shares[PASS_ANY] if bd else None, th)
    if verdict.stop:
        findings.append(Finding("stop", "Stop criteria met", "critical", verdict.summary(th)))
    elif d.stop_notes:
        findings.append(_stop_earlier(d.stop_notes, points, epoch, th))
    acts = actions(findings, d.config, bd, d.groups, points, th)
    status, rec = _status(findings, acts, verdict.stop)
    return Report(d.run_dir, status, rec, epoch, d.header, lines, d.skipped_lines, d.config, d.config_source, sched,
                  trend, ranges, findings, acts, verdict.summary(th), verdict.checks,
                  _checkpoints(lines, bd, epoch, th), bd, d.audit, d.groups, d.bad_records, d.repair, d.steps,
                  d.dynamic)


def _stop_earlier(notes: list[tuple[float, str]], points: list[StepRecord], epoch: float, th: Thresholds) -> Finding:
    """The stop criteria met during the run (the monitor's line) but not at its end: informational,
    the status is the end's. A demo's third step can meet them (a falling fit over 3 steps) and its
    reward rise after."""
    first_epoch, note = notes[0]
    r_mean = mean(values(recent(points, th), "reward"))
    now = "no reward logged" if r_mean is None else (f"recent mean reward {r_mean:.3f} (stop below {th.stop_reward}; "
                                                    f"{expected_reward(epoch, th):.3f} expected)")
    return Finding("stop_earlier", "Stop criteria met earlier, not now", "info",
                   f"The live monitor found them met at epoch {first_epoch:g} (`{note}`"
                   + (f", and {len(notes) - 1} line(s) more" if len(notes) > 1 else "") + f"); at epoch {epoch:g} "
                   f"none is: {now}, reward trend {reward_trend(values(points, 'reward'), th)[0]}.")


def _ranges(lines: list[StepRecord], level: dict[str, str], config: dict, sched: str, epoch: float,
            th: Thresholds) -> list[MetricRange]:
    """Each metric's logged range against its expected band (the bands are Thresholds')."""
    def rng(name, xs, expected, assessment, lvl, fmt=".3f") -> MetricRange:
        return MetricRange(name, min(xs) if xs else None, max(xs) if xs else None, expected, assessment, lvl, fmt)

    def judged(key: str, words: dict[str, str]) -> tuple[str, str]:
        lvl = level.get(key, "ok")
        return words[lvl], lvl

    peak = cfg_float(config, "GRPO_LEARNING_RATE")
    return [
        rng("Loss", series(lines, "loss"), "oscillating around 0 (policy gradient)",
            "non-finite" if "nonfinite" in level else "normal", level.get("nonfinite", "ok"), ".4f"),
        rng("Gradient norm", series(lines, "grad_norm"), f"{th.grad_low} - {th.grad_high}",
            "outside band" if "grad" in level else "healthy", level.get("grad", "ok"), ".4f"),
        # the schedule is read from the values instead of assuming warm-up
        rng("Learning rate", series(lines, "learning_rate"), f"configured peak {peak:g}" if peak else "configured peak", sched,
            "info", ".3g"),
        rng("Entropy", series(lines, "entropy"), f"{th.entropy_low} - {th.entropy_high}, stable",
            *judged("entropy", {"ok": "stable, in band", "warning": "unstable / out of band", "critical": "collapsed"})),
        rng("Reward (mean)", series(lines, "reward"),
            f"≥ {expected_reward(epoch, th):.3f} at epoch {epoch:g}; > {expected_reward(0.5, th):.2f} by 0.5, "
            f"> {expected_reward(1.0, th):.2f} by 1.0",
            *judged("reward", {"ok": "on track", "warning": "below trajectory", "critical": "far below"})),
        rng("Reward (std)", series(lines, "reward_std"), "see CV", "", "info"),
        rng("Reward CV (std/mean)", health.reward_cvs(lines), f"< {th.cv_max}",
            "too high" if "cv" in level else "ok", level.get("cv", "ok"), ".2f"),
        rng("frac_zero_std", series(lines, "frac_zero_std"),
            f"< {th.zero_std_healthy} (critical ≥ {th.zero_std_critical})",
            *judged("zero_std", {"ok": "healthy", "warning": "elevated", "critical": "critical"}), ".2f"),
    ] + ([  # GRPO_ENGINE=llamacpp: the engine's policy against the trainer's
        rng("Engine logp gap (mean)", series(lines, "logp_gap"), f"≤ {th.engine_gap_max}",
            *judged("engine", {"ok": "agree", "warning": "drifted apart"})),
        rng("Engine ratios masked/clipped", series(lines, "clipped_share"), f"≤ {th.engine_clipped_max}",
            *judged("engine", {"ok": "agree", "warning": "drifted apart"})),
    ] if series(lines, "logp_gap") else []) + ([
        rng("Stub answers (share)", series(lines, "stub"), f"≤ {th.stub_max}",
            *judged("stub", {"ok": "few", "warning": "drifting toward stubs"}), ".2f"),
    ] if series(lines, "stub") else []) + ([
        rng("Constant answers (share)", series(lines, "constant"), f"≤ {th.constant_max}",
            *judged("constant", {"ok": "few", "warning": "drifting toward constants"}), ".2f"),
    ] if series(lines, "constant") else []) + ([
        rng("Step time (s)", series(lines, "step_time"), "steady (it grows with the answers' length, the generation "
            "rounds, or a neighbour on the machine)", "", "info", ".1f"),
    ] if series(lines, "step_time") else [])


def _lr_finding(lines: list[StepRecord], config: dict, sched: str, epoch: float) -> list[Finding]:
    """What the learning rate did, read from the log (the analysis this project grew out of
    assumed warm-up where the schedule was decaying)."""
    if sched not in ("decay", "warm-up", "warm-up then decay"):
        return []
    lrs, peak = series(lines, "learning_rate"), cfg_float(config, "GRPO_LEARNING_RATE")
    detail = f"{lrs[0]:.3g} → {lrs[-1]:.3g} over epochs {lines[0].epoch:g}-{epoch:g}"
    if peak:
        detail += f"; last value is {lrs[-1] / peak:.0%} of GRPO_LEARNING_RATE={peak:g}"
        total = cfg_float(config, "GRPO_NUM_EPOCHS") or 1.0
        linear = peak * max(0.0, 1 - epoch / total)
        if sched == "decay" and linear > 0 and abs(lrs[-1] - linear) / linear < 0.05:
            detail += f", consistent with linear decay to 0 at epoch {total:g} (expects {linear:.3g})"
    title = {"decay": "Learning rate decaying", "warm-up": "Learning rate warming up"}.get(
        sched, "Learning rate past warm-up, decaying")
    return [Finding("lr", title, "info", detail + ".")]


def _record_findings(bd: BreakdownStats | None, audit: dict | None, config: dict, epoch: float,
                     th: Thresholds) -> list[Finding]:
    """Findings from the breakdown log and the audit (what learning.log's metrics cannot show)."""
    out = []
    if bd and bd.shares[RUNAWAY] >= th.runaway_share_max:
        out.append(Finding("runaway", "Many runaway completions", "warning",
                           f"{bd.shares[RUNAWAY]:.0%} of completions hit the length limit."))
    if bd and bd.shares[GATED] >= th.gated_share_max:
        out.append(Finding("gated", "Many completions gated", "warning",
                           f"{bd.shares[GATED]:.0%} got no reward for having fewer than "
                           f"MIN_NON_EMPTY_LINES={config.get('MIN_NON_EMPTY_LINES', '?')} code lines."))
    if bd and not bd.shares[PASS_ANY] and epoch >= 0.5:
        out.append(Finding("no_passes", "No test passes", "warning",
                           f"none of {bd.n} scored completions passed a test by epoch {epoch:g}."))
    if audit and audit["failed"]:
        out.append(Finding("audit", "Dataset audit failures", "info",
                           f"{len(audit['failed'])}/{audit['problems']} problems failed the audit (top reasons: "
                           f"{audit['reasons']}); their tests can never pass."))
    return out


def _status(findings: list[Finding], actions: list[Action], stop: bool) -> tuple[str, str]:
    """green / yellow / red, and the one-line recommendation, which names the findings that set the
    status and promises only the exports the report lists."""
    def titles(sev: str) -> str:
        return ", ".join(f.title for f in findings if f.severity == sev)
    status = "red" if titles("critical") else "yellow" if titles("warning") else "green"
    if stop:  # a stop criterion is critical: red, whatever GRPO_AUTO_STOP let the trainer do
        return status, "Stop this run; try the contingency plans (curriculum rewards, stronger base model, easier data)."
    todo = "apply the exports below" if actions else "no setting to change follows from the figures"
    rec = {"red": f"Intervene now ({titles('critical')}): {todo}"
                  + ("" if actions else "; address the issues below") + ", restart, and reassess at the next checkpoint.",
           "yellow": f"Continue but watch ({titles('warning')}); {todo}.",
           "green": "Healthy: continue training and re-run this analysis at the next checkpoint."}[status]
    return status, rec


def _checkpoints(lines: list[StepRecord], bd: BreakdownStats | None, epoch: float, th: Thresholds) -> list[Check]:
    """The expected trajectory at epochs 0.5 and 1.0, judged on lines near each epoch; every label
    is written from the Thresholds it checks."""
    zero_std, reward_half, reward_one = (f"frac_zero_std < {th.zero_std_healthy:.2f}",
                                         f"reward > {expected_reward(0.5, th):.2f}", f"reward > {expected_reward(1.0, th):.2f}")
    regular = f"regular test passes (>= {th.test_pass_share_1_0:.0%})"
    out = []
    for cp, names in ((0.5, [zero_std, reward_half, "entropy stable in band", "some test passes"]),
                      (1.0, [reward_one, "upward reward trend", regular])):
        near = lambda e: abs(e - cp) <= th.checkpoint_window  # noqa: E731
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
            zero_std: (bool(zs) and mean(zs) < th.zero_std_healthy, f"mean {mean(zs) or 0:.2f}"),
            reward_half: (bool(rw) and mean(rw) > expected_reward(0.5, th), f"mean {mean(rw) or 0:.3f}"),
            "entropy stable in band": (bool(en) and th.entropy_low <= mean(en) <= th.entropy_high
                                       and max(en) - min(en) <= th.entropy_swing_max,
                                       f"{min(en or [0]):.3f} - {max(en or [0]):.3f}"),
            "some test passes": (bool(share), pass_txt),
            reward_one: (bool(rw) and mean(rw) > expected_reward(1.0, th), f"mean {mean(rw) or 0:.3f}"),
            "upward reward trend": (trend == "rising", trend),
            regular: (share is not None and share >= th.test_pass_share_1_0, pass_txt),
        }
        for n in names:
            ok, detail = res[n]
            out.append(Check(f"epoch {cp}: {n}",
                             "unknown" if "test passes" in n and share is None else "met" if ok else "not met", detail))
    return out


# ----------------------------------------------------------------------------- rendering


def render_summary(r: Report) -> str:
    out = [f"Status: {STATUS_ICON[r.status]} {r.status.upper()}  (epoch {r.epoch:g}, {len(r.lines)} log lines)",
           f"Recommendation: {r.recommendation}"]
    out += [f"  {ICON[f.severity]} {f.title}" for f in r.findings if f.severity != "info"]
    if r.actions and r.config_source != "config.json":
        out.append(f"  (the exports start from {r.config_source}; check them against the run's real settings)")
    out += [line for a in r.actions for line in ([f"  {a.first}"] if a.first else []) + [f"  {a.line}"]]
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
    if r.config_source != "config.json":
        md += [f"_Assumed: {r.config_source}; the recommended exports start from these values._", ""]
    env_value = lambda v: int(v) if isinstance(v, bool) else v  # noqa: E731  (as it would be exported)
    md += ["```bash"] + [f"{k}={env_value(v)}" for k, v in sorted(c.items())] + ["```"]
    if r.header:
        md += ["", "Log header:", "```"] + r.header + ["```"]
    head, tail = (r.lines, []) if len(r.lines) <= 6 else (r.lines[:3], r.lines[-3:])
    md += ["", "## Training Log", "", "### Sample log lines (first and last)", "```"]
    md += [shown(l) for l in head] + (["..."] + [shown(l) for l in tail] if tail else []) + ["```"]
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
        md += ["", "The parts as logged: weighted (REWARD_WEIGHT_*), before the runaway penalty and any repair "
               "discount; the plot shows each part's share of the reward paid."]
        md += ["", "Most common compiler errors (normalized `first_error`):", ""]
        md += [f"- {n}× `{e}`" for e, n in bd.top_errors] or ["- none"]
        if bd.error_kinds:
            md += ["", "Error kinds: " + ", ".join(f"{k} {n}" for k, n in bd.error_kinds.items())]
        md += ["", f"Problems never solved (no completion passed all tests): {len(bd.never_solved)}/{bd.problems}; "
               f"never passed any test: {len(bd.never_passed_any)}/{bd.problems}."]
        md += ["Never solved: " + ", ".join(f"`{p}`" for p in bd.never_solved[:20])
               + (" ..." if len(bd.never_solved) > 20 else "")] if bd.never_solved else []
        md.append("")
    md += render_groups(r.groups, r.config) if r.groups else []
    md += render_repair(r.repair) if r.repair else []
    md += render_dynamic(r.dynamic) if r.dynamic else []
    if r.audit:
        md += ["## Dataset Audit", "", f"{len(r.audit['failed'])}/{r.audit['problems']} problems failed the audit. "
               "Reasons: " + (", ".join(f"{k} ({n})" for k, n in r.audit["reasons"]) or "none"), ""]
    md += ["## Issues Found", ""]
    for i, f in enumerate(r.findings, 1):
        md += [f"### {i}. {f.title} ({ICON[f.severity]} {f.severity})", "", f.detail, ""]
    md += [] if r.findings else ["None.", ""]
    md += ["## Recommended Actions", ""]
    md += ["```bash"] + [line for a in r.actions for line in ([f"{a.first}  # writes {a.value}"] if a.first else [])
                         + [f"{a.line}  # {a.reason}"]] + ["```"] if r.actions else ["None."]
    md += ["", f"## Stop Criteria (epoch {r.epoch:g})", "", f"**Verdict:** {r.stop_verdict}", "",
           "| Criterion (STOP if true at epoch 1.0) | State | Detail |", "|---|---|---|"]
    md += [f"| {s.name} | {s.status} | {s.detail} |" for s in r.stop_checks]
    md += ["", "## Expected Trajectory Checkpoints", "", "| Checkpoint | State | Detail |", "|---|---|---|"]
    md += [f"| {s.name} | {s.status} | {s.detail} |" for s in r.checkpoints]
    md += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] if plots else []
    return "\n".join(md) + "\n"


def shown(r: StepRecord) -> str:
    """A log step's [Epoch] line: as a bare learning.log showed it, else rendered from its record."""
    return r.line or metric_line(r)


def display_path(run_dir: Path) -> str:
    """The run directory as the user named it from here; a directory elsewhere (a temporary one,
    say) by its own name, so a figure shared in a README carries no machine's path."""
    try:
        return str(run_dir.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return run_dir.name


def write_report(r: Report) -> tuple[Path, list[Path]]:
    """Write RUN_DIR/analysis.md and RUN_DIR/plots/*.png; return their paths."""
    plots = make_plots(r.lines, r.breakdown.per_step if r.breakdown else {}, r.lr_schedule,
                       f"{display_path(r.run_dir)} — status {r.status.upper()}", r.run_dir / "plots", steps=r.steps)
    path, tmp = r.run_dir / "analysis.md", r.run_dir / "analysis.md.tmp"
    tmp.write_text(render_markdown(r, plots), encoding="utf-8")
    os.replace(tmp, path)
    return path, plots
