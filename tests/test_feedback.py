"""The repair turn's feedback, with the real grader: it names the model's own errors and the
prompt's public examples, and nothing of the hidden tests."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT, fenced
from ocaml_grpo.grading.feedback import Example, examples_as_tests, feedback_for, public_examples
from ocaml_grpo.grading.grader import OcamlGrader
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.problems import load_problems

PROBLEMS = {p.id: p for p in load_problems("bundled")}
COUNT_EVENS = PROBLEMS["p001_count_evens"]
# Hidden assertions of p001 (not in its prompt): their values must never reach the model.
HIDDEN = ["[7]", "1_000_000", "500_000", "[1; 3; 5; 7]", "List.init"]
# A second, different set of hidden tests for the same prompt: the feedback must not change.
OTHER_TESTS = "let () =\n  assert (count_evens [8; 8] = 2);\n  assert (count_evens [1] = 7)\n;;"

ANSWERS = {
    "right": "let count_evens (xs : int list) : int =\n  List.length (List.filter (fun x -> x mod 2 = 0) xs)",
    "odd_only": "let count_evens (xs : int list) : int =\n  List.length (List.filter (fun x -> x mod 2 = 1) xs)",
    "type_error": "let count_evens (xs : int list) : int =\n  let y = 1 + \"a\" in\n  List.length xs",
    "signature": "let count_evens (xs : int list) : string = \"a\"",
    "prints": "let count_evens (xs : int list) : int =\n  print_string \"1_000_000 500_000\"; prerr_string \"[7]\"; 2",
    "raises": "let count_evens (xs : int list) : int =\n  if List.length xs > 3 then failwith \"List.init\" else 2",
    "loops": "let count_evens (xs : int list) : int =\n  let rec f () = f () in f ()",
    "forbidden": "let count_evens (xs : int list) : int =\n  ignore (Sys.command \"ls\"); 0",
    "syntax": "let count_evens (xs : int list) : int =\n  match xs with\n  | [] -> 0\n  | x :: -> 1",
}


@pytest.fixture(scope="module")
def grader():
    g = OcamlGrader(Sandbox(), cores=2)
    yield g
    g.close()


@pytest.fixture(scope="module")
def feedback(grader):
    """Each answer's feedback under the real hidden tests and under other hidden tests."""
    return {name: (feedback_for(grader, COUNT_EVENS, fenced(code)),
                   feedback_for(grader, replace(COUNT_EVENS, tests=OTHER_TESTS), fenced(code)))
            for name, code in ANSWERS.items()}


def test_the_prompt_examples_are_read_as_assertions():
    assert public_examples(COUNT_EVENS.prompt) == [Example("count_evens [1; 2; 3; 4]", "2"),
                                                    Example("count_evens [-2; -3; 0]", "2"),
                                                    Example("count_evens []", "0")]
    assert examples_as_tests(public_examples(COUNT_EVENS.prompt)).count("assert") == 3
    # every bundled prompt has examples, and none runs into the comment's end
    for p in PROBLEMS.values():
        ex = public_examples(p.prompt)
        assert ex and all("*)" not in e.result and e.result for e in ex), p.id


def test_a_right_answer_gets_no_feedback(feedback):
    assert feedback["right"][0].text is None
    assert feedback["right"][0].examples_passed == feedback["right"][0].examples_total == 3


def test_a_type_error_is_named_where_the_model_wrote_it(feedback):
    text = feedback["type_error"][0].text
    assert "Type error at line 2, column 15" in text  # line 2 of the answer, not of the unit compiled
    assert "has type string but an expression was expected of type int" in text


def test_a_syntax_error_and_a_forbidden_call_are_named(feedback):
    assert "Syntax error at line 4" in feedback["syntax"][0].text
    assert "Sys.command" in feedback["forbidden"][0].text


def test_failing_public_examples_are_listed_and_hidden_ones_are_not(feedback):
    fb = feedback["odd_only"][0]
    assert fb.examples_passed == 2 and "count_evens [-2; -3; 0]  should be  2" in fb.text
    assert "1 of the 3 examples" in fb.text


def test_a_wrong_signature_gets_feedback_without_test_text(feedback):
    text = feedback["signature"][0].text
    assert "Wrong signature" in text and "int list -> int" in text
    assert "assert" not in text and "count_evens [" not in text


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_nothing_of_the_hidden_tests_reaches_the_model(feedback, name):
    """Printing, raising or looping: the feedback is a function of the prompt and the answer
    alone. Under other hidden tests it is the same, byte for byte, and it holds none of the real
    hidden tests' values, nor the grader's private unit name."""
    real, other = feedback[name]
    assert real == other
    text = real.text or ""
    assert [h for h in HIDDEN if h in text and h not in ANSWERS[name]] == []
    assert "wire_" not in text.lower() and "trusted" not in text.lower()
    assert "1_000_000" not in text and "500_000" not in text  # even the printed ones stay out


def test_the_feedback_command_prints_what_the_model_would_see(tmp_path, feedback):
    names = ["right", "type_error", "odd_only"]
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps({"problem_id": COUNT_EVENS.id, "completion": fenced(ANSWERS[n])}) + "\n"
                            for n in names))
    out = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "feedback", "bundled", str(path)],
                         capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**os.environ, "MIN_NON_EMPTY_LINES": "0"}).stdout  # short answers: no line gate
    printed = [json.loads(line) for line in out.splitlines()]
    assert [p["feedback"] for p in printed] == [feedback[n][0].text for n in names]
    assert printed[0]["feedback"] is None and printed[2]["examples_passed"] == 2


POLY = ("(** The first element, or the default.\n * >>> first_or 0 [4; 2]\n * 4\n*)\n"
        "let first_or (d : 'a) (xs : 'a list) : 'a =")
POLY_TESTS = "let () =\n  assert (first_or 0 [4; 2] = 4);\n  assert (first_or 'x' [] = 'x')\n;;"
POLY_ANSWERS = ["let first_or d xs = match xs with [] -> d | x :: _ -> x + 1",  # int, not 'a
                "let first_or (d : 'b) (xs : 'b list) : int = 0",
                "let first_or d xs = match xs with [] -> d | x :: _ -> x"]  # right


def test_feedback_on_a_polymorphic_prompt_is_the_same_in_every_grader_process(tmp_path):
    """A mistyped answer to a prompt with a type variable: the feedback speaks of the prompt's own
    `'a`, names nothing of the grader (its per-process wire unit), and two grader processes say
    the same bytes."""
    code = ("import json, sys; from ocaml_grpo.grading.feedback import feedback_for; "
            "from ocaml_grpo.grading.grader import OcamlGrader; from ocaml_grpo.problems import Problem\n"
            f"p = Problem(id='poly', prompt={POLY!r}, tests={POLY_TESTS!r}); g = OcamlGrader(cores=1)\n"
            f"print(json.dumps([feedback_for(g, p, c).text for c in {[fenced(a) for a in POLY_ANSWERS]!r}]))\n"
            "g.close()")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                      check=True).stdout) for _ in range(2)]
    assert runs[0] == runs[1]
    wrong_int, wrong_result, right = runs[0]
    assert right is None
    for text in (wrong_int, wrong_result):
        assert "Wrong signature" in text and "'a. 'a -> 'a list -> 'a" in text, text
        assert "wire" not in text.lower() and "tok" not in text.lower() and "Solution" not in text


def test_one_answer_gets_one_compile_verdict_from_score_and_feedback(tmp_path):
    """`rewards.py score` and `rewards.py feedback` read the same answers: an `Obj.magic` answer
    compiles (forbidden costs test credit, not that), a wrong signature does not; both commands
    say so, and the compile part pays exactly where they say compiled."""
    magic = "let count_evens (xs : int list) : int =\n  Obj.magic (List.length (List.filter (fun x -> x mod 2 = 0) xs))"
    answers = {"magic": magic, "signature": ANSWERS["signature"], "right": ANSWERS["right"],
               "type_error": ANSWERS["type_error"]}
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps({"problem_id": COUNT_EVENS.id, "completion": fenced(a)}) + "\n"
                            for a in answers.values()))
    env = {**os.environ, "MIN_NON_EMPTY_LINES": "0"}
    run = lambda cmd: [json.loads(line) for line in subprocess.run(  # noqa: E731
        [sys.executable, str(ROOT / "rewards.py"), cmd, "bundled", str(path)],
        capture_output=True, text=True, cwd=ROOT, check=True, env=env).stdout.splitlines()]
    scored, told = run("score"), run("feedback")
    assert [s["compiled"] for s in scored] == [f["compiled"] for f in told] == [True, False, True, False]
    assert [s["compile"] > 0 for s in scored] == [True, False, True, False]
    assert scored[0]["forbidden"] == "Stdlib.Obj.magic" and scored[0]["tests"] == 0
    assert "Obj.magic" in told[0]["feedback"]


def test_an_answer_the_line_minimum_zeroes_is_told_why(grader):
    """A right two-line answer under MIN_NON_EMPTY_LINES=8 scores 0: its feedback says so (and is
    no longer None, so the episode goes on); without the minimum it gets none."""
    short = fenced(ANSWERS["right"])
    assert feedback_for(grader, COUNT_EVENS, short).text is None
    fb = feedback_for(grader, COUNT_EVENS, short, min_lines=8)
    assert fb.text.startswith("Your answer has 2 lines of code; an answer shorter than 8 non-empty lines")
    assert "scores 0" in fb.text and fb.compiled and fb.examples_passed == 3
    wrong = feedback_for(grader, COUNT_EVENS, fenced(ANSWERS["type_error"]), min_lines=8)
    assert "3 lines of code" in wrong.text and "Type error at line 2" in wrong.text  # both reasons
    long_enough = feedback_for(grader, COUNT_EVENS, short, min_lines=2)
    assert long_enough.text is None


# Every file the grader writes and compiles beside the answer (grader.py, compilers.py, server.py),
# in bare and absolute form, and one it might write tomorrow: none may be cited in feedback.
GRADER_FILES = ["entry.ml", "check.ml", "signature.ml", "appended.ml", "oracle.ml", "oracle.mli", "trusted.ml",
                "twire.ml", "wire_5f0c1e2d3a4b6c7d.ml", "parse3.ml", "lambda_2.ml", "s0.ml", "t1.ml", "u2.ml",
                "allowlist.ml", "allowlist_data.ml", "compile_server.ml", "/dev/shm/ocaml-grader-x1/w3/entry.ml",
                "tomorrow.ml"]


@pytest.mark.parametrize("file", GRADER_FILES)
def test_feedback_never_cites_a_place_in_a_file_of_the_grader(file):
    from ocaml_grpo.grading.feedback import render
    from ocaml_grpo.grading.grader import Grade
    from ocaml_grpo.grading.diagnostics import CompileError
    message = (f'Values do not match: val size : int is not included in val size : t -> int File "{file}", '
               f'line 16, characters 6-47: Expected declaration File "solution.ml", line 15, characters 6-10: '
               'Actual declaration')
    text = render(Grade(compile_errors=[CompileError("entry", 15, message, file="solution.ml")]), [], 0).text
    assert file not in text and Path(file).name not in text and "16" not in text and "47" not in text, text
    assert "(line 15, column 7) Actual declaration" in text  # the answer's own place stays, in its terms
    # with 3 lines of the grader's before the answer (its prefix): the answer's line 12
    shifted = render(Grade(compile_errors=[CompileError("entry", 15, message, file="solution.ml")]), [], 3).text
    assert "(line 12, column 7)" in shifted and "16" not in shifted


@pytest.mark.parametrize("name", ["grader_entry_0", "Grader_entry_functor", "_entry_3", "Solution", "Wire_ab12",
                                  "wire_ab12cd34"])
def test_feedback_never_names_what_the_grader_appended(name):
    from ocaml_grpo.grading.feedback import render
    from ocaml_grpo.grading.grader import Grade
    from ocaml_grpo.grading.diagnostics import CompileError
    err = CompileError("type", 2, f"This expression has type {name}.t but an expression was expected of type int")
    text = render(Grade(compile_errors=[err]), [], 0).text
    assert name not in text and "expected of type int" in text, text
    own = CompileError("type", 2, "Unbound value my_entry_point_Solution_wire_x")  # the answer's own name stays whole
    assert "Unbound value my_entry_point_Solution_wire_x" in render(Grade(compile_errors=[own]), [], 0).text


def test_a_functor_signature_mismatch_cites_only_the_answer(grader):
    """Round 7: OCaml's message for a functor whose body does not match the prompt's signature
    quotes where the grader's entry check declares the value (`File "entry.ml", line 9`)."""
    from test_grader import ORDERED_SET, ORDERED_SET_PROMPT, ORDERED_SET_TESTS
    from ocaml_grpo.problems import Problem
    p = Problem(id="ordered_set", prompt=ORDERED_SET_PROMPT, tests=ORDERED_SET_TESTS)
    text = feedback_for(grader, p, fenced(ORDERED_SET.replace("let size = List.length", "let size s = s = []"))).text
    assert "Wrong signature" in text and "val size : 'a list -> bool is not included in val size : t -> int" in text
    assert 'File "' not in text and "entry.ml" not in text and "line 9" not in text, text
    assert "(line 15, column 7) Actual declaration" in text  # `size` is on the answer's line 15
