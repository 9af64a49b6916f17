"""Reward hardening, round 2 (issue #14): wherever the grader's text view of OCaml could differ
from the compiler's, the compiler decides; test credit is bounded by the tests; compile time is
bounded per completion; and a verdict does not depend on the completions graded beside it."""
import random
import subprocess
import time

import pytest

from conftest import ADD, fenced
from ocaml_grpo.grading import source as src
from ocaml_grpo.problems import Problem
from ocaml_grpo.grading.grader import Grade
from ocaml_grpo.grading.harness import tally_run
from ocaml_grpo.config.settings import from_env
from rewards import Breakdown, RewardConfig, RewardScorer, Weights, score_grade

# ---------------------------------------------------------------------------------------------
# 1. Forbidden constructs: decided on the compiled unit's typed tree, not on our lexer.

# Right answers that reach memory-level constructs, each hidden from the old text check by a
# place where its lexer and OCaml's disagreed, or named in a way the text check never knew.
HIDDEN = {
    # an escaped char '\"' inside a comment opened a string that swallowed the code after it
    "escaped_char_in_comment": "(* '\\\"' *) let add a b = Obj.magic (a + b) (* \"\" *)",
    # quoted strings inside comments are read as strings by OCaml: their '"' opens nothing
    "quoted_string_in_comment": '(* {|"|} *) let add a b = Obj.magic (a + b) (* "" *)',
    "quoted_extension_in_comment": '(* {%foo|"|} *) let add a b = Obj.magic (a + b) (* "" *)',
    "external_behind_comment_char": "(* '\\\"' *)\nexternal plus : int -> int -> int = \"%addint\"\n"
                                    "let add a b = plus a b (* \"\" *)",
    # input_value unmarshals like Marshal: arbitrary memory from crafted bytes
    "input_value": "let add a b = (try ignore (input_value stdin : int) with _ -> ()); a + b",
    "output_value": "let add a b = (try output_value stderr 1 with _ -> ()); a + b",
}


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_hidden_memory_level_constructs_void_test_credit(scorer, name):
    b = scorer.score_one(ADD, fenced(HIDDEN[name]))
    assert b.compiled, b.first_error  # it is valid OCaml, and right
    assert b.forbidden and b.tests == 0.0 and b.tests_passed == 0, (b.forbidden, b.tests_passed)


# Snippets where a naive lexer and OCaml's disagree. strip_comments must remove exactly the
# comments OCaml sees: the compiler's parse tree of both texts is the same.
LEXER_CASES = [
    "let x = 1 (* '\\\"' *) let y = 2",
    "let x = 1 (* {|*)|} *) let y = 2",
    "let x = 1 (* {%foo|*)|} *) let y = 2",
    "let x = 1 (* {%%foo.bar id|*)|id} *) let y = 2",
    'let x = 1 (* "*)" *) let y = 2',
    "let x = 1 (* ''' *) let y = 2",
    "let x = 1 (* '\\n' '\\065' '\\x41' '\\o101' *) let y = 2",
    "let x = 1 (*) still a comment *) let y = 2",
    "let s = {|}|} let y = 2 (* {a|*)|a} *)",
    "let s = {%foo|x|} let y = 2",
    "let c = '\"' let y = 2 (* \"*)\" *)",
    "let f (x : 'a) : 'a = x let y = 2 (* a'b *)",
    "let x = 1 (* (* nested *) still *) let y = 2",
]


@pytest.mark.parametrize("code", LEXER_CASES)
def test_comments_are_where_the_compiler_sees_them(tmp_path, code):
    def parsetree(text: str) -> str:
        (tmp_path / "p.ml").write_text(text + "\n")
        r = subprocess.run(["ocamlc", "-w", "-a", "-stop-after", "parsing", "-dparsetree", "-c", "p.ml"],
                           cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return "\n".join(ln.split("(p.ml")[0] for ln in r.stderr.splitlines())  # without locations
    assert parsetree(src.strip_comments(code)) == parsetree(code)


# ---------------------------------------------------------------------------------------------
# 2. The pass count is bounded by the tests.

def test_no_result_line_can_pass_more_than_the_tests(scorer):
    """The trusted program alone writes the results; still, a count never exceeds the run's range."""
    rng = random.Random(14)
    for _ in range(2000):
        total, start = rng.randint(1, 12), 0
        start = rng.randint(0, total - 1)
        lines = []
        for _ in range(rng.randint(0, 60)):
            tag = rng.choice("SPFDKIX")
            i = rng.choice([rng.randint(-5, 40), 10**9, -(10**9)])
            lines.append(f"{tag} {i}" if rng.random() < 0.9 else f"x {tag} {i}")
        run = tally_run("\n".join(lines), start, total)
        assert run.passed <= set(range(start, total)) and run.began <= set(range(start, total))
        # and the reward's test share never exceeds its weight, whatever the grade says
        g = Grade(compiled=True, tests_compiled=True, tests_total=total, tests_passed=rng.randint(0, 10 * total))
        b = Breakdown(problem_id="p")
        score_grade(g, b, Weights())
        assert 0.0 <= b.tests <= Weights().tests


# ---------------------------------------------------------------------------------------------
# 3. Weak type variables: accepted from the compiler's check, never from a message.

def test_a_printed_weak_type_message_earns_no_type_credit(scorer):
    fake = ('[%%ocaml.error "contains type variables that cannot be generalized"]\n'
            'let add a b = a +. b')
    b = scorer.score_one(ADD, fenced(fake))
    assert not b.compiled and b.type_check < 0.2 and b.compile < 0.1 and b.tests == 0.0


def test_real_weak_type_variables_still_compile_and_pass(scorer):
    p = Problem(id="rev_all", prompt="(** Reverse each list. *)\nlet rev_all (l : 'a list list) : 'a list list =",
                tests="let () =\n  assert (rev_all [[1; 2]; [3]] = [[2; 1]; [3]]);\n  assert (rev_all [] = [])\n;;")
    b = scorer.score_one(p, fenced("let rev_all = List.map List.rev"))
    assert b.reward == 1.0, b


# ---------------------------------------------------------------------------------------------
# 4. Line directives cannot move errors between phrases.

THREE_ERRORS = ["let helper x = x + 1.0", "let ok1 = 1", "let other y =\n{directive}  y ^ 1", "let ok2 = 2",
                "let third z = z +. 1", "let add a b = a + b"]


# Directives as OCaml 4.13 reads them: at the start of a line, with a file name (`# 2`, or one
# indented, is a syntax error there: test_format_rules.py).
@pytest.mark.parametrize("directive", ['# 1 "solution.ml"', '# 100 "solution.ml"', '#2 "" then anything',
                                       '# 3 "x.ml" (* not a comment *'])
def test_line_directives_do_not_merge_independent_errors(scorer, directive):
    # A directive inside `other` moved its error's line into `helper`: two errors were counted
    # as one, and the type check paid 0.05 instead of 0.033.
    def grade(d: str) -> tuple:
        b = scorer.score_one(ADD, fenced("\n".join(THREE_ERRORS).replace("{directive}", d)))
        return b.type_errors, b.type_check, b.compile
    assert grade("")[0] == 3
    assert grade(directive + "\n") == grade("")


@pytest.mark.parametrize("layout", ["indented", "one_line", "warnings_on"])
def test_phrases_are_the_compilers_so_layout_cannot_merge_errors(scorer, layout):
    # Phrases used to be cut at column-0 keywords: indenting every definition, or writing them on
    # one line, made one phrase of all of them, and three errors counted as one. A warning the
    # solution re-enables prints its own location first, which must not take the blame either.
    code = "\n".join(THREE_ERRORS).replace("{directive}", "")
    if layout == "indented":
        code = "\n".join(" " + ln for ln in code.splitlines())
    elif layout == "one_line":
        code = " ".join(ln.strip() for ln in code.splitlines())
    else:
        code = '[@@@ocaml.warning "+a"]\n' + code.replace("let ok1 = 1", "let ok1 = let unused = 1 in 2")
    b = scorer.score_one(ADD, fenced(code))
    assert b.type_errors == 3, (b.type_errors, b.error_kinds)
    assert b.type_check == pytest.approx(0.2 * 0.5 / 3)
    assert b.compile == 0.0  # all or nothing (a share of the phrases would pay for padding)


# ---------------------------------------------------------------------------------------------
# 5. A compile-time blow-up costs one compile limit.

def test_compile_blow_up_costs_at_most_one_compile_limit(monkeypatch):
    s = RewardScorer(from_env(RewardConfig, {"OCAML_COMPILE_LIMIT_S": "2", "MIN_NON_EMPTY_LINES": "0",
                                            "REWARD_WORKERS": "2"}))
    try:
        # Printing the type of x30 in the error message is exponential: every type check of a
        # file that still holds the last phrase times out. The compiler names no line then, so
        # each phrase before it was blamed in turn and counting re-checked (and timed out) ten times.
        blow_up = "let bad : int =\n  let x0 = 0 in\n" + "".join(
            f"  let x{i} = (x{i - 1}, x{i - 1}) in\n" for i in range(1, 31)) + "  x30"
        code = "\n".join([f"let a{i} = {i}" for i in range(10)] + ["let add a b = a + b", blow_up])
        t0 = time.monotonic()
        b = s.score_one(ADD, fenced(code))
        elapsed = time.monotonic() - t0
        assert not b.compiled and b.tests == 0.0
        assert elapsed < 2 + 1.5, f"{elapsed:.1f} s for one completion with a 2 s compile limit"
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# 6. A correct answer's verdict does not depend on its neighbours in the batch.

SLOW = Problem(
    id="slow_sum", prompt="(** Sum of i land 7 for i = 1..n. *)\nlet slow_sum (n : int) : int =",
    tests="let () =\n" + ";\n".join("  assert (slow_sum 40_000_000 = 140_000_000)" for _ in range(3)) + "\n;;")
SLOW_RIGHT = "let slow_sum n = let s = ref 0 in for i = 1 to n do s := !s + (i land 7) done; !s"
SLOW_LOOP = "let slow_sum n = let s = ref 0 in while true do incr s done; !s"


@pytest.mark.slow
def test_a_slow_correct_answer_passes_beside_busy_loops(monkeypatch):
    s = RewardScorer(from_env(RewardConfig, {"OCAML_CPU_LIMIT_S": "3", "MIN_NON_EMPTY_LINES": "0",
                                            "REWARD_WORKERS": "2"}))
    try:
        alone = s.score_one(SLOW, fenced(SLOW_RIGHT))
        assert alone.reward == 1.0, alone  # ~1.6 s of CPU: inside the 3 s limit
        # Five busy loops, each distinct (no cache), graded in the same batch: they used to share
        # the cores and a wall-clock deadline with the correct answer, which then timed out.
        loops = [fenced(SLOW_LOOP.replace("incr s", f"s := !s + {k}")) for k in range(1, 6)]
        right = fenced(SLOW_RIGHT + " (* again *)")
        out = s.score_batch([SLOW] * 6, loops[:3] + [right] + loops[3:])
        assert out[3].reward == 1.0 and not out[3].timed_out, out[3]
        assert all(b.timed_out and b.tests_passed == 0 for b in out[:3] + out[4:])
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# 7. Definitions with attributes are recognised as the entry point.

@pytest.mark.parametrize("code", [
    "let[@inline never] add a b = a + b",
    "let[@inline never] rec add a b = if b = 0 then a else add (a + 1) (b - 1)",
    "let rec helper x = x and[@warning \"-32\"] add a b = a + b",
    "let[@ocaml.warning \"-27\"][@inline] add (a : int) (b : int) : int = a + b",
])
def test_definitions_with_attributes_are_full_answers(scorer, code):
    b = scorer.score_one(ADD, fenced(code))
    assert b.reward == 1.0, (b.first_error, b.tests_passed)


def test_defined_values_follow_the_compiler():
    assert src.defined_values("let[@inline never] f x = x") == ["f"]
    assert src.defined_values("let[@attr] rec g x = x and[@a] h y = y") == ["g", "h"]
    assert src.defined_values("let g x = let f = 1 and h = 2 in f + h") == ["g"]
    assert src.defined_values("let x = 1 in x") == []
    assert src.defined_values("type t = A and u = B") == []
