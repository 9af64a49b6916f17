"""Two sets of graded answers to the same problems, compared per problem: each set's pass@1 and
compile rate, and the difference (second minus first) with a 95% paired bootstrap interval over
the problems, as bench_real's gains are computed. For the check that two engines sample one
policy (their answers should agree within the interval), or any two evaluations.

    python -m bench.compare_answers A/completions.jsonl B/completions.jsonl
    python -m bench.compare_answers STAGE_A STAGE_B --json out.json   # folders holding completions.jsonl

Each file is evaluate.py's or a bench_real evaluation stage's `completions.jsonl` (one graded
answer a line: `problem_id`, `solved`, `compiled`). The problems compared are those both sets
answered; any answered by one set only are named and left out. The sets may hold different numbers
of answers per problem (k=4 against k=8): each problem's rate is its own set's mean.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from bench import bootstrap_ci

METRICS = ("solved", "compiled")


def per_problem(path: Path) -> dict[str, dict[str, float]]:
    """problem id -> {metric: the share of its answers with it} from a completions.jsonl."""
    path = path / "completions.jsonl" if path.is_dir() else path
    seen: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [k for k in ("problem_id", *METRICS) if k not in row]
        if missing:
            raise ValueError(f"{path}:{n}: no {', '.join(missing)} (not a graded answers file?)")
        for m in METRICS:
            seen[row["problem_id"]][m].append(float(bool(row[m])))
    if not seen:
        raise ValueError(f"{path}: no answers")
    return {pid: {m: sum(v) / len(v) for m, v in d.items()} for pid, d in seen.items()}


def compare(first: dict[str, dict[str, float]], second: dict[str, dict[str, float]], seed: int = 0) -> dict:
    """Each set's rates over the problems both answered, and second minus first per metric with
    its 95% paired bootstrap interval; `agree`: the interval holds 0."""
    common = sorted(first.keys() & second.keys())
    if not common:
        raise ValueError("the two sets answered no problem in common")
    out: dict = {"problems": len(common), "only_first": sorted(first.keys() - second.keys()),
                 "only_second": sorted(second.keys() - first.keys())}
    for m in METRICS:
        diffs = [second[p][m] - first[p][m] for p in common]
        low, high = bootstrap_ci(diffs, seed)
        out[m] = {"first": sum(first[p][m] for p in common) / len(common),
                  "second": sum(second[p][m] for p in common) / len(common),
                  "difference": sum(diffs) / len(diffs), "ci95": [low, high], "agree": low <= 0 <= high}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", type=Path, help="a completions.jsonl, or a folder holding one")
    ap.add_argument("second", type=Path)
    ap.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    ap.add_argument("--json", type=Path, default=None, help="also write the comparison here")
    a = ap.parse_args(argv)
    try:
        out = compare(per_problem(a.first), per_problem(a.second), a.seed)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out |= {"first_set": str(a.first), "second_set": str(a.second)}
    print(f"{out['problems']} problems in common" + (f"; left out, answered by one set only: "
          f"{', '.join(out['only_first'] + out['only_second'])}" if out["only_first"] or out["only_second"] else ""))
    for m in METRICS:
        r = out[m]
        name = "pass@1" if m == "solved" else "compiled"
        print(f"{name:>9}: {r['first']:.3f} -> {r['second']:.3f}, difference {r['difference']:+.3f} "
              f"[{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]: {'agree' if r['agree'] else 'differ'}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
