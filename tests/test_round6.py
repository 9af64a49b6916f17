"""Grader round 6 (#47): a value of a type variable behaves like itself, no credit path around the
allowlist, no restart that gives the answer a fresh start, and the grader's own work stays linear.
Real compiler, real sandbox; each expectation is what plain OCaml gives with the tests appended."""
import time

import pytest

from conftest import ADD, fenced
from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.grader import MAX_SOLUTION_CHARS, _char_offsets


def score(scorer, code, problem=ADD):
    return scorer.score_one(problem, fenced(code))


# ---------------------------------------------------------------------------------------------
# Liveness: the grader's own work on an answer is linear in its size, and bounded.

def test_phrases_and_offsets_of_a_large_answer_take_linear_work():
    """20k phrases in 3 MB: line numbers were counted from the start for every phrase, and each
    compiler offset decoded the text up to it (45-62 s of Python, quadratic); linear, it is ~1 s."""
    n = 20_000
    lines = [f"let f{i} (x : int) : int = x + {i} (* é{'-' * 120} *)\n" for i in range(n)]
    text = "".join(lines)
    starts, byte_starts, at, byte_at = [], [], 0, 0
    for ln in lines:
        starts.append(at)
        byte_starts.append(byte_at)
        at, byte_at = at + len(ln), byte_at + len(ln.encode())
    t0 = time.process_time()
    phrases = src.phrases_from_starts(text, starts)
    offsets = _char_offsets(text, byte_starts[::-1])[::-1]  # in any order
    elapsed = time.process_time() - t0
    assert len(phrases) == n and phrases[-1].line == n and phrases[1234].line == 1235
    assert offsets == starts
    # an offset inside a character counts the characters before it, as decoding the prefix does
    data = text.encode()
    inside = [b + k for b in byte_starts[:50] for k in range(40) if data[b + k] & 0xC0 == 0x80] + [0, len(data)]
    assert _char_offsets(text, inside) == [len(data[:b].decode("utf-8", "ignore")) for b in inside]
    assert elapsed < 10, f"{elapsed:.1f} s of CPU for 3 MB: not linear"


def test_an_answer_over_the_size_limit_is_not_compiled_and_earns_nothing(scorer):
    big = "let add a b = a + b\n" + "".join(f"let pad{i} = {i}\n" for i in range(MAX_SOLUTION_CHARS // 12))
    t0 = time.monotonic()
    b = score(scorer, big)
    assert time.monotonic() - t0 < 30
    assert b.compile_timed_out and b.type_check == b.compile == b.tests == 0.0 and not b.compiled
    assert b.tests_total == 7
    # under the limit, a large answer with one type error is counted as one error
    under = "let add a b = a + b\nlet bad : int = \"x\"\n" + "".join(f"let pad{i} = {i}\n" for i in range(20_000))
    b = score(scorer, under)
    assert b.error_kinds == ["type"] and b.type_check == pytest.approx(0.10), b.first_error
