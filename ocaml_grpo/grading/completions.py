"""From a model's completion to the OCaml unit the grader compiles, and the names the tests call.

Shared by the reward (rewards.py), the dataset audit (which compiles each problem's tests
against a stub assembled the same way) and the benchmarks, so that all of them agree on what
an answer is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ocaml_grpo.grading import source as src
from ocaml_grpo.prompting import END_MARKER

FENCE = "```"
# What follows a fence's backticks on its opening line: blanks, then the tag (the rest of the line is ignored).
FENCE_TAG_RE = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
OCAML_TAGS = {"", "ocaml", "ml", "caml", "ocaml-repl"}
# The prompt's definitions an answer that restates the function still needs in front of it.
PREAMBLE_KEEP = {"type", "exception", "module", "open", "include", "let", "class"}

# OCaml 4.13's keywords (manual, "Lexical conventions"): none of them can name a value.
OCAML_KEYWORDS = frozenset("""
    and as assert asr begin class constraint do done downto else end exception external false for fun function
    functor if in include inherit initializer land lazy let lor lsl lsr lxor match method mod module mutable new
    nonrec object of open or private rec sig struct then to true try type val virtual when while with""".split())
# A value name starts with a lowercase letter or `_`; a capitalised name is a constructor or a
# module, so `let Strongest_Extension = ...` (a name kept from a Python original) never compiles.
VALUE_NAME_RE = re.compile(r"[a-z_][A-Za-z0-9_']*")


def is_value_name(name: str) -> bool:
    return bool(VALUE_NAME_RE.fullmatch(name)) and name not in OCAML_KEYWORDS and name != "_"


# Lone surrogates (valid in JSON, "\ud800") cannot be written as UTF-8: a file, a hash or a log line
# holding one raises. Text is cleaned once, where a completion enters.
SURROGATE_RE = re.compile("[\ud800-\udfff]")


def completion_text(completion) -> str:
    """The completion's text, each lone surrogate replaced by U+FFFD. TRL passes plain strings,
    or (conversational) a list of messages; a message whose content is not text is a ValueError."""
    if isinstance(completion, list):
        parts = [m.get("content", "") for m in completion if isinstance(m, dict)]
    elif isinstance(completion, dict):
        parts = [completion.get("content", "")]
    else:
        parts = [completion if isinstance(completion, str) else str(completion)]
    for part in parts:
        if not isinstance(part, str):
            raise ValueError(f"a message's content is {type(part).__name__}, not text")
    return SURROGATE_RE.sub("\ufffd", "".join(parts))


@dataclass
class Fence:
    tag: str  # as written after the backticks: "ocaml", "OCaml", "" for none
    body: str
    end: int  # offset just past the closing backticks (the text's length when unclosed)


def fences(text: str) -> list[Fence]:
    """The fenced blocks, in order: backticks, an optional tag, the rest of that line, then the
    body up to the next backticks or the end of the text (a runaway's unclosed block). A scan with
    str.find, linear in the text: a regular expression backtracked quadratically on backticks."""
    blocks: list[Fence] = []
    at = 0
    while (start := text.find(FENCE, at)) >= 0:
        tag = FENCE_TAG_RE.match(text, start + len(FENCE))
        newline = text.find("\n", tag.end())
        if newline < 0:  # no line can open a block from here on
            break
        close = text.find(FENCE, newline + 1)
        body_end = close if close >= 0 else len(text)
        at = close + len(FENCE) if close >= 0 else len(text)
        blocks.append(Fence(tag.group(1), text[newline + 1:body_end], at))
    return blocks


def extract_code(text: str) -> str:
    """Fenced blocks tagged ocaml/ml or untagged (joined), else the raw text. An unclosed
    fence (a runaway completion) counts up to the end."""
    blocks = [f.body for f in fences(text) if f.tag.lower() in OCAML_TAGS]
    if blocks:
        return "\n".join(b.rstrip() for b in blocks) + "\n"
    if FENCE in text:  # only other languages fenced: nothing OCaml to grade
        return ""
    return text


def has_end_marker(text: str) -> bool:
    """The END marker counts on a line of its own after the last code block: where the prompt
    asks for it, once the answer is complete. Anywhere else it proves nothing (written first, it
    let an answer ramble to the length limit and still count as finished). Without a block the
    whole text is code, and the marker must be its last line."""
    blocks = fences(text)
    if not blocks:
        return text.rstrip().rpartition("\n")[2].strip() == END_MARKER
    # the lines after the one that holds the last block's closing backticks
    return any(ln.strip() == END_MARKER for ln in text[blocks[-1].end:].split("\n")[1:])


def entry_point_for(prompt: str, entry_point: str = "") -> str:
    """The name the tests call: the row's `entry_point` when it is an OCaml value name, else
    the prompt's signature (a row's invalid entry point would make every answer fail)."""
    if is_value_name(entry_point):
        return entry_point
    sig = src.parse_signature(prompt)
    return sig.entry if sig else ""


def invalid_entry_point_note(prompt: str, entry_point: str) -> str:
    """Why a row's entry point is ignored ("" when it is used as given)."""
    if not entry_point or is_value_name(entry_point):
        return ""
    used = entry_point_for(prompt, entry_point)
    return (f"entry_point {entry_point!r} is not an OCaml value name; "
            + (f"the prompt's signature `{used}` is used instead" if used else "the prompt has no signature either"))


def assemble_solution(code: str, prompt: str, entry_point: str = "") -> tuple[str, list[str]]:
    """The solution unit to compile and the entry points the tests call.

    A completion that defines the entry point is a full answer: the prompt's own type
    definitions go in front unless the completion restates them. Otherwise it is a body:
    it goes after the prompt's signature line."""
    sig = src.parse_signature(prompt)
    entry = entry_point_for(prompt, entry_point)
    if sig is None:
        return code, [entry] if entry else []
    code_phrases = src.split_phrases(code)
    code_names = {n for ph in code_phrases for n in ph.names}
    if entry and (any(entry in ph.values for ph in code_phrases) or _is_definitions(code)):
        # Keep the prompt's definitions (types, exceptions, modules) the answer does not restate;
        # drop its prose and any stray text.
        kept = [ph.text for ph in prompt_definitions(sig.preamble) if not (set(ph.names) & code_names)]
        return "".join(kept).rstrip() + "\n\n" + code, [entry]
    return (sig.preamble + sig.signature).rstrip() + "\n" + code, [entry]


def _is_definitions(code: str) -> bool:
    """Top-level definitions, not an expression: however they bind the entry point (a typed
    pattern `let (f : t) = ...`, `include` of the answer's own module), the oracle finds it by
    name, or says which entry point is missing."""
    toks = src.code_tokens(code)
    return bool(toks) and toks[0].text in src.TOP_LEVEL_KEYWORDS and not src._is_let_in(toks)


def prompt_definitions(preamble: str) -> list[src.Phrase]:
    """The definitions before a prompt's signature line (types, exceptions, modules, helpers),
    without its prose: what an answer and the tests are built on."""
    return [ph for ph in src.split_phrases(preamble) if first_word(ph.text) in PREAMBLE_KEEP]


def first_word(text: str) -> str:
    toks = src.code_tokens(text)
    return toks[0].text if toks else ""
