"""Reward integrity, round 4 (items 5 and 6): the format rules cannot be gamed, and no
completion can hurt its neighbours or the host.

The END marker counts only on its own line after the last code block; a completion that reached
the maximum length is a runaway whatever it holds; a check that ran out of compile time earns no
type-check or compile credit; an error is forgiven only when it follows from a name the failed
phrase declared; line directives are blanked only where OCaml's lexer reads one; any text is
extracted in linear time; and odd text (lone surrogates, NUL bytes, messages that are not text)
costs at most its own completion's reward. All against the real grader."""
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

import rewards
from conftest import ADD, ADD_PROMPT, ADD_TESTS, END, ROOT, fenced
from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.completions import extract_code
from ocaml_grpo.config.settings import from_env
from rewards import RewardConfig, RewardScorer

RIGHT = "let add a b = a + b"
BLOCK = f"```ocaml\n{RIGHT}\n```"


# ---------------------------------------------------------------------------------------------
# (a) The END marker: on its own line, after the last code block.

@pytest.mark.parametrize("text,placed", [
    (f"{BLOCK}\n{END}", True),
    (f"Here it is:\n{BLOCK}\n  {END}  \nThat adds.", True),  # its own line, blanks around it
    (f"{BLOCK}\n```python\nprint(1)\n```\n{END}", True),  # after the last block, whatever its language
    (f"{END}\n{BLOCK}\nSome more words.", False),  # before the code: the filibuster's opening
    (f"```ocaml\n{RIGHT}\n{END}\n```", False),  # inside the block
    (f"```ocaml\n{RIGHT}\n{END}", False),  # an unclosed block runs to the end: still inside it
    (f"{BLOCK}\nDone {END}", False),  # not on its own line
    (f"```ocaml\n{RIGHT}\n``` {END}", False),  # nor on the closing fence's
    (f"{BLOCK}\n{END}\n```ocaml\nlet x = 1\n```", False),  # another block after it
    (f"{RIGHT}\n{END}\n\n", True),  # no block: the whole text is code, the marker ends it
    (f"{END}\n{RIGHT}", False),
])
def test_the_end_marker_counts_only_on_its_own_line_after_the_last_code_block(scorer, text, placed):
    b = scorer.score_one(ADD, text)
    assert b.has_end_marker is placed
    assert b.reward == (1.0 if placed else 0.95)


def test_the_filibuster_scores_as_a_runaway_without_the_marker(scorer):
    # The marker first, then the answer, then text until the length limit: it scored 1.0.
    text = f"{END}\n{BLOCK}\n" + "Let me explain the code once more. " * 400
    b = scorer.score_one(ADD, text, completion_tokens=512, max_completion_tokens=512)
    assert not b.has_end_marker and b.structural == 0.0
    assert b.runaway and b.reward == pytest.approx(0.95 * 0.3)


@pytest.mark.parametrize("text", [
    f"{END}\n",  # what a GRPO run of Qwen2.5-Coder-0.5B with the line gate off collapsed to in 4 steps
    f"```ocaml\n```\n{END}",  # an empty block
    f"```ocaml\n(* add a b = a + b *)\n```\n{END}",  # comments are not code
    f"(* nothing *)\n{END}",
])
def test_an_answer_without_code_earns_nothing_even_with_the_line_gate_off(text):
    """The END marker is the format of an answer, not an answer: with MIN_NON_EMPTY_LINES=0 it
    earned 0.05 alone, more than an honest attempt with a syntax error. A one-line answer still counts."""
    s = RewardScorer(from_env(RewardConfig, {"MIN_NON_EMPTY_LINES": "0"}))
    try:
        empty = s.score_one(ADD, text)
        assert empty.reward == 0.0 and empty.structural == 0.0 and empty.gated_min_lines, empty
        assert s.feedback(ADD, text).text.startswith("Your answer has no OCaml code.")
        short = s.score_one(ADD, f"{BLOCK}\n{END}")
        assert short.reward == 1.0 and short.code_lines == 1
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# (b) A completion that reached the maximum length is a runaway, marker or not.

def test_a_completion_at_the_length_limit_is_a_runaway_even_with_the_marker(scorer):
    done = scorer.score_one(ADD, fenced(RIGHT), completion_tokens=511, max_completion_tokens=512)
    assert not done.runaway and done.reward == 1.0
    cut = scorer.score_one(ADD, fenced(RIGHT), completion_tokens=512, max_completion_tokens=512)
    assert cut.has_end_marker and cut.runaway and cut.reward == pytest.approx(0.3)


# ---------------------------------------------------------------------------------------------
# (c) A check that ran out of compile time earns no type-check or compile credit.

# Printing the type of x30 in the error message is exponential: every check of it times out.
BLOW_UP = "let bad : int =\n  let x0 = 0 in\n" + "".join(
    f"  let x{i} = (x{i - 1}, x{i - 1}) in\n" for i in range(1, 31)) + "  x30"


def test_a_compile_time_out_earns_no_type_check_or_compile_credit():
    s = RewardScorer(from_env(RewardConfig, {"OCAML_COMPILE_LIMIT_S": "2", "MIN_NON_EMPTY_LINES": "0",
                                            "REWARD_WORKERS": "1"}))
    try:
        honest = s.score_one(ADD, fenced(RIGHT))  # compiles in milliseconds: untouched
        assert honest.reward == 1.0 and not honest.compile_timed_out
        slow = s.score_one(ADD, fenced(f"{RIGHT}\n{BLOW_UP}"))
        assert slow.compile_timed_out and not slow.compiled
        # it used to count as one type error: 0.10 of type check on top of the marker's 0.05
        assert (slow.type_check, slow.compile, slow.tests) == (0.0, 0.0, 0.0)
        assert slow.reward == pytest.approx(0.05)
        # a real type error beside it does not bring the credit back
        both = s.score_one(ADD, fenced(f'let f (x : int) : int = x + "a"\n{RIGHT}\n{BLOW_UP}'))
        assert both.compile_timed_out and (both.type_check, both.compile) == (0.0, 0.0)
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# (d) An error is forgiven only when it follows from what the failed phrase declared.

def test_a_failed_module_named_list_does_not_forgive_later_typos(scorer):
    # The failed phrase declares `List`; `List.mapp` and `List.lenght` are typos against the
    # standard library's List, each its own error (both were forgiven: their first component).
    code = ('module List = struct let x : int = "s" end\n'
            "let f l = List.mapp succ l\n"
            "let g l = List.lenght l\n"
            f"{RIGHT}")
    b = scorer.score_one(ADD, fenced(code))
    assert b.type_errors == 3, (b.error_kinds, b.first_error)


@pytest.mark.parametrize("code", [
    f'let helper x = x + "a"\nlet f y = helper y\n{RIGHT}',  # Unbound value helper
    f'module Helper = struct let f x = x + "a" end\nlet g y = Helper.f y\n{RIGHT}',  # Unbound module Helper
    f"type shape = Circle of radius\nlet area (s : shape) = 0\n{RIGHT}",  # Unbound type constructor shape
])
def test_errors_that_follow_from_a_failed_declaration_still_count_once(scorer, code):
    b = scorer.score_one(ADD, fenced(code))
    assert b.type_errors == 1, (b.error_kinds, b.first_error)


# ---------------------------------------------------------------------------------------------
# (e) Line directives are blanked only where OCaml's lexer reads one.

@pytest.mark.parametrize("text,kept", [
    ('let s = "x\n# 1 \\"y\\"\n"', True),  # inside a string literal
    ('let s = {|x\n# 1 "y"\n|}', True),  # inside a quoted string
    ('let s = {id|x\n# 1 "y"\n|id}', True),
    ('(* a comment\n# 1 "y" *)\nlet s = 1', True),  # inside a comment (its `*)` must survive)
    ('let s = 1\n  # 1 "y"\n', True),  # indented: OCaml reads `#` there as a symbol
    ("let s = 1\n# 2\n", True),  # no file name: not a directive in OCaml 4.13
    ('let s = 1\n# 99999999999999999999999 "y"\n', True),  # out of range: the lexer's own error
    ('let s = 1\n# 1 "y"\nlet t = 2', False),
    ('# 1 "y" and anything after it\nlet t = 2', False),
    ('let s = "a\n"\n#7"y"\nlet t = 2', False),  # after a string that ended on the line before
    ('let c = \'"\'\n# 7 "y"\nlet t = 2', False),  # a char literal opens no string
])
def test_line_directives_are_blanked_only_where_ocaml_reads_them(text, kept):
    out = src.strip_line_directives(text)
    assert out.count("\n") == text.count("\n")  # line numbers are kept
    if kept:
        assert out == text
    else:
        assert '"y"' not in out and "let t = 2" in out


@pytest.mark.parametrize("table", [
    '"x\n# 1 \\"y\\"\n"',
    '{|x\n# 1 "y"\n|}',
])
def test_a_string_table_with_hash_digit_lines_keeps_its_meaning(scorer, table):
    # Both literals are 10 bytes long; blanking the line made them 3, and every test failed.
    code = f"let add a b =\n  let t = {table} in\n  if String.length t = 10 then a + b else 0"
    b = scorer.score_one(ADD, fenced(code))
    assert b.reward == 1.0, b


def test_a_directive_line_inside_a_comment_does_not_open_the_comment(scorer):
    b = scorer.score_one(ADD, fenced(f'(* see\n# 1 "notes.ml" *)\n{RIGHT}'))
    assert b.reward == 1.0, b


def test_directive_lines_are_not_code_lines():
    # Eight directives and one line of code passed MIN_NON_EMPTY_LINES=8; the grader then blanked them.
    code = '# 1 "a.ml"\n' * 8 + RIGHT
    assert src.count_code_lines(code) == 1
    s = RewardScorer(RewardConfig(min_lines=8, workers=1))
    try:
        b = s.score_one(ADD, fenced(code))
        assert b.gated_min_lines and b.reward == 0.0
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# (f) Any text is extracted in linear time, with the old results on ordinary text.

# The pattern extraction used before (quadratic on backticks): the reference its results must match.
OLD_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
OCAML_TAGS = {"", "ocaml", "ml", "caml", "ocaml-repl"}


def old_extract_code(text: str) -> str:
    blocks = [m.group(2) for m in OLD_FENCE_RE.finditer(text) if m.group(1).lower() in OCAML_TAGS]
    if blocks:
        return "\n".join(b.rstrip() for b in blocks) + "\n"
    return "" if "```" in text else text


MB = 1 << 20


@pytest.mark.parametrize("name,text", [
    ("backticks", "`" * MB),
    ("empty fences", "```\n" * (MB // 4)),
    ("a fence without a newline", "```ocaml" + "a" * MB),
    ("one fence, then backticks", "```\n" + "`" * MB),
    ("spaces after backticks", "``` " * (MB // 4)),
    ("tags without newlines", "```ocaml " * (MB // 9)),
    ("alternating", "``\n" * (MB // 3)),
])
def test_extraction_is_linear(name, text):
    t0 = time.perf_counter()
    extract_code(text)
    assert time.perf_counter() - t0 < 2.0, name


def test_extraction_matches_the_old_results_on_ordinary_and_random_text():
    cases = [
        "Here:\n```ocaml\nlet x = 1\n```\nand\n```python\nprint(1)\n```\n```\nlet y = 2\n```",
        "```ocaml\nlet x = 1\n(* cut off", "let x = 1", "```python\nprint(1)\n```", "```OCaml  extra\nlet x = 1\n```",
        "````\nlet x = 1\n````", "``` ml\nlet a = 1```", "```\n```", "```", "text ``` no newline",
        f"{BLOCK}\n{END}", "```c++\nint x;\n```\n```ocaml-repl\n# 1;;\n```",
    ]
    rng = random.Random(7)
    pieces = ["```", "`", "\n", " ", "\t", "ocaml", "python", "ML", "let x = 1", "c++", "x"]
    cases += ["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 14))) for _ in range(3000)]
    for text in cases:
        assert extract_code(text) == old_extract_code(text), repr(text)


# ---------------------------------------------------------------------------------------------
# (g) Odd text costs at most its own completion's reward.

def test_the_cli_prints_a_line_for_every_completion_whatever_its_text(tmp_path):
    probs = tmp_path / "p.jsonl"
    probs.write_text(json.dumps({"id": "add", "prompt": ADD_PROMPT, "tests": ADD_TESTS}) + "\n")
    completions = [
        fenced(RIGHT),
        fenced(f"{RIGHT} (* \ud800 a lone surrogate, valid in JSON *)"),
        fenced(f"{RIGHT} (* a NUL \x00 byte *)"),
        fenced('let add a b = a + b + String.length "\udfff\x00" - 4'),  # 3 bytes of U+FFFD and a NUL
        [{"role": "assistant", "content": 5}],  # a message that is not text
        fenced("let add a b = a - b"),
    ]
    comps = tmp_path / "c.jsonl"
    comps.write_text("".join(json.dumps({"problem_id": "add", "completion": c}) + "\n" for c in completions))
    r = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "score", str(probs), str(comps), "--workers", "1"],
                       env={**os.environ, "MIN_NON_EMPTY_LINES": "0"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["reward"] for o in out[:4]] == [1.0, 1.0, 1.0, 1.0], [o["first_error"] for o in out]
    assert out[4]["reward"] is None and "not text" in out[4]["first_error"]
    assert out[5]["tests_passed"] == 2 and out[5]["tests_total"] == 7  # add 0 0, add 7 0: its real grade


def test_a_lone_surrogate_in_training_is_graded_and_logged(scorer, tmp_path):
    reward_fn = rewards.make_reward_function(tmp_path, scorer=scorer)
    completions = [fenced(RIGHT), fenced(f"{RIGHT} (* \ud800 *)")]
    out = asyncio.run(reward_fn(prompts=["p"] * 2, completions=completions, completion_ids=[[1, 2]] * 2,
                                id=["add"] * 2, problem=[ADD_PROMPT] * 2, tests=[ADD_TESTS] * 2))
    assert out == [1.0, 1.0]
    logged = [json.loads(line) for line in (tmp_path / "reward_logs" / "completions.jsonl").open(encoding="utf-8")]
    assert "\ufffd" in logged[1]["completion"] and "\ud800" not in logged[1]["completion"]
