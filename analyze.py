"""Training-health report for a GRPO run: the hand-written epoch-0.28 analysis, computed from data.

Usage:  python analyze.py [RUN_DIR]          (default: grpo_runs)

Reads RUN_DIR/metrics.jsonl (the trainer's record of every log step; a run without one: its
learning.log, as printed; neither -> exit 2), and when present
reward_logs/syntax_aware_breakdown.jsonl, config.json (absent: train.py's defaults are assumed, and
the report says so) and dataset_audit.jsonl. Writes
RUN_DIR/analysis.md and RUN_DIR/plots/*.png and prints the executive summary. Safe while training
still writes: an unterminated last line of learning.log and unparsable .jsonl lines are skipped.

Status rule (the thresholds and rules live in ocaml_grpo/training/health.py, shared with train.py's live
monitor):
  red    - any critical finding: mode collapse (the `zero_std_smooth`-line rolling mean of
           frac_zero_std reaches `zero_std_critical` in the recent window), recent mean reward below
           `reward_far_below` x the expected reward for the epoch, entropy collapse, non-finite
           loss/grad, or the stop criteria met at/after `stop_epoch` at the run's end (whether
           GRPO_AUTO_STOP stopped the trainer or let it go on);
  yellow - any warning: reward diversity, reward level or variance, entropy, grad norm, runaway or
           gated share outside band, no test passes by epoch 0.5;
  green  - otherwise. Informational findings (the learning-rate schedule, audit failures, stop
           criteria met earlier but not at the end) never change the status. "Recent window" = the
           last `recent_lines` metric lines.
The recommended exports (ocaml_grpo/report/advice.py) each state the figure they rest on; none
where the figures cannot tell which remedy fits, none for a value the run already has.
"""
import sys
from pathlib import Path

from ocaml_grpo.report.run_report import Report, analyze, render_markdown, render_summary, write_report

__all__ = ["Report", "analyze", "main", "render_markdown", "render_summary", "write_report"]


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
