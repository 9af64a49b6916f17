"""Loading problem sets: every local format, the bundled set, and clear errors."""
import json
import os
import subprocess
import sys

import pytest

from ocaml_grpo.problems import DatasetError, Problem, load_problems

ROW = {"id": "p1", "problem": "(** d *)\nlet f (x : int) : int =", "tests": "let () =\n  assert (f 1 = 1)\n;;",
       "requires": "base"}


def test_every_local_format_loads_the_same_rows(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(ROW) + "\n\n")
    (tmp_path / "a.json").write_text(json.dumps([ROW]))
    import csv
    with open(tmp_path / "a.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROW))
        w.writeheader()
        w.writerow(ROW)
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist([ROW]), tmp_path / "a.parquet")
    for ext in ("jsonl", "json", "csv", "parquet"):
        [p] = load_problems(str(tmp_path / f"a.{ext}"))
        assert (p.id, p.prompt, p.tests, p.requires) == ("p1", ROW["problem"], ROW["tests"], ["base"]), ext


def test_missing_columns_and_empty_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "question": "q"}) + "\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl: missing column\(s\) tests, prompt \(or problem\)"):
        load_problems(str(bad))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DatasetError, match=r"empty\.csv: no rows"):
        load_problems(str(empty))
    with pytest.raises(DatasetError, match="no such file"):
        load_problems(str(tmp_path / "missing.jsonl"))


def test_bundled_set_loads():
    probs = load_problems("bundled")
    assert len(probs) >= 120 and all(p.solution for p in probs)


def test_hub_id_offline_fails_with_a_way_out():
    code = "from ocaml_grpo.problems import load_problems; load_problems('kiranpg/ocaml-training-problems')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                            "HF_HOME": "/nonexistent-hf-home"}, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode != 0
    assert "kiranpg/ocaml-training-problems" in r.stderr and "TRAINING_DATASET=bundled" in r.stderr


def test_a_problem_and_its_dataset_row_are_one_mapping():
    p = Problem("add", "let add (a : int) (b : int) : int =", "let () = assert (add 1 2 = 3)", requires=["base"],
                difficulty="easy", entry_point="add")
    assert Problem.from_row(p.to_row()) == p
    with pytest.raises(ValueError, match="no tests column"):
        Problem.from_row({"id": "add", "problem": p.prompt})
