"""What starting one run of model code costs: a run in a bubblewrap of its own, a run started by a
prepared sandbox (as the grader runs model code as root), and the same program unsandboxed, side
by side, as one JSON line (wall milliseconds per run, and the machine's busy CPU per run from
/proc/stat, every process and kernel thread included). Needs root (the prepared sandbox).

    python bench/sandbox_start.py [--runs 200]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())

from bench.corpus import machine_busy_s
from ocaml_grpo.grading.sandbox import Sandbox


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    a = ap.parse_args()
    sb = Sandbox()
    if not sb.as_root:
        sys.exit("sandbox_start.py: needs root (prepared sandboxes give each run its own uid)")
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "p.ml").write_text("let () = ()\n")
        subprocess.run(["ocamlfind", "ocamlc", "p.ml", "-o", "prog"], cwd=work, check=True, capture_output=True)
        prog = work / "prog"
        ways = {
            "own_bubblewrap": lambda: sb._run_boxed(["./prog"], work, 5, None, 0, prog, (),
                                                    (subprocess.DEVNULL, subprocess.DEVNULL, ()), 10, None, None, None),
            "prepared": lambda: sb.run(["./prog"], work, wall_s=10, cpu_s=5, program=prog),
            "unsandboxed": lambda: subprocess.run([str(prog)], stdout=subprocess.DEVNULL, check=True),
        }
        out = {"runs": a.runs}
        for name, once in ways.items():
            once()  # a prepared sandbox is started by the first run
            busy0, t0 = machine_busy_s(), time.perf_counter()
            for _ in range(a.runs):
                once()
            out[name] = {"wall_ms": round((time.perf_counter() - t0) / a.runs * 1000, 2),
                         "machine_cpu_ms": round((machine_busy_s() - busy0) / a.runs * 1000, 2)}
    sb.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
