"""bench/bench_real.py's split and interval (the benchmark itself runs for over an hour: BENCHMARKS.md)."""
from collections import Counter

import pytest

from bench.bench_real import bootstrap_ci, stratified_split
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
