"""The entry points' interface, read from the prompt, and the code that carries their values
across the wire (ocaml/wire.ml) between the two programs of a grading:

- the trusted program (T): the prompt's definitions, a stub per entry point at the prompt's type
  that asks the oracle, then the tests. It never runs model code and decides every assertion;
- the oracle (U): the answer as module `Solution`, each entry point bound at the prompt's type
  (a mismatch is the answer's error, in `entry.ml`), serving T's calls with values only.

The wire format follows each type: Stdlib's basic types, lists, arrays, options, results, tuples,
the prompt's own variants, records and polymorphic variants, functions (as handles both ways:
higher-order entry points, functions returned), and type variables (as ranks of the call's values:
a polymorphic answer can only compare them). What has no wire format (an abstract type, a library
type such as `Hashtbl.t`, a type variable inside a function type, a mutable field) makes the
problem unverifiable: `Interface.unverifiable` says why, and such a problem earns no test credit.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from ocaml_grpo import ocaml_source as src

BUILTINS = {"int", "float", "bool", "char", "string", "bytes", "unit", "int32", "int64", "list", "array",
            "option", "result"}
ALIASES = {"Result.t": "result", "Stdlib.result": "result", "Stdlib.Result.t": "result", "List.t": "list",
           "Option.t": "option", "Array.t": "array", "String.t": "string", "Int.t": "int", "Float.t": "float",
           "Bool.t": "bool", "Char.t": "char", "Bytes.t": "bytes", "Int64.t": "int64", "Int32.t": "int32"}
# Where a definition phrase of the prompt is kept for the trusted program (prose is not).
PREAMBLE_KEEP = {"type", "exception", "module", "open", "include", "let", "class"}

TOKEN_RE = re.compile(r"\s*(?:(?P<var>'[A-Za-z_][A-Za-z0-9_']*)|(?P<tag>`[A-Za-z_][A-Za-z0-9_']*)"
                      r"|(?P<id>[A-Za-z_][A-Za-z0-9_']*(?:\.[A-Za-z_][A-Za-z0-9_']*)*)|(?P<sym>->|[()*,\[\]|:;{}=~?<>.]))")


KEYWORDS = {"of", "and", "mutable", "private", "type", "exception", "let", "val", "module", "open", "nonrec"}
DEFINITION_START = re.compile(r"(?m)^(?=(?:type|exception|let|module|open|include|class)\b)")
# Exercism's prompts list the interface to implement in a comment: `val name : type` lines.
INTERFACE_RE = re.compile(r"Implement the following interface[^\n]*\n([\s\S]*?)\*\)")


class Unverifiable(Exception):
    """The interface has no wire format (the message says what)."""


# Types: ("var", name) | ("con", name, (args...)) | ("tuple", (items...)) | ("arrow", label, arg, res)
#      | ("poly", ((tag, type or None), ...))
Type = tuple


@dataclass(frozen=True)
class TypeDef:
    name: str
    params: tuple[str, ...]
    kind: str  # alias | variant | record | poly
    body: object  # alias: Type; variant: ((ctor, (types...)), ...); record: ((field, Type), ...); poly: tags


@dataclass(frozen=True)
class Entry:
    name: str
    params: tuple[tuple[str, Type], ...]  # (label: "" or the ~label's name, type)
    result: Type

    def vars(self) -> list[str]:
        out: list[str] = []
        for t in [p for _, p in self.params] + [self.result]:
            _collect_vars(t, out)
        return out


@dataclass(frozen=True)
class Interface:
    entries: tuple[Entry, ...] = ()
    types: tuple[TypeDef, ...] = ()
    exceptions: tuple[tuple[str, tuple[Type, ...]], ...] = ()
    preamble: str = ""  # the prompt's definitions, for the trusted program
    unverifiable: str = ""  # why the tests cannot run against an oracle ("" when they can)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]


def _collect_vars(t: Type, out: list[str]) -> None:
    if t[0] == "var":
        if t[1] not in out:
            out.append(t[1])
    elif t[0] == "con":
        for a in t[2]:
            _collect_vars(a, out)
    elif t[0] == "tuple":
        for a in t[1]:
            _collect_vars(a, out)
    elif t[0] == "arrow":
        _collect_vars(t[2], out)
        _collect_vars(t[3], out)
    elif t[0] == "poly":
        for _, a in t[1]:
            if a is not None:
                _collect_vars(a, out)


# ---------------------------------------------------------------------------------------------
# Reading types from the prompt's text (the compiler checks what is generated from it, at both ends).

class _Tokens:
    def __init__(self, text: str):
        self.toks: list[str] = []
        pos, text = 0, text.rstrip()
        while pos < len(text):
            m = TOKEN_RE.match(text, pos)
            if not m or m.end() == pos:
                raise Unverifiable(f"cannot read the type text {text[pos:pos + 30]!r}")
            self.toks.append(m.group(m.lastgroup))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i = 0

    def peek(self, k: int = 0) -> str:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else ""

    def take(self, want: str | None = None) -> str:
        t = self.peek()
        if want is not None and t != want:
            raise Unverifiable(f"expected {want!r} in a type, found {t or 'the end'!r}")
        self.i += 1
        return t


def _is_ident(t: str) -> bool:
    return bool(t) and (t[0].isalpha() or t[0] == "_")


def _parse_type(tk: _Tokens) -> Type:
    label = ""
    if tk.peek() == "?" and _is_ident(tk.peek(1)) and tk.peek(2) == ":":
        label = "?" + tk.peek(1)
        tk.i += 3
    elif _is_ident(tk.peek()) and tk.peek(1) == ":":
        label = tk.peek()
        tk.i += 2
    left = _parse_tuple(tk)
    if tk.peek() == "->":
        tk.take()
        return ("arrow", label, left, _parse_type(tk))
    if label:
        raise Unverifiable(f"a labelled type {label}: without an arrow")
    return left


def _parse_tuple(tk: _Tokens) -> Type:
    items = [_parse_app(tk)]
    while tk.peek() == "*":
        tk.take()
        items.append(_parse_app(tk))
    return items[0] if len(items) == 1 else ("tuple", tuple(items))


def _parse_app(tk: _Tokens) -> Type:
    if tk.peek() == "(":
        tk.take()
        args = [_parse_type(tk)]
        while tk.peek() == ",":
            tk.take()
            args.append(_parse_type(tk))
        tk.take(")")
        if len(args) > 1:
            if not _is_ident(tk.peek()):
                raise Unverifiable("a type argument list without its type constructor")
            t: Type = ("con", tk.take(), tuple(args))
        else:
            t = args[0]
    elif tk.peek() == "[":
        t = _parse_poly(tk)
    elif tk.peek().startswith("'"):
        t = ("var", tk.take()[1:])
    elif _is_ident(tk.peek()) and tk.peek() not in KEYWORDS:
        t = ("con", tk.take(), ())
    else:
        raise Unverifiable(f"cannot read a type at {tk.peek() or 'the end'!r}")
    while _is_ident(tk.peek()) and tk.peek() not in KEYWORDS:
        t = ("con", tk.take(), (t,))
    return t


def _parse_poly(tk: _Tokens) -> Type:
    tk.take("[")
    if tk.peek() in ("<", ">"):
        raise Unverifiable("an open polymorphic variant type")
    if tk.peek() == "|":
        tk.take()
    tags = []
    while True:
        tag = tk.take()
        if not tag.startswith("`"):
            raise Unverifiable(f"a polymorphic variant tag expected, found {tag!r}")
        arg = None
        if tk.peek() == "of":
            tk.take()
            arg = _parse_type(tk)
        tags.append((tag[1:], arg))
        if tk.peek() != "|":
            break
        tk.take()
    tk.take("]")
    return ("poly", tuple(tags))


def _parse_typedefs(text: str) -> list[TypeDef]:
    tk = _Tokens(text)
    tk.take("type")
    if tk.peek() == "nonrec":
        tk.take()
    defs = []
    while True:
        params: list[str] = []
        if tk.peek().startswith("'"):
            params = [tk.take()[1:]]
        elif tk.peek() == "(":
            tk.take()
            while True:
                params.append(tk.take()[1:])
                if tk.peek() != ",":
                    break
                tk.take()
            tk.take(")")
        name = tk.take()
        if not _is_ident(name):
            raise Unverifiable(f"cannot read the type definition of {name!r}")
        if tk.peek() != "=":
            defs.append(TypeDef(name, tuple(params), "abstract", None))
        else:
            tk.take("=")
            if tk.peek() == "private":
                raise Unverifiable(f"type {name} is private")
            defs.append(_parse_body(tk, name, tuple(params)))
        if tk.peek() != "and":
            break
        tk.take()
    if tk.peek():
        raise Unverifiable(f"cannot read the type definition at {tk.peek()!r}")
    return defs


def _parse_body(tk: _Tokens, name: str, params: tuple[str, ...]) -> TypeDef:
    if tk.peek() == "{":
        tk.take()
        fields = []
        while tk.peek() != "}":
            if tk.peek() == "mutable":
                raise Unverifiable(f"type {name} has a mutable field")
            fname = tk.take()
            tk.take(":")
            fields.append((fname, _parse_type(tk)))
            if tk.peek() == ";":
                tk.take()
        tk.take("}")
        return TypeDef(name, params, "record", tuple(fields))
    if tk.peek() == "|" or (tk.peek()[:1].isupper() and "." not in tk.peek()):
        ctors = []
        if tk.peek() == "|":
            tk.take()
        while True:
            ctor = tk.take()
            if not ctor[:1].isupper():
                raise Unverifiable(f"cannot read a constructor of {name}: {ctor!r}")
            args: tuple[Type, ...] = ()
            if tk.peek() == "of":
                tk.take()
                if tk.peek() == "{":
                    raise Unverifiable(f"type {name} has an inline record")
                args = (_parse_app(tk),)
                while tk.peek() == "*":
                    tk.take()
                    args += (_parse_app(tk),)
            ctors.append((ctor, args))
            if tk.peek() != "|":
                break
            tk.take()
        return TypeDef(name, params, "variant", tuple(ctors))
    t = _parse_type(tk)
    if t[0] == "poly":
        return TypeDef(name, params, "poly", t)
    return TypeDef(name, params, "alias", t)


def _parse_exception(text: str) -> tuple[str, tuple[Type, ...]]:
    tk = _Tokens(text)
    tk.take("exception")
    name = tk.take()
    args: tuple[Type, ...] = ()
    if tk.peek() == "of":
        tk.take()
        args = (_parse_app(tk),)
        while tk.peek() == "*":
            tk.take()
            args += (_parse_app(tk),)
    if tk.peek():
        raise Unverifiable(f"cannot read exception {name}")
    return name, args


def _parse_signature_line(line: str, entry: str) -> Entry:
    tk = _Tokens(src.strip_comments(line))
    tk.take("let")
    if tk.peek() == "rec":
        tk.take()
    name = tk.take()
    if name != entry:
        raise Unverifiable(f"the signature line defines {name!r}, not the entry point {entry!r}")
    params: list[tuple[str, Type]] = []
    while tk.peek() not in (":", "=", ""):
        label = ""
        if tk.peek() == "?":
            raise Unverifiable(f"entry point {entry} has an optional parameter")
        if tk.peek() == "~":
            tk.take()
            if tk.peek() != "(":
                raise Unverifiable(f"parameter ~{tk.peek()} of {entry} has no type")
            label = tk.peek(1)
        if tk.peek() != "(":
            raise Unverifiable(f"parameter {tk.peek()} of {entry} has no type")
        tk.take("(")
        if tk.peek() == ")":
            tk.take()
            params.append(("", ("con", "unit", ())))
            continue
        tk.take()  # the parameter's name
        tk.take(":")
        params.append((label, _parse_type(tk)))
        tk.take(")")
    if tk.peek() != ":":
        raise Unverifiable(f"entry point {entry} has no result type")
    tk.take(":")
    result = _parse_type(tk)
    tk.take("=")
    return Entry(name, tuple(params), result)


VAL_RE = re.compile(r"(?m)^[ \t]*val[ \t]+([a-z_][A-Za-z0-9_']*)[ \t]*:[ \t]*((?:(?!^[ \t]*val[ \t])(?!\*\))[\s\S])*)")


def _entry_of_val(name: str, text: str) -> Entry:
    tk = _Tokens(text)
    t = _parse_type(tk)
    if tk.peek():
        raise Unverifiable(f"cannot read the type of {name} at {tk.peek()!r}")
    params = []
    while t[0] == "arrow":
        params.append((t[1], t[2]))
        t = t[3]
    return Entry(name, tuple(params), t)


@functools.lru_cache(maxsize=1024)
def interface_of(prompt: str, entry: str) -> Interface:
    """The entry point's interface and the prompt's definitions (cached: a group shares its prompt)."""
    sig = src.parse_signature(prompt)
    if sig is None or not entry:
        return Interface(unverifiable="the prompt has no `let name ... =` signature line")
    kept = [ph.text for ph in src.split_phrases(sig.preamble) if _first_word(ph.text) in PREAMBLE_KEEP]
    preamble = "".join(kept)
    try:
        types, exceptions = [], []
        for text in kept:
            for code in DEFINITION_START.split(src.strip_comments(text)):
                code = code.strip().rstrip(";").strip()
                if _first_word(code) == "type":
                    types += _parse_typedefs(code)
                elif _first_word(code) == "exception":
                    exceptions.append(_parse_exception(code))
        e = _parse_signature_line(sig.signature.strip().splitlines()[0], entry)
        # The interface a prompt lists (`val name : type` lines, as Exercism's do) declares more
        # entry points the tests may call.
        entries = {e.name: e}
        listed = INTERFACE_RE.search(prompt)
        for m in VAL_RE.finditer(listed.group(1) if listed else ""):
            if m.group(1) not in entries:
                entries[m.group(1)] = _entry_of_val(m.group(1), m.group(2))
        iface = Interface(tuple(entries.values()), tuple(types), tuple(exceptions), preamble)
        _check(iface)
        return iface
    except Unverifiable as why:
        return Interface(preamble=preamble, unverifiable=str(why))


def _first_word(text: str) -> str:
    toks = src.code_tokens(text)
    return toks[0].text if toks else ""


# ---------------------------------------------------------------------------------------------
# What has a wire format.

def _check(iface: Interface) -> None:
    defs = {d.name: d for d in iface.types}

    def ok(t: Type, in_arrow: bool, params: tuple[str, ...] | None) -> None:
        kind = t[0]
        if kind == "var":
            if in_arrow:
                raise Unverifiable("a type variable inside a function type")
            if params is not None and t[1] not in params:
                raise Unverifiable(f"type variable '{t[1]} is unbound")
        elif kind == "con":
            name = ALIASES.get(t[1], t[1])
            if t[1] in defs:
                d = defs[t[1]]
                if d.kind == "abstract":
                    raise Unverifiable(f"type {d.name} is abstract: its values cannot cross the wire")
                if len(d.params) != len(t[2]):
                    raise Unverifiable(f"type {d.name} takes {len(d.params)} arguments")
            elif name not in BUILTINS:
                raise Unverifiable(f"type {t[1]} has no wire format (a library's or an abstract type)")
            for a in t[2]:
                ok(a, in_arrow, params)
        elif kind == "tuple":
            for a in t[1]:
                ok(a, in_arrow, params)
        elif kind == "arrow":
            if t[1]:
                raise Unverifiable("a labelled function type inside a value")
            ok(t[2], True, params)
            ok(t[3], True, params)
        elif kind == "poly":
            for _, a in t[1]:
                if a is not None:
                    ok(a, in_arrow, params)

    for d in iface.types:
        if d.kind == "alias":
            ok(d.body, False, d.params)
        elif d.kind == "poly":
            ok(d.body, False, d.params)
        elif d.kind == "variant":
            for _, args in d.body:
                for a in args:
                    ok(a, False, d.params)
        elif d.kind == "record":
            for _, a in d.body:
                ok(a, False, d.params)
    for _, args in iface.exceptions:
        for a in args:
            ok(a, False, ())
    for e in iface.entries:
        for _, p in e.params:
            ok(p, False, None)
        ok(e.result, False, None)
        # an entry point's own arrows are curried parameters only
        if e.result[0] == "arrow" and any(v for v in e.vars()):
            raise Unverifiable("a polymorphic entry point that returns a function")


# ---------------------------------------------------------------------------------------------
# Code generation. `side` is "T" (prompt types in scope) or "U" (the answer's, as Solution.*).

class _Gen:
    def __init__(self, iface: Interface, wire: str, side: str):
        self.iface, self.W, self.side = iface, wire, side
        self.defs = {d.name: d for d in iface.types}
        self.q = "" if side == "T" else "Solution."

    def resolve(self, t: Type) -> Type:
        """Aliases of the prompt expanded (their parameters substituted)."""
        while t[0] == "con" and t[1] in self.defs and self.defs[t[1]].kind in ("alias", "poly"):
            d = self.defs[t[1]]
            t = _subst(d.body, dict(zip(d.params, t[2])))
        return t

    # -- types as OCaml text
    def ty(self, t: Type, vars_as: dict[str, str]) -> str:
        t = self.resolve(t)
        k = t[0]
        if k == "var":
            return vars_as.get(t[1], "'" + t[1])
        if k == "con":
            args = [self.ty(a, vars_as) for a in t[2]]
            if t[1] in self.defs:
                name = self.q + t[1]
            else:
                name = {"result": "Stdlib.result"}.get(ALIASES.get(t[1], t[1]), ALIASES.get(t[1], t[1]))
            if not args:
                return name
            return f"{args[0]} {name}" if len(args) == 1 else "(" + ", ".join(args) + ") " + name
        if k == "tuple":
            return "(" + " * ".join(self.ty(a, vars_as) for a in t[1]) + ")"
        if k == "arrow":
            lab = f"{t[1]}:" if t[1] else ""
            return f"({lab}{self.ty(t[2], vars_as)} -> {self.ty(t[3], vars_as)})"
        if k == "poly":
            return "[ " + " | ".join(f"`{tag}" + (f" of {self.ty(a, vars_as)}" if a is not None else "")
                                     for tag, a in t[1]) + " ]"
        raise AssertionError(t)

    # -- writers: OCaml expressions of type Buffer.t -> τ -> unit
    def w(self, t: Type, env: dict[str, str]) -> str:
        W = self.W
        t = self.resolve(t)
        k = t[0]
        if k == "var":
            return env[t[1]]
        if k == "con":
            name = ALIASES.get(t[1], t[1])
            if t[1] in self.defs:
                return "(" + " ".join([f"w_{t[1]}"] + [self.w(a, env) for a in t[2]]) + ")"
            if name in ("list", "array", "option"):
                return f"({W}.w_{name} {self.w(t[2][0], env)})"
            if name == "result":
                return f"({W}.w_result {self.w(t[2][0], env)} {self.w(t[2][1], env)})"
            return f"{W}.w_{name}"
        if k == "tuple":
            xs = [f"x{i}" for i in range(len(t[1]))]
            body = "; ".join(f"{self.w(a, env)} b {x}" for a, x in zip(t[1], xs))
            return f"(fun b ({', '.join(xs)}) -> {body})"
        if k == "arrow":
            args, res = _uncurry(t)
            xs = [f"y{i}" for i in range(len(args))]
            reads = " ".join(f"let {x} = {self.r(a, env)} r in" for a, x in zip(args, xs))
            return f"(fun b f -> {W}.w_fun b (fun r b -> {reads} {W}.r_end r; {self.w(res, env)} b (f {' '.join(xs)})))"
        if k == "poly":
            cases = []
            for tag, a in t[1]:
                if a is None:
                    cases.append(f"`{tag} -> {W}.w_ptag b {_ocaml_string(tag)}")
                else:
                    cases.append(f"`{tag} x -> {W}.w_ptag b {_ocaml_string(tag)}; {self.w(a, env)} b x")
            return "(fun b v -> match v with " + " | ".join(cases) + ")"
        raise AssertionError(t)

    # -- readers: OCaml expressions of type W.reader -> τ
    def r(self, t: Type, env: dict[str, str]) -> str:
        W = self.W
        t = self.resolve(t)
        k = t[0]
        if k == "var":
            return env["r:" + t[1]]
        if k == "con":
            name = ALIASES.get(t[1], t[1])
            if t[1] in self.defs:
                return "(" + " ".join([f"r_{t[1]}"] + [self.r(a, env) for a in t[2]]) + ")"
            if name in ("list", "array", "option"):
                return f"({W}.r_{name} {self.r(t[2][0], env)})"
            if name == "result":
                return f"({W}.r_result {self.r(t[2][0], env)} {self.r(t[2][1], env)})"
            return f"{W}.r_{name}"
        if k == "tuple":
            xs = [f"x{i}" for i in range(len(t[1]))]
            reads = " ".join(f"let {x} = {self.r(a, env)} r in" for a, x in zip(t[1], xs))
            return f"(fun r -> {reads} ({', '.join(xs)}))"
        if k == "arrow":
            args, res = _uncurry(t)
            xs = [f"y{i}" for i in range(len(args))]
            writes = "; ".join(f"{self.w(a, env)} b {x}" for a, x in zip(args, xs))
            return (f"(fun r -> let h = {W}.r_handle r in fun {' '.join(xs)} -> "
                    f"{W}.call h (fun b -> {writes}) {self.r(res, env)})")
        if k == "poly":
            cases = []
            for tag, a in t[1]:
                if a is None:
                    cases.append(f"{_ocaml_string(tag)} -> `{tag}")
                else:
                    cases.append(f"{_ocaml_string(tag)} -> `{tag} ({self.r(a, env)} r)")
            return f"(fun r -> match {W}.r_ptag r with " + " | ".join(cases) + f" | _ -> Stdlib.raise {W}.Bad)"
        raise AssertionError(t)

    # -- the prompt's variants and records: recursive writer/reader pairs
    def codecs(self) -> str:
        W, q = self.W, self.q
        named = [d for d in self.iface.types if d.kind in ("variant", "record")]
        if not named:
            return ""
        out = []
        for d in named:
            env = {p: f"w_{p}" for p in d.params} | {"r:" + p: f"r_{p}" for p in d.params}
            pw = " ".join(f"w_{p}" for p in d.params)
            pr = " ".join(f"r_{p}" for p in d.params)
            if d.kind == "variant":
                wc, rc = [], []
                for i, (c, args) in enumerate(d.body):
                    xs = [f"x{j}" for j in range(len(args))]
                    pat = f"{q}{c}" + (f" ({', '.join(xs)})" if xs else "")
                    ws = "".join(f"; {self.w(a, env)} b {x}" for a, x in zip(args, xs))
                    wc.append(f"{pat} -> {W}.w_tag b {i}{ws}")
                    reads = " ".join(f"let {x} = {self.r(a, env)} r in" for a, x in zip(args, xs))
                    rc.append(f"{i} -> {reads} {pat}")
                wbody = "match v with " + " | ".join(wc)
                rbody = f"match {W}.r_tag r with " + " | ".join(rc) + f" | _ -> Stdlib.raise {W}.Bad"
            else:
                wbody = "; ".join(f"{self.w(a, env)} b v.{q}{f}" for f, a in d.body)
                reads = " ".join(f"let x_{f} = {self.r(a, env)} r in" for f, a in d.body)
                rbody = f"{reads} {{ " + "; ".join(f"{q}{f} = x_{f}" for f, _ in d.body) + " }"
            tparams = [f"'{p}" for p in d.params]
            tname = (("(" + ", ".join(tparams) + ") " if len(tparams) > 1 else (tparams[0] + " " if tparams else ""))
                     + q + d.name)
            quant = (" ".join(tparams) + ". ") if tparams else ""
            wt = "".join(f"(Stdlib.Buffer.t -> {p} -> unit) -> " for p in tparams)
            rt = "".join(f"({W}.reader -> {p}) -> " for p in tparams)
            out.append(f"w_{d.name} : {quant}{wt}Stdlib.Buffer.t -> {tname} -> unit = fun {pw} b v -> {wbody}")
            out.append(f"r_{d.name} : {quant}{rt}{W}.reader -> {tname} = fun {pr} r -> {rbody}")
        return "let rec " + "\nand ".join(out) + "\n"

    def exception_codec(self) -> str:
        if not self.iface.exceptions:
            return ""
        W, q = self.W, self.q
        wc, rc = [], []
        for i, (name, args) in enumerate(self.iface.exceptions):
            xs = [f"x{j}" for j in range(len(args))]
            pat = f"{q}{name}" + (f" ({', '.join(xs)})" if xs else "")
            ws = "".join(f"; {self.w(a, {})} b {x}" for a, x in zip(args, xs))
            wc.append(f"{pat} -> {W}.w_tag b {i}{ws}; true")
            reads = " ".join(f"let {x} = {self.r(a, {})} r in" for a, x in zip(args, xs))
            rc.append(f"{i} -> {reads} {pat}")
        return (f"let () = {W}.prompt_exn_w := (fun b e -> match e with " + " | ".join(wc) + " | _ -> false)\n"
                f"let () = {W}.prompt_exn_r := (fun k r -> match k with " + " | ".join(rc)
                + f" | _ -> Stdlib.raise {W}.Bad)\n")


def _uncurry(t: Type) -> tuple[list[Type], Type]:
    args = []
    while t[0] == "arrow":
        args.append(t[2])
        t = t[3]
    return args, t


def _subst(t: Type, m: dict[str, Type]) -> Type:
    k = t[0]
    if k == "var":
        return m.get(t[1], t)
    if k == "con":
        return ("con", t[1], tuple(_subst(a, m) for a in t[2]))
    if k == "tuple":
        return ("tuple", tuple(_subst(a, m) for a in t[1]))
    if k == "arrow":
        return ("arrow", t[1], _subst(t[2], m), _subst(t[3], m))
    if k == "poly":
        return ("poly", tuple((tag, None if a is None else _subst(a, m)) for tag, a in t[1]))
    return t


def _ocaml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_array(g: _Gen, t: Type) -> str:
    t = g.resolve(t)
    if t[0] == "con" and ALIASES.get(t[1], t[1]) in ("array", "bytes") and t[1] not in g.defs:
        return ALIASES.get(t[1], t[1])
    return ""


def _labelled(label: str, x: str) -> str:
    return f"{label}:{x}" if label.startswith("?") else (f"~{label}:{x}" if label else x)


def _param_type(label: str, t: Type) -> Type:
    """What a parameter's variable holds: an optional one is an option."""
    return ("con", "option", (t,)) if label.startswith("?") else t


def _same_params(g: _Gen, e: Entry) -> list[int]:
    """The array (or bytes) parameters of the result's own type: the result may be one of them."""
    if not _is_array(g, e.result):
        return []
    want = g.ty(e.result, {})
    return [i for i, (_, p) in enumerate(e.params) if _is_array(g, p) and g.ty(p, {}) == want]


def trusted_stubs(iface: Interface, wire: str) -> str:
    """T's code between the prompt's definitions and the tests: codecs, then one stub per entry
    point, at the prompt's type, that asks the oracle (handle k = the k-th entry point)."""
    g = _Gen(iface, wire, "T")
    out = [g.codecs(), g.exception_codec()]
    for k, e in enumerate(iface.entries):
        vs = e.vars()
        env = {v: f"({wire}.w_var tb {i})" for i, v in enumerate(vs)} | {"r:" + v: f"({wire}.r_var tb {i})"
                                                                          for i, v in enumerate(vs)}
        full = e.result
        for label, p in reversed(e.params):
            full = ("arrow", label, p, full)
        quant = (" ".join("'" + v for v in vs) + ". ") if vs else ""
        ty = g.ty(full, {}) if e.params else g.ty(e.result, {})
        xs = [f"a{i}" for i in range(len(e.params))]
        binders = " ".join(_labelled(lab, x) for (lab, _), x in zip(e.params, xs))
        writes = "; ".join(_arg_writer(g, k, i, lab, p, env) + f" b {x}"
                           for i, ((lab, p), x) in enumerate(zip(e.params, xs))) or "()"
        backs = "".join(f" {wire}.blit_back {x} ({wire}.r_array {g.r(g.resolve(p)[2][0], env)} r);"
                        if _is_array(g, p) == "array" else f" {wire}.bytes_back {x} ({wire}.r_bytes r);"
                        for (_, p), x in zip(e.params, xs) if _is_array(g, p))
        same = _same_params(g, e)
        value = g.r(e.result, env) + " r"
        if same:  # the oracle says when the result is one of the arguments, as the tests may check (==)
            value = (f"(match {wire}.r_int r with -1 -> {value} | "
                     + " | ".join(f"{i} -> {xs[i]}" for i in same) + f" | _ -> Stdlib.raise {wire}.Bad)")
        read = f"(fun r -> let v = {value} in{backs} v)"
        body = (f"let tb = {wire}.tokens {len(vs)} in " if vs else "") + f"let write b = {writes} in "
        body += (f"{wire}.seal tb write; " if vs else "") + f"{wire}.call {k} write {read}"
        if e.params:
            out.append(f"let {e.name} : {quant}{ty} = fun {binders} -> {body}\n")
        else:
            out.append(f"let {e.name} : {ty} = {body}\n")
    return "".join(out)


def oracle_server(iface: Interface, wire: str, lambdas: tuple["Lambda", ...] = (), lambda_unit: str = "") -> str:
    """U's code after the answer's `Solution` module: each entry point bound at the prompt's type
    (type variables as the wire's tokens), registered as handle k, then the serve loop.
    `lambdas` (compiled in `lambda_unit`): the tests' closures it holds as well."""
    g = _Gen(iface, wire, "U")
    out = [g.codecs(), g.exception_codec()]
    for k, e in enumerate(iface.entries):
        env = {v: f"{wire}.Tok.w" for v in e.vars()} | {"r:" + v: f"{wire}.Tok.r" for v in e.vars()}
        tok = {v: f"{wire}.Tok.t" for v in e.vars()}
        full = e.result
        for label, p in reversed(e.params):
            full = ("arrow", label, p, full)
        out.append(f"let entry_{k} : {g.ty(full, tok)} = Solution.{e.name}\n")
        xs = [f"a{i}" for i in range(len(e.params))]
        reads = " ".join(f"let {x} = {_arg_reader(g, k, i, lab, p, env, lambdas, lambda_unit)} r in"
                         for i, ((lab, p), x) in enumerate(zip(e.params, xs)))
        args = " ".join(_labelled(lab, x) for (lab, _), x in zip(e.params, xs))
        backs = "".join(f"; {wire}.w_array {g.w(g.resolve(p)[2][0], env)} b {x}" if _is_array(g, p) == "array"
                        else f"; {wire}.w_bytes b {x}" for (_, p), x in zip(e.params, xs) if _is_array(g, p))
        call = f"entry_{k} {args}" if e.params else f"entry_{k}"
        write = f"{g.w(e.result, env)} b v"
        same = _same_params(g, e)
        if same:
            which = " else ".join(f"if v == {xs[i]} then {i}" for i in same) + " else -1"
            write = f"(match {which} with -1 -> {wire}.w_int b (-1); {write} | i -> {wire}.w_int b i)"
        out.append(f"let () = ignore ({wire}.register (fun r b -> {reads} {wire}.r_end r; "
                   f"let v = {call} in {write}{backs}))\n")
    out.append(f"let () = {wire}.serve ()\n")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The tests' closures the oracle holds too: a function written in the tests as an argument of an
# entry point (`apply_n (fun x -> x + 1) n 0`) is compiled into the oracle from the same text, so
# calling it costs the answer no round trip to the trusted program (~17 us each, measured).
# Only closed code of Stdlib's types qualifies; what does not compile alone stays a handle.

SITE_STRIDE = 64  # a call site is entry * SITE_STRIDE + parameter
NOT_AN_ARGUMENT = {"in", "then", "else", "with", "do", "done", "and", "let", "if", "match", "fun", "function",
                   "when", "to", "downto", "of", "begin", "end", "try", "mod", "land", "lor", "lxor", "lsl", "lsr",
                   "asr", "or", "not", "assert", "lazy", "true", "false"}


@dataclass(frozen=True)
class Lambda:
    j: int
    site: int
    start: int  # offsets of its text in the tests
    end: int
    text: str
    type: Type


def _shippable_type(g: _Gen, t: Type) -> bool:
    t = g.resolve(t)
    if t[0] == "con":
        return t[1] not in g.defs and ALIASES.get(t[1], t[1]) in BUILTINS and all(_shippable_type(g, a) for a in t[2])
    if t[0] == "tuple":
        return all(_shippable_type(g, a) for a in t[1])
    if t[0] == "arrow":
        return not t[1] and _shippable_type(g, t[2]) and _shippable_type(g, t[3])
    return False


def shippable(iface: Interface, tests: str) -> tuple[Lambda, ...]:
    """The closures written as arguments of entry points in the tests' text."""
    g = _Gen(iface, "W", "U")
    entries = {e.name: (k, e) for k, e in enumerate(iface.entries)
               if e.params and all(not lab for lab, _ in e.params)
               and any(_shippable_type(g, p) and g.resolve(p)[0] == "arrow" for _, p in e.params)}
    if not entries:
        return ()
    toks = src.code_tokens(tests)
    out: list[Lambda] = []
    for idx, tok in enumerate(toks):
        if tok.kind != "ident" or tok.text not in entries:
            continue
        if idx and toks[idx - 1].text in ("let", "and", ".", "~", "?", "rec", "val"):
            continue
        k, e = entries[tok.text]
        pos = idx + 1
        for i, (_, p) in enumerate(e.params):
            span = _atom(toks, pos)
            if span is None:
                break
            first, last = span
            text = tests[toks[first].start:toks[last].start + len(toks[last].text)]
            is_fun = toks[first].text == "(" and last > first + 1  # a lambda, an operator section, ...
            is_name = first == last and toks[first].kind == "ident" or (toks[first].kind == "ident" and all(
                toks[x].text == "." or toks[x].kind == "ident" for x in range(first, last + 1)))
            if g.resolve(p)[0] == "arrow" and _shippable_type(g, p) and (is_fun or is_name):
                out.append(Lambda(len(out), k * SITE_STRIDE + i, toks[first].start,
                                  toks[last].start + len(toks[last].text), text, p))
            pos = last + 1
    return tuple(out)


def _atom(toks: list, pos: int) -> tuple[int, int] | None:
    """The token span of one argument at `pos` (a bracketed group, a literal or a dotted name)."""
    if pos >= len(toks):
        return None
    t = toks[pos]
    if t.text in ("(", "[", "{", "begin"):
        depth = 0
        for q in range(pos, len(toks)):
            depth += src._depth_changes(toks[q])
            if depth == 0:
                return pos, q
        return None
    if t.kind in ("string", "char") or (t.kind == "ident" and t.text[0].isdigit()):
        return pos, pos
    if t.kind == "ident" and t.text not in NOT_AN_ARGUMENT and (t.text[0].islower() or t.text[0] == "_"
                                                                 or t.text[0].isdigit()):
        return pos, pos
    if t.kind == "ident" and t.text[0].isupper():  # a path M.x (a constructor alone is an argument too)
        q = pos
        while q + 2 < len(toks) and toks[q + 1].text == "." and toks[q + 2].kind == "ident":
            q += 2
        return pos, q
    if t.kind not in ("symbol", "ident"):
        return pos, pos
    return None


def rewrite_tests(tests: str, lambdas: tuple[Lambda, ...], wire: str) -> str:
    """The tests with each shipped closure marked where it is written."""
    out = tests
    for lam in sorted(lambdas, key=lambda x: -x.start):
        out = out[:lam.start] + f"({wire}.shipped {lam.site} {lam.j} ({lam.text}))" + out[lam.end:]
    return out


def lambda_unit_text(iface: Interface, lambdas: tuple[Lambda, ...]) -> str:
    """The closures as a unit of their own (Stdlib only): each under a line directive naming it,
    so a compile error says which one cannot be shipped."""
    g = _Gen(iface, "W", "U")
    return "".join(f'# 1 "lambda_{lam.j}.ml"\nlet l_{lam.j} : {g.ty(lam.type, {})} = ({lam.text})\n;;\n'
                   for lam in lambdas)


def _arg_writer(g: _Gen, k: int, i: int, label: str, p: Type, env: dict[str, str]) -> str:
    t = g.resolve(p)
    if label or t[0] != "arrow":
        return g.w(_param_type(label, p), env)
    args, res = _uncurry(t)
    ys = [f"y{n}" for n in range(len(args))]
    reads = " ".join(f"let {y} = {g.r(a, env)} r in" for a, y in zip(args, ys))
    return (f"(fun b f -> {g.W}.w_fun_at b {k * SITE_STRIDE + i} (Obj.repr f) (fun r b -> {reads} {g.W}.r_end r; "
            f"{g.w(res, env)} b (f {' '.join(ys)})))")


def _arg_reader(g: _Gen, k: int, i: int, label: str, p: Type, env: dict[str, str],
                lambdas: tuple[Lambda, ...], unit: str) -> str:
    here = [lam.j for lam in lambdas if lam.site == k * SITE_STRIDE + i]
    plain = g.r(_param_type(label, p), env)
    if not here or not unit:
        return plain
    W = g.W
    cases = " | ".join(f"{j} -> {unit}.l_{j}" for j in here)
    return (f"(fun r -> let h = {W}.r_int r in if h >= 0 then {plain} ({W}.reader (Stdlib.string_of_int h ^ \" \")) "
            f"else match - h - 1 with {cases} | _ -> Stdlib.raise {W}.Bad)")
