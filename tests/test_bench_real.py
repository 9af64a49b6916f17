"""bench/bench_real.py's split and interval (the benchmark itself runs for over an hour: BENCHMARKS.md)."""
from collections import Counter

import pytest

from bench import bootstrap_ci
from bench.bench_real import stratified_split
from ocaml_grpo.problems import load_problems


def test_the_held_out_split_is_stratified_fixed_and_disjoint():
    problems = load_problems("bundled")
    train, held = stratified_split(problems, 24, seed=0)
    assert len(held) == 24 and len(train) == len(problems) - 24
    assert not {p.id for p in train} & {p.id for p in held}
    levels = Counter(p.difficulty for p in problems)  # 52 easy, 52 medium, 24 hard
    assert Counter(p.difficulty for p in held) == {d: round(24 * n / len(problems)) for d, n in levels.items()}
    assert sorted(p.id for p in stratified_split(list(reversed(problems)), 24, seed=0)[1]) == sorted(p.id for p in held)
    assert {p.id for p in stratified_split(problems, 24, seed=1)[1]} != {p.id for p in held}


def test_the_bootstrap_interval_brackets_the_mean_and_excludes_zero_only_when_it_should():
    lo, hi = bootstrap_ci([0.1, 0.12, 0.08, 0.11, 0.09] * 5, seed=0)
    assert 0.08 < lo < 0.1 < hi < 0.12
    lo, hi = bootstrap_ci([0.3, -0.3, 0.2, -0.2, 0.1, -0.1] * 4, seed=0)
    assert lo < 0 < hi
    assert bootstrap_ci([0.05] * 24, seed=0) == pytest.approx([0.05, 0.05])


def test_the_stress_check_counts_only_what_a_run_left_not_a_live_neighbours(tmp_path, monkeypatch):
    """Under pytest -n a neighbour's live grader folder and processes must not read as this run's
    leftovers; a folder whose owner died and an orphan below this process must."""
    import ctypes
    import os
    import subprocess
    import sys
    import tempfile

    from bench.bench_real import snapshot
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live, dead = tmp_path / "ocaml-grader-live", tmp_path / "ocaml-grader-dead"
    for d in (live, dead):
        d.mkdir()
    (dead / ".owner").touch()  # its owner is gone: nobody holds the lock
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from ocaml_grpo.grading.grader import hold_owner_lock;"
                               f" from pathlib import Path; hold_owner_lock(Path({str(live)!r})); print(flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    holder.stdout.readline()  # the lock is held
    (tmp_path / f"ocaml-probe-{holder.pid}-a").mkdir()
    (tmp_path / "ocaml-probe-999999999-b").mkdir()
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # as bench_real's main does
    # an orphan: its parent exits at once, and it is reparented to this process
    subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $! > orphan"], cwd=tmp_path, check=True)
    orphan = int((tmp_path / "orphan").read_text())
    try:
        folders, procs = snapshot()
        mine = {f for f in folders if f.startswith(str(tmp_path))}
        assert mine == {str(dead), str(tmp_path / "ocaml-probe-999999999-b")}
        assert orphan in procs and "sleep" in procs[orphan]
        assert holder.pid in procs  # a child of this process is below it too
        assert 1 not in procs and os.getppid() not in procs
    finally:
        holder.kill(), holder.wait()
        os.kill(orphan, 9)
        os.waitpid(orphan, 0)
    folders, procs = snapshot()
    assert str(live) in folders and orphan not in procs  # its owner is gone now
