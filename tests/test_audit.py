"""The dataset audit against real OCaml and the external benchmark sets."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ocaml_grpo.dataset_audit import audit_problems
from ocaml_grpo.problems import Problem, load_problems

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT.parent / "shared" / "benchmarks"


def excluded(result):
    return {r.id: r.reason for r in result.records if not r.ok}


def test_broken_published_rows_are_excluded_and_nothing_else(tmp_path):
    sample = audit_problems(load_problems(str(BENCH / "ocamler_eval_sample.csv")), cache_dir=tmp_path, verbose=False)
    assert excluded(sample) == {"medium_133": "tests_syntax_error", "medium_015": "tests_syntax_error",
                                "medium_079": "tests_type_error"}
    mpe = audit_problems(load_problems(str(BENCH / "multipl_e_ml.jsonl")), cache_dir=tmp_path, verbose=False)
    # the entry point is capitalised: a constructor, so no OCaml function can ever be called that
    assert excluded(mpe) == {"multiple_humaneval_ml/HumanEval_153_Strongest_Extension": "tests_unbound_error"}
    upstream = audit_problems(load_problems(str(BENCH / "multipl_e_ml_upstream.jsonl")), cache_dir=tmp_path, verbose=False)
    assert len(excluded(upstream)) == 42


@pytest.mark.parametrize("name", ["ocamlorg_exercises.jsonl", "exercism_ocaml.jsonl", "bundled"])
def test_sets_whose_solutions_pass_lose_nothing(tmp_path, name):
    spec = name if name == "bundled" else str(BENCH / name)
    result = audit_problems(load_problems(spec), cache_dir=tmp_path, verbose=False)
    assert excluded(result) == {}


def test_duplicates_empty_tests_long_prompts_and_report_file(tmp_path):
    ok = Problem("a", "(** x *)\nlet f (x : int) : int =", "let () =\n  assert (f 1 = 1)\n;;")
    probs = [ok, Problem("a", ok.prompt, ok.tests), Problem("b", ok.prompt, "  "),
             Problem("c", "(** " + "long " * 50 + "*)\nlet f (x : int) : int =", ok.tests),
             Problem("d", "no signature here", ok.tests),
             Problem("e", "no signature, an entry point", ok.tests, entry_point="f")]
    result = audit_problems(probs, output_dir=tmp_path / "run", prompt_tokens=lambda p: len(p.prompt.split()),
                            max_prompt_tokens=20, cache_dir=tmp_path, verbose=False)
    assert [r.reason for r in result.records] == ["", "duplicate_id", "empty_tests", "prompt_too_long", "no_signature",
                                                  "no_signature"]
    assert [p.id for p in result.kept] == ["a"]
    lines = [json.loads(l) for l in (tmp_path / "run" / "dataset_audit.jsonl").read_text().splitlines()]
    assert [l["id"] for l in lines] == ["a", "a", "b", "c", "d", "e"] and lines[1]["ok"] is False


def test_second_audit_is_served_from_the_cache(tmp_path):
    probs = load_problems(str(BENCH / "ocamler_eval_sample.csv"))
    first = audit_problems(probs, cache_dir=tmp_path, verbose=False)

    class NoGrader:  # any compile now would be a cache miss
        def compile_tests(self, *a, **k):
            raise AssertionError("cache miss")

    second = audit_problems(probs, cache_dir=tmp_path, grader=NoGrader(), verbose=False)
    assert [(r.id, r.ok, r.reason) for r in second.records] == [(r.id, r.ok, r.reason) for r in first.records]


def test_cli_json_and_summary(tmp_path):
    env = {"AUDIT_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    csv = str(BENCH / "ocamler_eval_sample.csv")
    r = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "audit", csv, "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert len(rows) == 20 and sum(not x["ok"] for x in rows) == 3
    assert set(rows[0]) >= {"id", "ok", "reason"}
    r = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "audit", csv], env=env,
                       capture_output=True, text=True, timeout=120)
    assert "17 kept, 3 excluded" in r.stdout
