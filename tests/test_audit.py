"""The dataset audit against real OCaml: the project's own broken and sound rows, then the
external benchmark sets when they are present."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BROKEN, GRADED, ROOT, UNVERIFIABLE, read_rows
from ocaml_grpo.config import resolve
from ocaml_grpo.grading.audit import AuditCache, audit_problems
from ocaml_grpo.problems import Problem, load_problems


def excluded(result):
    return {r.id: r.reason for r in result.records if not r.ok}


def test_each_broken_row_is_excluded_for_its_own_reason(tmp_path):
    result = audit_problems(load_problems(str(BROKEN)), cache_dir=tmp_path, verbose=False)
    assert excluded(result) == {r["id"]: r["expect"] for r in read_rows(BROKEN)}
    assert result.kept == []
    errors = {r.id: r.error for r in result.records}
    assert "Syntax error" in errors["broken/char_literal"]
    assert "Unbound value make_word" in errors["broken/unbound_helper"]
    assert "no_such_findlib_package" in errors["broken/missing_package"]


def test_sound_rows_lose_nothing_and_an_invalid_entry_point_is_noted(tmp_path):
    result = audit_problems(load_problems(str(GRADED)), output_dir=tmp_path / "run", cache_dir=tmp_path, verbose=False)
    assert excluded(result) == {}
    notes = {r.id: r.note for r in result.records if r.note}
    # the row's `Count_Upper` is a constructor name; the prompt's `count_upper` is what gets called
    assert notes == {"entry/count_upper": "entry_point 'Count_Upper' is not an OCaml value name; "
                                          "the prompt's signature `count_upper` is used instead"}
    written = {r["id"]: r["note"] for r in read_rows(tmp_path / "run" / "dataset_audit.jsonl")}
    assert written["entry/count_upper"] == notes["entry/count_upper"] and written["ounit/last_element"] == ""


def test_bundled_set_loses_nothing(tmp_path):
    assert excluded(audit_problems(load_problems("bundled"), cache_dir=tmp_path, verbose=False)) == {}


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
    probs = load_problems(str(BROKEN)) + load_problems(str(GRADED))
    first = audit_problems(probs, cache_dir=tmp_path, verbose=False)

    class NoGrader:  # any compile now would be a cache miss
        def compile_tests(self, *a, **k):
            raise AssertionError("cache miss")

    second = audit_problems(probs, cache_dir=tmp_path, grader=NoGrader(), verbose=False)
    assert [(r.id, r.ok, r.reason, r.note) for r in second.records] == \
        [(r.id, r.ok, r.reason, r.note) for r in first.records]


def test_cli_json_and_summary(tmp_path):
    env = {"AUDIT_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "audit", str(BROKEN), "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert [(x["id"], x["ok"], x["reason"]) for x in rows] == [(b["id"], False, b["expect"]) for b in read_rows(BROKEN)]
    assert set(rows[0]) == {"id", "ok", "reason", "error", "note"}
    r = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "audit", str(GRADED)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"dataset audit: {len(read_rows(GRADED))} kept, 0 excluded" in r.stdout
    assert "kept entry/count_upper: entry_point 'Count_Upper' is not an OCaml value name" in r.stdout


# ---------------------------------------------------------------------------------------------
# The external sets (skipped, with the reason, when ../shared/benchmarks is absent).

def test_broken_published_rows_are_excluded_and_nothing_else(tmp_path, benchmarks):
    sample = audit_problems(load_problems(str(benchmarks / "ocamler_eval_sample.csv")), cache_dir=tmp_path,
                            verbose=False)
    assert excluded(sample) == {"medium_133": "tests_syntax_error", "medium_015": "tests_syntax_error",
                                "medium_079": "tests_type_error"}
    # HumanEval_153 is published with `let Strongest_Extension`, a constructor name: the upstream
    # copy has no signature an answer could define; the fixed copy renames it (its `fixes` field).
    upstream = audit_problems(load_problems(str(benchmarks / "multipl_e_ml_upstream.jsonl")), cache_dir=tmp_path,
                              verbose=False)
    assert len(excluded(upstream)) == 42
    assert excluded(upstream)["multiple_humaneval_ml/HumanEval_153_Strongest_Extension"] == "no_signature"
    fixed = audit_problems(load_problems(str(benchmarks / "multipl_e_ml.jsonl")), cache_dir=tmp_path, verbose=False)
    assert excluded(fixed) == {}


@pytest.mark.parametrize("name", ["ocamlorg_exercises.jsonl", "exercism_ocaml.jsonl"])
def test_external_sets_lose_only_the_rows_the_oracle_cannot_run(tmp_path, benchmarks, name):
    lost = excluded(audit_problems(load_problems(str(benchmarks / name)), cache_dir=tmp_path, verbose=False))
    assert {k.split("/")[-1] for k in lost} == UNVERIFIABLE.get(name, set())
    assert set(lost.values()) <= {"unverifiable", "tests_unbound_error"}


def test_the_audit_cache_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("AUDIT_CACHE_DIR", raising=False)
    directory = resolve(os.environ)[0].audit.cache_dir
    assert AuditCache(directory).path == tmp_path / "ocaml-grpo" / "audit_cache.jsonl"


def test_a_cached_verdict_is_stale_once_the_grader_changes(monkeypatch):
    """The audit's cache key holds the grader's sources: a verdict reached by an older grader (one
    that could not carry a problem) is not reused by a grader that can."""
    from ocaml_grpo.grading import audit
    p = load_problems(str(GRADED))[0]
    before = audit._cache_key(p)
    assert audit._cache_key(p) == before
    monkeypatch.setattr(audit, "grader_code_digest", lambda: "a grader that changed")
    assert audit._cache_key(p) != before
