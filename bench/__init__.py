"""The benchmarks (python -m bench.<name>); what they measured is in BENCHMARKS.md."""
import shutil
import sys
from pathlib import Path


def fresh_run_dir(out: str | Path, mark: str) -> Path:
    """A benchmark's working directory, started over; one holding files the benchmark did not
    write (no `mark` file) is refused, never wiped."""
    out = Path(out).resolve()
    if out.is_dir() and any(out.iterdir()) and not (out / mark).exists():
        sys.exit(f"{out} holds files this benchmark did not write; give another --out")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / mark).touch()  # a rerun may start this directory over
    return out


def matched_step(tokens_per_step: list[float], budget: float) -> int:
    """The first step (from 1) by whose end a run has generated `budget` tokens; its last step if
    it never does: where a run is compared with another at equal generated tokens."""
    spent, matched = 0.0, 0
    for matched, t in enumerate(tokens_per_step, 1):
        spent += t
        if spent >= budget:
            break
    return matched
