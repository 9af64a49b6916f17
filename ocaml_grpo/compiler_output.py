"""What a compile step's reply means for grading: the first error, its class and its location.

The class, the location and the message come from the compiler's own exception and report (the
grader's OCaml tool reports them: ocaml_grpo/compile_server.py `Reply`), never from the printed
output, where a solution can print anything: `[%%ocaml.error "..."]`, or a warning it enabled
(`[@@@warning "+22"] [@@@ocaml.ppwarning "...\nError: ..."]`). The printed output is parsed only
for a step the tool reported nothing about, and for messages shown to people (`test_error`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ocaml_grpo.compile_server import Reply

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
