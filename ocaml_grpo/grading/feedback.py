"""What the model is told after an answer, in a repair turn: the one place its text is built.

It may show only two things, both about what the model already knows or wrote:
- what the compiler says about the model's own code: the error's class, its line and column in the
  answer's code, and the compiler's message; a library path off the allowlist, named;
- the results of the prompt's public examples (the `>>> call` / `result` lines of its doc
  comment), run as assertions through the same grader, sandbox and trusted program as the tests.
Nothing from the hidden tests reaches it: not their text, values or output, not which one failed,
not how many passed. An error located anywhere but the answer's code (the tests, the program
that calls the answer) is reported without location or excerpt. The answer's own output is
never shown either: printing is not a channel.

`feedback_for` returns None when the answer compiles, passes every public example and is long
enough for the run's line minimum: the episode ends there, whatever the hidden tests would say.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from ocaml_grpo.grading.completions import assemble_solution, completion_text, extract_code
from ocaml_grpo.grading.grader import GRADER_NAMES, Grade, OcamlGrader
from ocaml_grpo.grading.source import count_code_lines, parse_signature
from ocaml_grpo.problems import Problem

MAX_EXAMPLES_SHOWN = 4  # failing examples listed, in the prompt's order
MAX_MESSAGE_CHARS = 400  # a compiler message is cut here (a type can be long)
ASK_AGAIN = "Fix it and answer again with the whole solution in one ```ocaml block, then (* END *) on its own line."

ANSWER_FILE = "solution.ml"  # the answer's code, as the grader compiles it: the one file feedback may cite
# A place a compiler message cites inside its text (`... File "entry.ml", line 9, characters 6-25:
# Expected declaration`): OCaml's form, one line or several, columns or not.
CITED_PLACE = re.compile(r'File "([^"]*)", lines? (\d+)(?:-\d+)?(?:, characters (\d+)-\d+)?:?[ \t]*')
PRIVATE_TEXT = "the grader's"  # what a message says in place of a grader name
# A whole name the grader gave (`grader_entry_0`, `Wire_ab12.Tok`), never part of the answer's own (`my_entry_point`).
GRADER_NAME = re.compile(r"(?<![\w'])(?:" + "|".join(re.escape(n) for n in GRADER_NAMES) + r")[\w']*")

EXAMPLE_START = re.compile(r"^\s*\*?\s*>>>\s?(.*)$")
COMMENT_LINE = re.compile(r"^\s*\*?\s?(.*?)\s*(\*\))?\s*$")


@dataclass(frozen=True)
class Example:
    call: str  # the OCaml expression after `>>>`
    result: str  # the value the doc comment says it gives


def public_examples(prompt: str) -> list[Example]:
    """The prompt's `>>> call` lines, each with the result written under it (one or more lines,
    up to the next `>>>`, a blank line or the comment's end). A call with no result, or one that
    shows an exception, is not an example an assertion can check."""
    sig = parse_signature(prompt)
    lines = (sig.preamble if sig else prompt).splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        m = EXAMPLE_START.match(lines[i])
        i += 1
        if not m or not m.group(1).strip():
            continue
        call, result = m.group(1).strip(), []
        while i < len(lines) and not EXAMPLE_START.match(lines[i]) and not lines[i].strip().startswith("*)"):
            body = COMMENT_LINE.match(lines[i])
            text = body.group(1).strip() if body else ""
            if not text:
                break
            result.append(text)
            i += 1
            if body.group(2):  # the comment ends on this line
                break
        value = " ".join(result).strip()
        if value and not value.lower().startswith(("exception", "error:", "raises")):
            out.append(Example(call, value))
    return out


def examples_as_tests(examples: list[Example]) -> str:
    """The examples as one test block of assertions, in the tests' own form."""
    if not examples:
        return ""
    body = ";\n".join(f"  assert (({e.call}) = ({e.result}))" for e in examples)
    return f"let () =\n{body}\n;;"


@dataclass(frozen=True)
class Feedback:
    text: str | None  # what the model reads; None: nothing to repair (compiles, examples pass, long enough)
    compiled: bool  # Grade.compiled_as_asked: the same verdict as `rewards.py score`'s
    examples_passed: int
    examples_total: int


def feedback_for(grader: OcamlGrader, problem: Problem, completion, min_lines: int = 0) -> Feedback:
    """Grade the answer against the prompt's public examples only, and say what went wrong.
    `min_lines` is the run's MIN_NON_EMPTY_LINES: an answer the gate zeroes is told so, first (it
    is the rule the reward applies, so a right but short answer must not end its episode unexplained)."""
    examples = public_examples(problem.prompt)
    code = extract_code(completion_text(completion))
    lines = count_code_lines(code)
    if not lines:  # nothing, or comments only: no answer (the reward's rule too)
        return Feedback("Your answer has no OCaml code. " + ASK_AGAIN, False, 0, len(examples))
    solution, entries = assemble_solution(code, problem.prompt, problem.entry_point)
    grade = grader.grade(solution, examples_as_tests(examples), problem.requires, entries, problem.prompt)
    offset = solution[:len(solution) - len(code)].count("\n")  # the answer's code ends the unit
    fb = render(grade, examples, offset)
    if lines >= min_lines:
        return fb
    short = (f"Your answer has {lines} line{'' if lines == 1 else 's'} of code; an answer shorter than "
             f"{min_lines} non-empty lines of code (comments not counted) scores 0 here.")
    return replace(fb, text=short + " " + (fb.text or ASK_AGAIN))


def render(grade: Grade, examples: list[Example], offset: int) -> Feedback:
    compiled = grade.compiled_as_asked
    if grade.compile_timed_out:
        return Feedback("The compiler ran out of time on your answer. " + ASK_AGAIN, False, 0, len(examples))
    if grade.compile_errors:
        return Feedback(_compile_errors(grade, offset), False, 0, len(examples))
    if grade.forbidden:
        return Feedback(f"Your answer uses `{grade.forbidden}`, which is not allowed here. " + ASK_AGAIN,
                        compiled, 0, len(examples))
    if not grade.tests_compiled:
        # The answer compiled, but the program that calls it did not build: its text is not the
        # model's to see (it holds the calls), so neither is where or why.
        return Feedback("Your answer compiles, but it cannot be called as the problem's signature says. "
                        + ASK_AGAIN, True, 0, len(examples))
    failed = [e for k, e in enumerate(examples) if k not in set(grade.passed_ids)]
    if not failed:
        return Feedback(None, compiled, len(examples), len(examples))
    lines = [f"Your answer compiles, but {len(failed)} of the {len(examples)} examples in the problem "
             f"statement {'fails' if len(failed) == 1 else 'fail'}" + (" (the run ran out of time)" if grade.timed_out else "") + ":"]
    lines += [f"  {e.call}  should be  {e.result}" for e in failed[:MAX_EXAMPLES_SHOWN]]
    return Feedback("\n".join(lines + [ASK_AGAIN]), True, len(examples) - len(failed), len(examples))


ERROR_NAMES = {"syntax": "Syntax error", "type": "Type error", "unbound": "Unbound name",
               "entry": "Wrong signature", "link": "Link error", "other": "Error"}


def answer_terms(message: str, offset: int) -> str:
    """A compiler message as feedback may show it: a place it cites in the answer's code becomes
    that place in the answer (`line 3, column 7:`); any other place (a file the grader wrote: the
    entry-point check, the oracle, the tests' program, ...) is dropped, its name and lines with
    it: deny by default, whatever file the grader writes next. A name the grader gave what it
    appended is replaced."""
    def place(m: re.Match) -> str:
        line = int(m.group(2)) - offset
        if Path(m.group(1)).name != ANSWER_FILE or line < 1:
            return ""
        return f"(line {line}" + (f", column {int(m.group(3)) + 1}" if m.group(3) else "") + ") "
    message = CITED_PLACE.sub(place, message)
    return GRADER_NAME.sub(PRIVATE_TEXT, message)


def _compile_errors(grade: Grade, offset: int) -> str:
    """The first compile error of the answer's own code, with its place in that code; an error
    the compiler places outside it (the prompt's definitions, the calling program) has none."""
    errs = grade.compile_errors
    e = errs[0]
    name = ERROR_NAMES.get(e.kind, "Error")
    line = e.line - offset
    where = f" at line {line}, column {e.col + 1}" if Path(e.file).name == ANSWER_FILE and line >= 1 else ""
    more = f" ({len(errs)} errors in all; this is the first)" if len(errs) > 1 else ""
    message = answer_terms(e.message, offset)
    message = message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "..."
    return f"Your answer does not compile{more}.\n{name}{where}: {message}\n{ASK_AGAIN}"
