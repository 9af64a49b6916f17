"""A finished run's answers graded again by this checkout's grader: per window of steps, the shares
of stubs, constant answers, compiled and solved. For a metric added after a run (`constant`), or
to see what a grader change would have said of a run's answers.

    python -m bench.regrade_run grpo_runs/my_run --window 10 --json regrade.json
    python -m bench.regrade_run RUN --problems data/problems.jsonl   # when learning.log's dataset moved

The problems are the run's dataset (learning.log's `# dataset:` line, unless --problems). The line
gate is off here: the shares describe the answers, not the rewards they got.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.getcwd())

from ocaml_grpo.problems import load_problems
from rewards import RewardConfig, RewardScorer


def dataset_of(run: Path) -> str:
    """The dataset a run trained on, as its learning.log names it."""
    for line in (run / "learning.log").read_text().splitlines():
        if line.startswith("# dataset: "):
            return line[len("# dataset: "):].rsplit(" (", 1)[0]
    raise SystemExit(f"{run / 'learning.log'}: no `# dataset:` line; pass --problems")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="the run's output directory (it holds learning.log and reward_logs/)")
    ap.add_argument("--problems", default=None, help="the problems file (default: the run's dataset)")
    ap.add_argument("--window", type=int, default=10, help="steps per row")
    ap.add_argument("--json", default=None, help="write the rows here too")
    a = ap.parse_args(argv)
    run = Path(a.run)
    rows = [json.loads(line) for line in (run / "reward_logs" / "completions.jsonl").read_text().splitlines() if line.strip()]
    problems = {p.id: p for p in load_problems(a.problems or dataset_of(run))}
    missing = sorted({r["problem_id"] for r in rows} - set(problems))
    if missing:
        raise SystemExit(f"{len(missing)} problems of the run are not in the problems file, e.g. {missing[:3]}")
    scorer = RewardScorer(RewardConfig(min_lines=0))
    try:
        graded = scorer.score_batch([problems[r["problem_id"]] for r in rows], [r["completion"] for r in rows])
    finally:
        scorer.close()
    windows: dict[int, list] = defaultdict(list)
    for r, b in zip(rows, graded):
        windows[r["step"] // a.window].append(b)
    out = []
    for w in sorted(windows):
        bs = windows[w]
        share = lambda flag: sum(flag(b) for b in bs) / len(bs)  # noqa: E731
        out.append({"steps": f"{w * a.window}-{(w + 1) * a.window - 1}", "answers": len(bs),
                    "stub": share(lambda b: b.stub), "constant": share(lambda b: b.constant),
                    "compiled": share(lambda b: b.compiled), "solved": share(lambda b: b.solved)})
    print(f"{'steps':>9} {'answers':>7} {'stub':>6} {'constant':>8} {'compiled':>8} {'solved':>6}")
    for o in out:
        print(f"{o['steps']:>9} {o['answers']:>7} {o['stub']:>6.0%} {o['constant']:>8.0%} {o['compiled']:>8.0%} {o['solved']:>6.0%}")
    if a.json:
        Path(a.json).write_text(json.dumps({"run": str(run), "window": a.window, "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
