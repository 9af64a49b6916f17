"""bench/compare_answers.py: two sets of graded answers compared per problem, paired over the
problems both answered (the engines' agreement check)."""
import json

import pytest

from bench import bootstrap_ci
from bench.compare_answers import compare, main, per_problem


def answers(path, rows):
    path.write_text("".join(json.dumps({"problem_id": p, "solved": s, "compiled": c, "completion": "..."}) + "\n"
                            for p, s, c in rows))
    return path


def test_rates_are_per_problem_means_and_the_difference_is_paired(tmp_path, capsys):
    # k=2 against k=4; p3 answered by the first set only
    first = answers(tmp_path / "a.jsonl", [("p1", True, True), ("p1", False, True), ("p2", False, False),
                                           ("p2", False, True), ("p3", True, True)])
    (tmp_path / "stage").mkdir()
    second = answers(tmp_path / "stage" / "completions.jsonl",
                     [("p1", True, True)] * 4 + [("p2", True, True), ("p2", False, True), ("p2", False, False),
                                                 ("p2", False, False)])
    out = compare(per_problem(first), per_problem(tmp_path / "stage"))
    assert out["problems"] == 2 and out["only_first"] == ["p3"] and out["only_second"] == []
    s = out["solved"]
    assert (s["first"], s["second"]) == (pytest.approx((0.5 + 0) / 2), pytest.approx((1 + 0.25) / 2))
    assert s["difference"] == pytest.approx(((1 - 0.5) + (0.25 - 0)) / 2)
    assert s["ci95"] == bootstrap_ci([0.5, 0.25], 0)  # bench_real's interval, over the same differences
    assert s["agree"] is False  # both problems moved up
    c = out["compiled"]
    assert (c["first"], c["second"], c["difference"]) == (pytest.approx(0.75), pytest.approx(0.75), pytest.approx(0.0))
    assert c["agree"] is True
    assert main([str(first), str(tmp_path / "stage"), "--json", str(tmp_path / "out.json")]) == 0
    printed = capsys.readouterr().out
    assert "2 problems in common; left out, answered by one set only: p3" in printed
    assert "pass@1: 0.250 -> 0.625, difference +0.375" in printed and "differ" in printed
    assert json.loads((tmp_path / "out.json").read_text())["solved"]["ci95"] == s["ci95"]


def test_a_file_that_is_not_graded_answers_is_refused_naming_the_line(tmp_path, capsys):
    good = answers(tmp_path / "a.jsonl", [("p1", True, True)])
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"problem_id": "p1", "completion": "x"}) + "\n")
    assert main([str(good), str(bad)]) == 2
    assert f"{bad}:1: no solved, compiled" in capsys.readouterr().err
    other = answers(tmp_path / "c.jsonl", [("p9", True, True)])
    assert main([str(good), str(other)]) == 2
    assert "no problem in common" in capsys.readouterr().err
