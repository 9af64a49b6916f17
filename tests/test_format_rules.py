"""Reward integrity, round 4: the format rules (END marker, runaway, time-outs, forgiven errors,
line directives) and completions that could hurt their neighbours or the host."""
import json
import subprocess
import sys
import time

import pytest

from conftest import ADD, END, ROOT, fenced
from ocaml_grpo import ocaml_source as src
from ocaml_grpo.completions import extract_code, has_end_marker
from ocaml_grpo.grader import Grade
from ocaml_grpo.compiler_output import CompileError
from rewards import Breakdown, Weights, score_grade

HONEST = "let add (a : int) (b : int) : int =\n  a + b"


# ---------------------------------------------------------------------------------------------
# The END marker and the runaway rule.

@pytest.mark.parametrize("text,counts", [
    (f"```ocaml\n{HONEST}\n```\n{END}", True),
    (f"```ocaml\n{HONEST}\n```\n\n  {END}  \n", True),
    (f"{END}\n```ocaml\n{HONEST}\n```\nand so on and so on", False),  # the filibuster: marker first
    (f"```ocaml\n{HONEST}\n{END}\n```\nmore", False),  # inside the code
    (f"```ocaml\n{HONEST}\n```\nThe answer ends here {END}", False),  # not on its own line
    (f"```ocaml\n{HONEST}\n{END}", False),  # an unclosed block: nothing comes after it
    (f"{HONEST}\n{END}\n", True),  # no fences: the marker is the last line
    (f"{END}\n{HONEST}\n", False),
])
def test_the_end_marker_counts_only_after_the_last_code_block_on_its_own_line(text, counts):
    assert has_end_marker(text, END) is counts


def test_a_marker_written_first_then_a_ramble_to_the_maximum_length_is_not_full_credit(scorer):
    filibuster = f"{END}\n```ocaml\n{HONEST}\n```\n" + "and it is correct because " * 200
    b = scorer.score_one(ADD, filibuster, completion_tokens=512, max_completion_tokens=512)
    assert not b.has_end_marker and b.runaway and b.reward < 0.3


def test_reaching_the_maximum_length_is_a_runaway_even_with_the_marker(scorer):
    b = scorer.score_one(ADD, fenced(HONEST), completion_tokens=512, max_completion_tokens=512)
    assert b.has_end_marker and b.runaway and b.reward == pytest.approx(0.3)
    assert scorer.score_one(ADD, fenced(HONEST), completion_tokens=511, max_completion_tokens=512).reward == 1.0


# ---------------------------------------------------------------------------------------------
# Time-outs and forgiven errors.

def test_a_timed_out_check_earns_no_type_check_or_compile_credit():
    g = Grade(compile_errors=[CompileError("other", 0, "compiler timed out")], phrases_total=3, phrases_ok=2,
              compile_timed_out=True)
    b = Breakdown(problem_id="p")
    score_grade(g, b, Weights())
    assert b.type_check == 0.0 and b.compile == 0.0


def test_a_compile_that_blows_up_gets_no_credit_for_it(scorer, monkeypatch):
    # a type whose checking takes exponential time: the compile budget runs out
    blow_up = ("let add a b = a + b\nlet f0 = fun x -> (x, x)\n" + "".join(
        f"let f{i} = fun x -> f{i - 1} (f{i - 1} x)\n" for i in range(1, 30)))
    from ocaml_sandbox import Limits
    monkeypatch.setattr(scorer.grader.sandbox, "limits", Limits(compile_s=2.0))
    b = scorer.score_one(ADD, fenced(blow_up))
    assert b.compile_timed_out and b.type_check == 0.0 and b.compile == 0.0, b


def test_errors_are_forgiven_only_for_what_a_failed_phrase_declared(scorer):
    # a broken `module List` does not forgive later typos in List and String
    typos = ("module List = struct let x : int = \"s\" end\n"
             "let add a b = List.length (List.mapp succ [a]) + String.lenght \"b\" + b\n")
    b = scorer.score_one(ADD, fenced(typos))
    assert b.type_errors >= 2, b.error_kinds
    # an honest cascade: the helper's own error counts once, its uses are forgiven
    cascade = "let helper x = x + \"a\"\nlet add a b = helper a + b\n"
    assert scorer.score_one(ADD, fenced(cascade)).type_errors == 1
    # a broken module whose later uses fail as "Unbound module": forgiven
    module = "module Helper = struct let x : int = \"s\" end\nlet add a b = Helper.x + a + b\n"
    assert scorer.score_one(ADD, fenced(module)).type_errors == 1


def test_line_directives_are_blanked_only_where_the_lexer_sees_them():
    table = 'let table = "\n# 1 apple\n# 2 pear\n"\nlet s = {|\n# 3 "q"\n|}\n(*\n# 4\n*)\n# 900 "x.ml"\nlet y = 1\n'
    out = src.strip_line_directives(table)
    assert '# 1 apple' in out and '# 2 pear' in out and '# 3 "q"' in out and "# 4" in out
    assert '# 900' not in out and out.count("\n") == table.count("\n")


def test_a_string_table_of_hash_digit_lines_is_graded_as_written(scorer):
    code = 'let table = "\n# 1\n# 2\n"\nlet add a b = a + b + (String.length table - 9)\n'
    assert scorer.score_one(ADD, fenced(code)).reward == 1.0


# ---------------------------------------------------------------------------------------------
# No completion hurts its neighbours or the host.

@pytest.mark.parametrize("text", ["`" * 1_000_000, "```\n" * 250_000, "```ocaml\n" + "``" * 300_000,
                                  ("```" + "x" * 10 + "\n") * 100_000])
def test_fences_are_scanned_in_linear_time(text):
    t0 = time.perf_counter()
    extract_code(text)
    has_end_marker(text, END)
    assert time.perf_counter() - t0 < 2.0


def test_extraction_is_unchanged_on_ordinary_text():
    assert extract_code("```ocaml\nlet a = 1\n```\ntext\n```python\nx\n```\n```\nlet b = 2\n```") == \
        "let a = 1\nlet b = 2\n"
    assert extract_code("```ocaml\nlet a = 1\n") == "let a = 1\n"  # unclosed: to the end
    assert extract_code("```python\nx = 1\n```") == ""
    assert extract_code("let a = 1") == "let a = 1"


def test_odd_text_in_one_completion_costs_only_that_completion(tmp_path):
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps({"id": "add", "prompt": ADD.prompt, "tests": ADD.tests}) + "\n")
    honest = fenced(HONEST + "\n" + "\n".join(f"let _u{i} = {i}" for i in range(8)))
    records = [honest, fenced("let add a b = a + b (* \ud800 *)"), "\x00" * 100 + fenced(HONEST), honest]
    comps = tmp_path / "c.jsonl"
    comps.write_text("".join(json.dumps({"problem_id": "add", "completion": c}) + "\n" for c in records))
    r = subprocess.run([sys.executable, "rewards.py", "score", str(problems), str(comps), "--workers", "2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert len(lines) == 4
    assert lines[0]["reward"] == 1.0 and lines[3]["reward"] == 1.0
    assert lines[1]["reward"] is not None  # the surrogate became U+FFFD inside a comment
