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
