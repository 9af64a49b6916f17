"""OCaml source text, read as text: a small lexer, top-level phrase splitting, and the
parsing of assertion-style test blocks and prompt signatures.

Nothing here runs the toolchain; ocaml_grpo/grading/grader.py does that, through ocaml_sandbox.py. Keeping the text side apart
makes it testable in microseconds and keeps the sandbox file about isolation.
"""
from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

TOP_LEVEL_KEYWORDS = {"let", "type", "module", "open", "exception", "external", "include", "class"}
OPENERS = {"(", "[", "{", "begin", "struct", "sig", "object"}
CLOSERS = {")", "]", "}", "end"}
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_']*")
NUMBER_RE = re.compile(r"[0-9][0-9a-zA-Z_.']*")
OPERATOR_RE = re.compile(r"[!$%&*+\-./:<=>?@^|~#]+")
# The regular expressions below follow OCaml 4.13's lexer (parsing/lexer.mll) rule by rule: every
# place where this lexer and the compiler's disagree is a place where text can hide from a check.
# `{id|...|id}` and `{%ext id|...|id}` quoted strings; an extension name is identchar+ ('.' identchar+)*.
QUOTED_STRING_RE = re.compile(r"\{(?:%%?[A-Za-z0-9_']+(?:\.[A-Za-z0-9_']+)*[ \t]*)?([a-z_]*)\|")
# Char literals: one byte that is not \\, ' or a newline (OCaml reads bytes, so only ASCII here),
# a newline, or an escape; anything else after a quote is a type variable's quote.
_CHAR_BODY = r"(?:\r?\n|(?![\\'\n\r])[\x00-\x7f]|\\[\\'\"ntbr ]|\\[0-9]{3}|\\o[0-3][0-7]{2}|\\x[0-9a-fA-F]{2})"
CHAR_RE = re.compile(r"'" + _CHAR_BODY + r"'")
COMMENT_CHAR_RE = re.compile(r"''|'" + _CHAR_BODY + r"'")  # inside comments '' is skipped too
# A line directive, `# 900 "solution.ml"`: 4.13's lexer reads one only from a `#` at the very start
# of a line (in code, not in a string or comment), and only with a quoted file name; its line
# number must be an OCaml int, or the directive is a lexer error.
LINE_DIRECTIVE_RE = re.compile(r'#[ \t]*([0-9]+)[ \t]*"[^\r\n"]*"[^\r\n]*')
OCAML_MAX_INT = 2**62 - 1
# Scanning shortcuts (the lexer runs on every completion and test file): the next place a
# comment can change state (in the order _skip_comment tests them); a string's body.
COMMENT_EVENT_RE = re.compile(r"""\(\*|\*\)|"|\{|'""")
STRING_BODY_RE = re.compile(r'(?:[^"\\]|\\[\s\S])*')
# One step of `tokenize`: the blanks before a token (possessive: never given back to `.`), then
# its cases as alternatives (an identifier first: the commonest, and no other case starts with a letter).
TOKEN_RE = re.compile(r"[ \t\r\n\f]*+(?:" + "|".join([
    r"(?P<ident>[A-Za-z_][A-Za-z0-9_']*)", r"(?P<comment>\(\*)", r'(?P<string>")',
    r"(?P<quoted>\{(?:%%?[A-Za-z0-9_']+(?:\.[A-Za-z0-9_']+)*[ \t]*)?(?P<qid>[a-z_]*)\|)",
    r"(?P<char>'" + _CHAR_BODY + "')", r"(?P<quote>')",
    r"(?P<number>[0-9][0-9a-zA-Z_.']*)", r"(?P<symbol>;;|[()\[\]{};,]|[!$%&*+\-./:<=>?@^|~#]+|.)"]) + ")", re.S)


@dataclass(slots=True)
class Token:
    kind: str  # "ident", "symbol", "string", "char", "comment", "directive" (a line directive)
    text: str
    start: int  # offset in the source
    line: int  # 1-based
    col: int  # 0-based


def tokenize(src: str) -> list[Token]:
    """Lex just enough OCaml to know what is code, what is a string and what is a comment.

    Unterminated strings and comments run to the end of the text (the compiler reports them).
    """
    return list(_cached_tokens(src) if len(src) <= TOKEN_CACHE_MAX_CHARS else _tokens(src))


# A grading lexes the same texts several times (the prompt, the answer, then each of its phrases
# for the names it defines): those are memoised, up to a size that bounds the cache's memory
# (~512 x 4 KB of text; a token costs ~150 bytes).
TOKEN_CACHE_MAX_CHARS = 4096


@functools.lru_cache(maxsize=512)
def _cached_tokens(src: str) -> tuple[Token, ...]:
    return _tokens(src)  # tokens are never modified


def _tokens(src: str) -> tuple[Token, ...]:
    tokens: list[Token] = []
    line, line_start, counted = 1, 0, 0  # the line of offset `counted`, and where that line starts
    i, n = 0, len(src)
    while i < n:
        m = TOKEN_RE.match(src, i)
        if m is None:  # only blanks left
            break
        kind = m.lastgroup
        i = m.start(kind)
        if kind == "comment":  # `(*)` opens a comment too, as in OCaml
            end = _skip_comment(src, i + 2)
        elif kind == "string":
            end = _skip_string(src, i)
        elif kind == "quoted":
            kind, end = "string", _skip_quoted(src, m, "qid")
        elif kind in ("quote", "number"):  # a quote that opens no char literal: a type variable's
            kind, end = "symbol", m.end()
        elif kind == "symbol" and (d := _directive_end(src, i)):
            kind, end = "directive", d
        else:
            end = m.end()
        newlines = src.count("\n", counted, i)
        if newlines:
            line += newlines
            line_start = src.rindex("\n", counted, i) + 1
        counted = i
        tokens.append(Token(kind, src[i:end], i, line, i - line_start))
        i = end
    return tuple(tokens)


def _directive_end(src: str, i: int) -> int:
    """End of the line directive starting at i (it runs to the end of its line); 0 if none starts there."""
    if src[i] != "#" or (i and src[i - 1] != "\n"):
        return 0
    m = LINE_DIRECTIVE_RE.match(src, i)
    return m.end() if m and int(m.group(1)) <= OCAML_MAX_INT else 0


def _skip_comment(src: str, j: int) -> int:
    """End of a comment whose opening `(*` ends at j: nested comments, and the strings, quoted
    strings and char literals OCaml's lexer reads inside comments (so `"*)"` does not close one)."""
    depth, n = 1, len(src)
    while j < n and depth:
        m = COMMENT_EVENT_RE.search(src, j)  # everything before it is skipped one by one
        if m is None:
            return n
        j = m.start()
        if src.startswith("(*", j):
            depth, j = depth + 1, j + 2
        elif src.startswith("*)", j):
            depth, j = depth - 1, j + 2
        elif src[j] == '"':
            j = _skip_string(src, j)
        elif src[j] == "{" and (m := QUOTED_STRING_RE.match(src, j)):
            j = _skip_quoted(src, m)
        elif src[j] == "'" and (m := COMMENT_CHAR_RE.match(src, j)):
            j = m.end()
        else:
            j += 1
    return j


def _skip_quoted(src: str, opener: re.Match, group: int | str = 1) -> int:
    """End of a quoted string; the closing `|id}` is searched after the opener, never inside it."""
    close = src.find("|" + opener.group(group) + "}", opener.end())
    return len(src) if close < 0 else close + len(opener.group(group)) + 2


def _skip_string(src: str, i: int) -> int:
    """End of the string opening at i: a backslash escapes the next character; unterminated:
    the end of the text."""
    j = STRING_BODY_RE.match(src, i + 1).end()
    return j + 1 if j < len(src) and src[j] == '"' else len(src)


def strip_line_directives(src: str) -> str:
    """Blank the line directives (`# 900 "solution.ml"`), exactly where OCaml's lexer reads one:
    they move the compiler's error locations, which error counting maps back to phrases. The
    same line inside a string literal or a comment is text, and stays; line numbers are kept."""
    return _blank(src, ("directive",))


def code_tokens(src: str) -> list[Token]:
    return [t for t in tokenize(src) if t.kind != "comment" and t.kind != "directive"]


def strip_comments(src: str) -> str:
    return _blank(src, ("comment",))


def _blank(src: str, kinds: tuple[str, ...]) -> str:
    """src without the tokens of these kinds, each replaced by its newlines (lines are kept)."""
    out, last = [], 0
    for t in tokenize(src):
        if t.kind in kinds:
            out.append(src[last : t.start])
            out.append("\n" * t.text.count("\n"))
            last = t.start + len(t.text)
    out.append(src[last:])
    return "".join(out)


OCAML_BLANKS = " \t\x0c\r"  # the lexer's blanks (a line ends at \n, after any \r)


def count_code_lines(src: str) -> int:
    """Non-empty lines once comments and line directives are removed (the MIN_NON_EMPTY_LINES
    rule: the grader blanks directives), as OCaml's lexer counts lines: only \n ends one
    (Python's splitlines also splits on form feed, U+2028, ...)."""
    return sum(1 for ln in _blank(src, ("comment", "directive")).split("\n") if ln.strip(OCAML_BLANKS))


@dataclass(frozen=True)
class Phrase:
    text: str
    line: int  # first line in the original source (1-based)
    names: tuple[str, ...] = ()  # values/types/modules it defines
    start: int = 0  # offset of its first character in the original source
    values: tuple[str, ...] = ()  # the values among its names (`let` / `and`)


def _depth_changes(tok: Token) -> int:
    if tok.kind != "ident" and tok.kind != "symbol":
        return 0
    if tok.text in OPENERS:
        return 1
    if tok.text in CLOSERS:
        return -1
    return 0


def split_phrases(src: str) -> list[Phrase]:
    """Split a compilation unit into top-level phrases.

    A phrase starts at a top-level keyword in column 0 at bracket depth 0, or after `;;`.
    A column-0 `let` that is closed by its own `in` is an expression (badly indented
    `let ... in`), so it is merged back into the phrase before it.
    """
    return list(_cached_phrases(src) if len(src) <= TOKEN_CACHE_MAX_CHARS else _phrases(src))


@functools.lru_cache(maxsize=512)
def _cached_phrases(src: str) -> tuple[Phrase, ...]:
    return _phrases(src)  # a grading splits the prompt, the answer and the solution more than once


def _phrases(src: str) -> tuple[Phrase, ...]:
    toks = code_tokens(src)
    cuts: list[int] = []  # token indexes where phrases start
    depth = 0
    after_double_semi = True
    for k, t in enumerate(toks):
        if t.text == ";;" and depth <= 0:
            after_double_semi = True
            continue
        starts = depth <= 0 and (after_double_semi or (t.col == 0 and t.kind == "ident" and t.text in TOP_LEVEL_KEYWORDS))
        if starts:
            cuts.append(k)
            depth = 0
        after_double_semi = False
        depth += _depth_changes(t)
    # merge let-in chunks into the previous phrase
    kept: list[int] = []
    for idx, k in enumerate(cuts):
        end = cuts[idx + 1] if idx + 1 < len(cuts) else len(toks)
        if kept and toks[k].text == "let" and _is_let_in(toks[k:end]):
            continue
        kept.append(k)
    offsets = [0]  # where each line starts, lines as the lexer counts them (only \n ends one)
    for ln in src.split("\n"):
        offsets.append(offsets[-1] + len(ln) + 1)
    # whole first lines, comments before a phrase on its line included
    return tuple(_phrases_at(src, [offsets[toks[k].line - 1] for k in kept], toks))


def phrases_from_starts(src: str, starts: list[int]) -> list[Phrase]:
    """The phrases beginning at these offsets, each running to the next; leading comments belong
    to the first. Used with the lexer's cuts, or with the compiler's own structure items."""
    return _phrases_at(src, starts, code_tokens(src))


def _phrases_at(src: str, starts: list[int], toks: list[Token]) -> list[Phrase]:
    """phrases_from_starts, with src's code tokens already lexed."""
    starts = sorted({s for s in starts if 0 <= s < len(src)}) or [0]
    starts[0] = 0
    tokens_between = _token_slicer(toks)
    phrases = []
    line, counted = 1, 0  # the line of offset `counted`: newlines are counted once, start to end
    for idx, start in enumerate(starts):
        end = starts[idx + 1] if idx + 1 < len(starts) else len(src)
        line += src.count("\n", counted, start)
        counted = start
        text = src[start:end]
        if text.strip():
            bindings = _bindings_in(tokens_between(start, end))
            phrases.append(Phrase(text=text, line=line, names=tuple(n for _, n in bindings),
                                  start=start, values=tuple(_values(bindings))))
    return phrases


def _token_slicer(toks: list[Token]):
    """`between(start, end)`: those of a text's code tokens that start in [start, end): lexed in
    context (a comment or string that runs into a phrase stays one token), offsets into the text."""
    offsets = [t.start for t in toks]
    return lambda start, end: toks[bisect.bisect_left(offsets, start):bisect.bisect_left(offsets, end)]


def _is_let_in(toks: list[Token]) -> bool:
    depth, lets, ins = 0, 0, 0
    for t in toks:
        if t.text == ";;" and depth <= 0:
            break
        if depth == 0 and t.text == "let":
            lets += 1
        elif depth == 0 and t.text == "in":
            ins += 1
        depth += _depth_changes(t)
    return ins >= lets > 0


BINDERS = ("let", "and", "type", "module", "exception", "external")


def defined_names(phrase: str) -> list[str]:
    """Names a top-level phrase binds: `let [rec] f`, `and g`, `type t`, `module M`, `exception E`."""
    return [name for _, name in _bindings(phrase)]


def defined_values(phrase: str) -> list[str]:
    """Values a top-level phrase binds with `let` / `and` (`let[@inline never] rec f`, `let%ext f`)."""
    return _values(_bindings(phrase))


def _values(bindings: list[tuple[str, str]]) -> list[str]:
    values, in_let = [], False
    for keyword, name in bindings:
        in_let = keyword == "let" or (keyword == "and" and in_let)
        if in_let:
            values.append(name)
    return values


def _bindings(phrase: str) -> list[tuple[str, str]]:
    return _bindings_in(code_tokens(phrase))


def _bindings_in(toks: list[Token] | tuple[Token, ...]) -> list[tuple[str, str]]:
    """(keyword, name) for each definition at depth 0 of a phrase's code tokens. A `let` closed by
    its own `in` is an expression, not a definition (its names, and those of its `and`s, are local)."""
    found: list[tuple[str, str, int]] = []  # keyword, name, index of the let it belongs to (-1: none)
    open_lets: list[int] = []  # depth-0 lets not yet closed by an `in`
    local: set[int] = set()
    last_let, depth = -1, 0
    for k, t in enumerate(toks):
        if depth == 0 and t.kind == "ident":
            if t.text == "in" and open_lets:
                local.add(open_lets.pop())
            elif t.text in BINDERS:
                if t.text == "let":
                    last_let = k
                    open_lets.append(k)
                j = _skip_binder_modifiers(toks, k + 1)
                owner = last_let if t.text in ("let", "and") else -1
                if j < len(toks) and toks[j].kind == "ident" and toks[j].text not in ("open", "in", "type"):
                    found.append((t.text, toks[j].text, owner))
                elif j + 2 < len(toks) and toks[j].text == "(" and toks[j + 2].text == ")":
                    found.append((t.text, toks[j + 1].text, owner))  # an operator: let ( = ) ...
        depth += _depth_changes(t)
    return [(kw, name) for kw, name, owner in found if owner not in local]


def _skip_binder_modifiers(toks: list[Token], j: int) -> int:
    """Past what may stand between a binder and its name: `%ext`, `[@attr ...]`, `rec`, `nonrec`,
    `module type`, and type parameters (`'a`, `+'a`, `_`, `('a, 'b)`)."""
    while j < len(toks):
        t = toks[j].text
        if t == "%" and j + 1 < len(toks):  # let%ext: the extension name, dotted
            j += 2
            while j + 1 < len(toks) and toks[j].text == ".":
                j += 2
        elif t == "[" and j + 1 < len(toks) and toks[j + 1].text.startswith("@"):
            depth = 0
            while j < len(toks):
                depth += _depth_changes(toks[j])
                j += 1
                if depth == 0:
                    break
        elif t in ("rec", "nonrec", "_", "+", "-", "!", "+!", "-!", "!+", "!-") or (t == "type" and j > 0
                                                                                and toks[j - 1].text != "module"):
            j += 1
        elif t == "'":  # a type parameter: the quote, then its name
            j += 2
        elif t == "(" and j + 1 < len(toks) and toks[j + 1].text in ("'", "_", "+", "-"):
            depth = 0
            while j < len(toks):  # ('a, 'b): the parameter list
                depth += _depth_changes(toks[j])
                j += 1
                if depth == 0:
                    break
        else:
            return j
    return j


# ---------------------------------------------------------------------------------------------
# Prompts: preamble (types defined before the doc comment) and the entry point's signature line.

@dataclass
class Signature:
    preamble: str  # everything before the signature line (type definitions, doc comment)
    signature: str  # the `let name (x : t) : r =` line
    entry: str  # the function's name


SIGNATURE_RE = re.compile(r"^let(?:%[\w.]+)?(?:\s*\[@[^\]]*\])*\s+(?:rec\s+)?([a-z_][A-Za-z0-9_']*)\b.*=\s*$")


def parse_signature(prompt: str) -> Signature | None:
    """The last top-level `let name ... =` of a prompt is the entry point."""
    lines = prompt.rstrip().splitlines()
    for idx in range(len(lines) - 1, -1, -1):
        m = SIGNATURE_RE.match(lines[idx].strip()) if not lines[idx].startswith((" ", "\t", "*")) else None
        if m:
            preamble = "\n".join(lines[:idx]) + ("\n" if idx else "")
            return Signature(close_prose_comment(preamble), "\n".join(lines[idx:]), m.group(1))
    return None


def close_prose_comment(preamble: str) -> str:
    """The preamble with its doc comment closed where its author closed it.

    Prose can open comments OCaml nests (`adenine (**A** )` in a markdown description): the doc
    comment then swallows the definitions after it, and the compiler reports it unterminated.
    When the preamble's first comment runs to its end, it ends at its first line that is only
    `*)`, and each `(*` inside it is spaced apart so that the compiler reads it the same way.
    A preamble that OCaml reads as its author meant is returned as it is."""
    toks = tokenize(preamble)
    first = next((t for t in toks if t.kind == "comment"), None)
    closed = first is not None and len(tokenize(first.text + "\nx")) > 1  # the comment ends before the x
    if first is None or closed or not (m := re.search(r"^\*\)[ \t]*$", preamble[first.start:], re.M)):
        return preamble
    end = first.start + m.start()
    body = preamble[first.start + 2:end].replace("(*", "( *")
    return preamble[:first.start + 2] + body + preamble[end:]


# ---------------------------------------------------------------------------------------------
# Tests: `let () = assert (...); assert (...); ... ;;` split into single assertions.

@dataclass
class TestBlock:
    """One `let () = ...` phrase: leading `let x = e in` bindings, then statements.
    A statement is an assertion (graded) or a plain expression (run as written)."""
    bindings: list[str]
    statements: list[tuple[bool, str]]  # (is_assertion, text)


@dataclass
class TestPlan:
    items: list[str | TestBlock]  # other phrases (helper definitions) are kept verbatim
    n_assertions: int


def parse_assert_tests(tests: str) -> TestPlan | None:
    """Return the per-assertion plan, or None when the tests are not assertion-style
    (then they are graded all-or-nothing)."""
    items: list[str | TestBlock] = []
    n = 0
    tokens_between = _token_slicer(code_tokens(tests))
    for ph in split_phrases(tests):
        block = _parse_unit_let(tests, tokens_between(ph.start, ph.start + len(ph.text)))
        if block is None:
            items.append(ph.text)
            continue
        items.append(block)
        n += sum(1 for is_assert, _ in block.statements if is_assert)
    return TestPlan(items, n) if n else None


def assertion_count(plan: TestPlan | None) -> int:
    """Graded units of a test block: its assertions, or 1 for all-or-nothing tests."""
    return plan.n_assertions if plan else 1


def _parse_unit_let(text: str, toks: list[Token]) -> TestBlock | None:
    """One phrase's `let () = ...` block, from its code tokens (offsets into `text`)."""
    if len(toks) < 5 or [t.text for t in toks[:4]] != ["let", "(", ")", "="]:
        return None
    end = len(toks)
    while end > 4 and toks[end - 1].text == ";;":
        end -= 1
    body = toks[4:end]
    bindings: list[str] = []
    while body and body[0].text == "let":
        k = _matching_in(body)
        if k is None:
            return None
        bindings.append(_span(text, body[0], body[k]))
        body = body[k + 1 :]
    statements: list[tuple[bool, str]] = []
    for part in _split_top_level(body, ";"):
        if not part:
            continue
        stmt = _span(text, part[0], part[-1])
        if [t.text for t in part] == ["(", ")"]:
            continue
        inner = part
        while len(inner) > 2 and inner[0].text == "(" and _closes_at_end(inner):
            inner = inner[1:-1]
        statements.append((bool(inner) and inner[0].text == "assert", stmt))
    return TestBlock(bindings, statements)


def _span(text: str, first: Token, last: Token) -> str:
    return text[first.start : last.start + len(last.text)]


def _matching_in(toks: list[Token]) -> int | None:
    depth, lets = 0, 0
    for k, t in enumerate(toks):
        if depth == 0 and t.text == "let":
            lets += 1
        elif depth == 0 and t.text == "in":
            lets -= 1
            if lets == 0:
                return k
        depth += _depth_changes(t)
    return None


def _closes_at_end(toks: list[Token]) -> bool:
    depth = 0
    for k, t in enumerate(toks):
        depth += _depth_changes(t)
        if depth == 0:
            return k == len(toks) - 1
    return False


def _split_top_level(toks: list[Token], sep: str) -> list[list[Token]]:
    parts: list[list[Token]] = [[]]
    depth = 0
    for t in toks:
        if depth == 0 and t.text == sep:
            parts.append([])
            continue
        depth += _depth_changes(t)
        parts[-1].append(t)
    return parts


# ---------------------------------------------------------------------------------------------
# Stand-ins: what a phrase the compiler rejected declares, so the phrases after it can be checked
# for errors of their own (grader._count_errors).

def stand_in(phrase: str) -> tuple[str, set[str]]:
    """A text that type-checks and declares what `phrase` defines, as loosely as OCaml allows:
    each value at every type (`external f : 'a = "%identity"`), each type abstract with its
    arity, each `module M = struct ... end` as a module of its body's stand-ins; and every name
    the phrase declares, its constructors, labels and exceptions included (an error about one of
    those in a later phrase only follows from the rejected phrase)."""
    return _stand_in(code_tokens(phrase))


def _stand_in(toks: list[Token]) -> tuple[str, set[str]]:
    out: list[str] = []
    names: set[str] = set()
    context, depth, k = "", 0, 0
    while k < len(toks):
        t = toks[k]
        if depth == 0 and t.kind == "ident" and t.text in ("let", "type", "module", "exception", "external", "and",
                                                              "open", "include", "class"):
            context = context if t.text == "and" else t.text
            if context == "module" and t.text == "module":
                j = _skip_binder_modifiers(toks, k + 1)
                if j + 2 < len(toks) and toks[j].kind == "ident" and toks[j + 1].text == "=" and toks[j + 2].text == "struct":
                    end, d = j + 2, 0
                    while end < len(toks):
                        d += _depth_changes(toks[end])
                        if d == 0:
                            break
                        end += 1
                    body, inner = _stand_in(toks[j + 3:end])
                    names.add(toks[j].text)
                    names |= {f"{toks[j].text}.{n}" for n in inner}  # its constructors, as `M.C`
                    out.append(f"module {toks[j].text} = struct\n{body}end\n")
                    k = end + 1
                    continue
            if context in ("let", "type", "module", "exception", "external"):
                j = _skip_binder_modifiers(toks, k + 1)
                name = (toks[j].text if j < len(toks) and toks[j].kind == "ident" and toks[j].text not in ("open", "in", "type")
                        else toks[j + 1].text if j + 2 < len(toks) and toks[j].text == "(" and toks[j + 2].text == ")"
                        else "")
                if name and context not in ("let", "external"):  # values: below, as the compiler scopes them
                    names.add(name)
                    if context == "type" and name[0].islower() and not (j + 1 < len(toks) and toks[j + 1].text == "+="):
                        arity = _type_arity(toks[k + 1:j])
                        params = "" if not arity else ("'a0 " if arity == 1 else
                                                       "(" + ", ".join(f"'a{i}" for i in range(arity)) + ") ")
                        out.append(f"type {params}{name}\n")
        elif context == "type" and t.kind == "ident":
            prev = toks[k - 1].text if k else ""
            after = toks[k + 1].text if k + 1 < len(toks) else ""
            if depth == 0 and t.text[0].isupper() and prev in ("=", "|") and after != ".":
                names.add(t.text)  # a constructor
            elif depth == 1 and prev in ("{", ";", "mutable") and after == ":":
                names.add(t.text)  # a label
        depth += _depth_changes(t)
        k += 1
    bindings = _bindings_in(toks)
    values = _values(bindings) + [n for kw, n in bindings if kw == "external"]
    names.update(values)
    return "".join(f"external {v if v[0].isalpha() or v[0] == '_' else f'( {v} )'} : 'a = \"%identity\"\n"
                   for v in values) + "".join(out), names


def _type_arity(params: list[Token]) -> int:
    """How many parameters stand between `type` and a type's name (`'a`, `('a, 'b)`, `_`)."""
    quotes = sum(1 for t in params if t.text == "'") + sum(1 for t in params if t.text == "_")
    return quotes
