"""What a compile step's reply means for grading: the first error, its class and its location.

The class, the location and the message come from the compiler's own exception and report (the
grader's OCaml tool reports them: `Reply` below), never from the printed
output, where a solution can print anything: `[%%ocaml.error "..."]`, or a warning it enabled
(`[@@@warning "+22"] [@@@ocaml.ppwarning "...\nError: ..."]`). The printed output is parsed only
for a step the tool reported nothing about, and for messages shown to people (`test_error`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

@dataclass
class Reply:
    """What one compile or link step reports: ocamlc's status and stderr, and the tool's facts."""
    returncode: int
    output: str  # what ocamlc would have written on stderr
    timed_out: bool = False
    stage: str = ""  # lexer | parser | typer | linker: where a failure came from
    unbound: str = ""  # the name an "unbound value/type/module/..." error is about
    items: list[int] | None = None  # byte offsets where the file's top-level items start (it parsed)
    denied: list[str] = field(default_factory=list)  # library values and attributes the allowlists do not allow
    loc: tuple[int, int, str] | None = None  # the error's (line, byte column, file), from the compiler's report
    message: str = ""  # the error's message, from the compiler's report (not from `output`)

    @classmethod
    def timeout(cls) -> "Reply":
        """A step stopped by the completion's compile budget."""
        return cls(2, "compiler timed out", timed_out=True)

    @classmethod
    def parse(cls, returncode: int, payload: str) -> "Reply":
        """The tool's reply payload: `key=value` lines, an empty line, then the compiler's output."""
        head, _, output = payload.partition("\n\n")
        facts = dict(line.partition("=")[::2] for line in head.split("\n"))
        items, loc = facts.get("items", ""), facts.get("loc", "").split(",", 2)
        return cls(returncode, output, stage=facts.get("stage", ""), unbound=facts.get("unbound", ""),
                   items=[int(i) for i in items.split(",")] if items else None,
                   denied=facts.get("denied", "").split(),
                   loc=(int(loc[0]), int(loc[1]), loc[2]) if len(loc) == 3 else None,
                   message=facts.get("message", ""))


def parse_reply(data: bytes) -> Reply | None:
    """A whole `RC LEN\n<payload>` reply, or None when it is not one (a crashed or killed tool)."""
    head, sep, rest = data.partition(b"\n")
    try:
        rc, n = (int(x) for x in head.split())
    except ValueError:
        return None
    if not sep or len(rest) < n:
        return None
    return Reply.parse(rc, rest[:n].decode("utf-8", "replace"))


SYNTAX_STAGES = ("lexer", "parser")


@dataclass
class CompileError:
    kind: str  # "syntax" (lexer, parser) | "type" | "unbound" (a type error about a missing name) | "link" | "other"
    #   | "entry" (the entry point missing or not of the prompt's type) | "unverifiable" (the audit: no wire)
    line: int  # 0: the compiler named no location
    message: str
    file: str = ""
    col: int = 0  # the location's first byte on its line
    unbound: str = ""  # for "unbound": the name (`M.x` for a qualified one)


TIMED_OUT = CompileError("other", 0, "compiler timed out")
ERROR_LOCATION_RE = re.compile(r'^File "([^"]+)", lines? (\d+)(?:-\d+)?(?:, characters (\d+)-\d+)?')


def error_kind(reply: Reply) -> str:
    if reply.stage in SYNTAX_STAGES:
        return "syntax"
    if reply.stage == "linker":
        return "link"
    if reply.stage == "typer":
        return "unbound" if reply.unbound else "type"
    return "other"


def error_of(reply: Reply) -> CompileError:
    """The first error of a failed step."""
    if reply.timed_out:
        return TIMED_OUT
    if reply.loc is None and not reply.message:  # the tool reported nothing: ocamlc's printed output
        err = parse_compiler_error(reply.output, error_kind(reply))
    else:
        line, col, file = reply.loc or (0, 0, "")
        err = CompileError(error_kind(reply), line, reply.message[:500], file, col)
    err.unbound = reply.unbound
    return err


def parse_compiler_error(output: str, kind: str = "other") -> CompileError:
    """The first error in ocamlc's output, with its location: the header just above its `Error:`
    line (a warning a solution re-enabled with `[@@@warning "+a"]` prints a header of its own
    earlier, which must not move the blame)."""
    lines = output.splitlines()
    for k, ln in enumerate(lines):
        if ln.startswith("Error:"):
            body = [ln[len("Error:"):].strip()]
            for cont in lines[k + 1:]:
                if not cont.startswith(" ") or ERROR_LOCATION_RE.match(cont):
                    break
                body.append(cont.strip())
            message = " ".join(b for b in body if b)[:500]
            for head in reversed(lines[:k]):
                if m := ERROR_LOCATION_RE.match(head):
                    return CompileError(kind, int(m.group(2)), message, m.group(1), int(m.group(3) or 0))
            return CompileError(kind, 0, message)
    return CompileError(kind, 0, next((ln.strip() for ln in lines if ln.strip()), "unknown compiler failure")[:500])
