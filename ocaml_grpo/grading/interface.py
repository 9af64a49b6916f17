"""The entry points' interface, read from the prompt: each entry point's parameters and result,
the prompt's own types and exceptions, and whether all of it has a wire format (ocaml/wire.ml).

What has none (an abstract type, a library type such as `Hashtbl.t`, a functor over anything but an
ordered type, a record with a mutable field where what changes in it cannot be written back: inside
a variant, through a function, in a type that holds itself) makes the problem unverifiable: `Interface.unverifiable` says why,
and such a problem earns no test credit. The types are read from the prompt's text; everything
generated from them is checked by the compiler at both ends (oracle.py).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.completions import first_word, prompt_definitions

BUILTINS = {"int", "float", "bool", "char", "string", "bytes", "unit", "int32", "int64", "list", "array",
            "option", "result", "ref"}
ALIASES = {"Result.t": "result", "Stdlib.result": "result", "Stdlib.Result.t": "result", "List.t": "list",
           "Option.t": "option", "Array.t": "array", "String.t": "string", "Int.t": "int", "Float.t": "float",
           "Bool.t": "bool", "Char.t": "char", "Bytes.t": "bytes", "Int64.t": "int64", "Int32.t": "int32"}

TOKEN_RE = re.compile(r"\s*(?:(?P<var>'[A-Za-z_][A-Za-z0-9_']*)|(?P<tag>`[A-Za-z_][A-Za-z0-9_']*)"
                      r"|(?P<id>[A-Za-z_][A-Za-z0-9_']*(?:\.[A-Za-z_][A-Za-z0-9_']*)*)|(?P<sym>->|[()*,\[\]|:;{}=~?<>.]))")


# Base's maps, `v Map.M(K).t`: they cross as their sorted (key, value) list, K one of these (read as
# Base's modules; a problem that names them requires `base`).
MAP_KEYS = {"String": "string", "Char": "char", "Int": "int"}
MAP_RE = re.compile(r"(?:Base\.)?Map\.M\((\w+)\)\.t")


# React's signals (a problem that names them requires `react`): an entry point may return one (the
# trusted program mirrors it), not take one.
SIGNALS = {"signal", "React.signal", "S.t", "React.S.t"}


def map_key(name: str) -> str | None:
    """K of a Base map type's name `Map.M(K).t` (None: not one)."""
    m = MAP_RE.fullmatch(name)
    return m.group(1) if m else None


KEYWORDS = {"of", "and", "mutable", "private", "type", "exception", "let", "val", "module", "open", "nonrec"}
DEFINITION_START = re.compile(r"(?m)^(?=(?:type|exception|let|module|open|include|class)\b)")
# Exercism's prompts list the interface to implement in a comment: `val name : type` lines.
INTERFACE_RE = re.compile(r"Implement (?:the following interface|all of)[^\n]*\n([\s\S]*?)\*\)")  # Exercism's, ocaml.org's


class Unverifiable(Exception):
    """The interface has no wire format (the message says what)."""


# Types: ("var", name) | ("con", name, (args...)) | ("tuple", (items...)) | ("arrow", label, arg, res)
#      | ("poly", ((tag, type or None), ...))
Type = tuple


@dataclass(frozen=True)
class TypeDef:
    name: str
    params: tuple[str, ...]
    kind: str  # alias | variant | record | poly | abstract | handle (abstract, listed by the interface)
    body: object  # alias: Type; variant: ((ctor, (types...)), ...); record: ((field, Type), ...); poly: tags
    mutable: frozenset[str] = frozenset()  # a record's mutable fields


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
class Functor:
    """An entry point that is a functor over an ordered type (Exercism's custom-set:
    `module Make : functor (El : ELEMENT) -> sig ... end`, ELEMENT = `type t`, `compare`). Its
    result's values are the interface's entries, `El.t` in them the type variable ELEMENT_VAR (a
    token: the answer can only compare elements, by `El.compare`, which calls the tests' own) and
    its abstract types handles of the instance the tests' application made."""
    name: str  # Make
    param: str  # El
    result_sig: str  # the prompt's `sig ... end` of the result, as written
    types_text: str  # its type definitions but the abstract ones, for the trusted program


ELEMENT_VAR = "grader_el"
TOKEN_TYPES = 8  # the wire's Tok0..Tok7: an entry point's type variables, one abstract type each
ORDERED_SIG = "sig type t val compare : t -> t -> int end"


@dataclass(frozen=True)
class Interface:
    entries: tuple[Entry, ...] = ()
    types: tuple[TypeDef, ...] = ()
    exceptions: tuple[tuple[str, tuple[Type, ...]], ...] = ()
    preamble: str = ""  # the prompt's definitions, for the trusted program
    unverifiable: str = ""  # why the tests cannot run against an oracle ("" when they can)
    functor: Functor | None = None  # the entries are this functor's result's values

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]


def subst(t: Type, m: dict[str, Type]) -> Type:
    """t with its type variables replaced as `m` says."""
    k = t[0]
    if k == "var":
        return m.get(t[1], t)
    if k == "con":
        return ("con", t[1], tuple(subst(a, m) for a in t[2]))
    if k == "tuple":
        return ("tuple", tuple(subst(a, m) for a in t[1]))
    if k == "arrow":
        return ("arrow", t[1], subst(t[2], m), subst(t[3], m))
    if k == "poly":
        return ("poly", tuple((tag, None if a is None else subst(a, m)) for tag, a in t[1]))
    return t


def mentions(t: Type, names: set[str]) -> bool:
    """Whether a type constructor of `names` occurs in `t`."""
    if t[0] == "con":
        return t[1] in names or any(mentions(a, names) for a in t[2])
    if t[0] == "tuple":
        return any(mentions(a, names) for a in t[1])
    if t[0] == "arrow":
        return mentions(t[2], names) or mentions(t[3], names)
    if t[0] == "poly":
        return any(a is not None and mentions(a, names) for _, a in t[1])
    return False


def type_vars(t: Type) -> list[str]:
    """The type variables `t` mentions, in order."""
    out: list[str] = []
    _collect_vars(t, out)
    return out


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


def _constructor(tk: _Tokens) -> str:
    """A type constructor's name: a path, or Base's `Map.M(K).t` (its functor application)."""
    name = tk.take()
    if name.endswith("Map.M") and tk.peek() == "(" and _is_ident(tk.peek(1)) and tk.peek(2) == ")" \
            and tk.peek(3) == "." and tk.peek(4) == "t":
        key = tk.toks[tk.i + 1]
        tk.i += 5
        return f"Map.M({key}).t"
    return name


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
            t: Type = ("con", _constructor(tk), tuple(args))
        else:
            t = args[0]
    elif tk.peek() == "[":
        t = _parse_poly(tk)
    elif tk.peek().startswith("'"):
        t = ("var", tk.take()[1:])
    elif _is_ident(tk.peek()) and tk.peek() not in KEYWORDS:
        t = ("con", _constructor(tk), ())
    else:
        raise Unverifiable(f"cannot read a type at {tk.peek() or 'the end'!r}")
    while _is_ident(tk.peek()) and tk.peek() not in KEYWORDS:
        t = ("con", _constructor(tk), (t,))
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
        fields, mutable = [], set()
        while tk.peek() != "}":
            if tk.peek() == "mutable":
                tk.take()
                mutable.add(tk.peek())
            fname = tk.take()
            tk.take(":")
            fields.append((fname, _parse_type(tk)))
            if tk.peek() == ";":
                tk.take()
        tk.take("}")
        return TypeDef(name, params, "record", tuple(fields), frozenset(mutable))
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


ABSTRACT_RE = re.compile(r"(?m)^[ \t]*type[ \t]+((?:'[A-Za-z_][A-Za-z0-9_']*|\([^)]*\))[ \t]+)?([a-z_][A-Za-z0-9_']*)[ \t]*$")
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
    listed = INTERFACE_RE.search(prompt)
    if sig is None and listed and FUNCTOR_RE.search(listed.group(1)):
        try:
            return _functor_interface(listed.group(1))
        except Unverifiable as why:
            return Interface(unverifiable=str(why))
    if sig is None or not entry:
        return Interface(unverifiable="the prompt has no `let name ... =` signature line")
    kept = [ph.text for ph in prompt_definitions(sig.preamble)]
    preamble = "".join(kept)
    try:
        types, exceptions = [], []
        for text in kept:
            for code in DEFINITION_START.split(src.strip_comments(text)):
                code = code.strip().rstrip(";").strip()
                if first_word(code) == "type":
                    types += _parse_typedefs(code)
                elif first_word(code) == "exception":
                    exceptions.append(_parse_exception(code))
        e = _parse_signature_line(sig.signature.strip().splitlines()[0], entry)
        # The interface a prompt lists (`val name : type` lines, as Exercism's do) declares more
        # entry points the tests may call.
        entries = {e.name: e}
        for m in VAL_RE.finditer(listed.group(1) if listed else ""):
            if m.group(1) not in entries:
                entries[m.group(1)] = _entry_of_val(m.group(1), m.group(2))
        # An abstract type the listed interface declares (`type bst`) and the prompt does not
        # define: its values stay in the oracle and cross as handles.
        defined = {d.name for d in types}
        for m in ABSTRACT_RE.finditer(listed.group(1) if listed else ""):
            params = tuple(re.findall(r"'([A-Za-z_][A-Za-z0-9_']*)", m.group(1) or ""))
            if m.group(2) not in defined:
                types.append(TypeDef(m.group(2), params, "handle", None))
        iface = Interface(tuple(entries.values()), tuple(types), tuple(exceptions), preamble)
        _check(iface)
        return iface
    except Unverifiable as why:
        return Interface(preamble=preamble, unverifiable=str(why))


FUNCTOR_RE = re.compile(r"(?m)^[ \t]*module[ \t]+([A-Z][A-Za-z0-9_']*)\s*:\s*functor\s*\(\s*([A-Z][A-Za-z0-9_']*)\s*:\s*"
                        r"([A-Z][A-Za-z0-9_']*)\s*\)\s*->\s*sig\b([\s\S]*)\bend\s*\Z")
MODULE_TYPE_RE = re.compile(r"module[ \t]+type[ \t]+([A-Z][A-Za-z0-9_']*)\s*=\s*sig\b([\s\S]*?)\bend\b")
ITEM_START = re.compile(r"(?m)^[ \t]*(?=(?:type|val)\b)")


def _functor_interface(listed: str) -> Interface:
    """The interface of a functor entry point over an ordered type, from the interface a prompt
    lists (no signature line): its result's values, `El.t` as a token, abstract types as handles."""
    m = FUNCTOR_RE.search(listed)
    name, param, param_type, body = m.groups()
    params = {t: " ".join(b.split()) for t, b in MODULE_TYPE_RE.findall(listed)}
    if f"sig {params.get(param_type, '')} end" != ORDERED_SIG:
        raise Unverifiable(f"functor {name}: its parameter {param_type} is not an ordered type ({ORDERED_SIG})")
    if re.search(r"\b(?:sig|struct|module|functor|exception|class|external)\b", body):
        raise Unverifiable(f"functor {name}: its result holds more than types and values")
    element = ("var", ELEMENT_VAR)
    elements = {f"{param}.t"}
    types: list[TypeDef] = []
    kept_types: list[str] = []
    entries: list[Entry] = []
    for item in filter(None, (x.strip() for x in ITEM_START.split(body))):
        if item.startswith("val"):
            vm = re.fullmatch(r"val\s+([a-z_][A-Za-z0-9_']*)\s*:([\s\S]*)", item)
            if not vm:
                raise Unverifiable(f"functor {name}: cannot read {item[:40]!r}")
            e = _entry_of_val(vm.group(1), vm.group(2))
            swap = functools.partial(_replace_cons, names=elements, by=element)
            entries.append(Entry(e.name, tuple((lab, swap(t)) for lab, t in e.params), swap(e.result)))
            continue
        for d in _parse_typedefs(item):
            if d.kind == "abstract":
                types.append(TypeDef(d.name, d.params, "handle", None))
            elif d.kind == "alias" and d.body == ("con", f"{param}.t", ()) and not d.params:
                elements.add(d.name)  # `type el = El.t`
                kept_types.append(item)
            else:
                types.append(d)
                kept_types.append(item)
    if any(e.vars() != [ELEMENT_VAR] and e.vars() for e in entries):
        raise Unverifiable(f"functor {name}: a value with a type variable of its own")
    iface = Interface(tuple(entries), tuple(types), functor=Functor(name, param, f"sig{body}end", "\n".join(kept_types)))
    _check(iface)
    return iface


def _replace_cons(t: Type, names: set[str], by: Type) -> Type:
    """`t` with every type constructor of `names` (no arguments) replaced by `by`."""
    k = t[0]
    if k == "con":
        return by if t[1] in names and not t[2] else ("con", t[1], tuple(_replace_cons(a, names, by) for a in t[2]))
    if k == "tuple":
        return ("tuple", tuple(_replace_cons(a, names, by) for a in t[1]))
    if k == "arrow":
        return ("arrow", t[1], _replace_cons(t[2], names, by), _replace_cons(t[3], names, by))
    if k == "poly":
        return ("poly", tuple((tag, None if a is None else _replace_cons(a, names, by)) for tag, a in t[1]))
    return t


# ---------------------------------------------------------------------------------------------
# What has a wire format.

def _members(d: TypeDef) -> list[Type]:
    """The types a value of the prompt's type `d` holds directly: an alias's body, a record's fields,
    a variant's constructors' arguments, a polymorphic variant's."""
    inner = ([d.body] if d.kind in ("alias", "poly") else [a for _, a in d.body] if d.kind == "record"
             else [a for _, args in d.body for a in args] if d.kind == "variant" else [])
    return [a for a in inner if a is not None and not isinstance(a, str)]


def may_hold(t: Type, names: set[str], defs: dict, seen: set[str]) -> bool:
    """Whether a value of type `t` may hold a value of one of the types `names`, through every type
    (the prompt's own looked into once each)."""
    k = t[0]
    if k == "con":
        if t[1] in names:
            return True
        if t[1] in defs and t[1] not in seen:
            seen.add(t[1])
            if any(may_hold(a, names, defs, seen) for a in _members(defs[t[1]])):
                return True
        return any(may_hold(a, names, defs, seen) for a in t[2])
    if k == "tuple":
        return any(may_hold(a, names, defs, seen) for a in t[1])
    if k == "arrow":
        return may_hold(t[2], names, defs, seen) or may_hold(t[3], names, defs, seen)
    if k == "poly":
        return any(a is not None and may_hold(a, names, defs, seen) for _, a in t[1])
    return False


def _check_mutable(defs: dict) -> set[str]:
    """A record with a mutable field crosses when what an entry point changes in it can be written
    back (writeback.py): not in a type that refers to itself, variants included, nor
    through a polymorphic variant's tag (_check: nor through a function's arguments)."""
    mutable = {n for n, d in defs.items() if d.kind == "record" and d.mutable}
    for n in sorted(mutable):
        d = defs[n]
        if any(may_hold(a, {n}, defs, set()) for _, a in d.body):
            raise Unverifiable(f"type {n} has a mutable field and holds a value of its own type")
    for n, d in defs.items():
        if (d.kind == "variant" and any(may_hold(a, mutable, defs, set()) for _, args in d.body for a in args)
                and any(may_hold(a, {n}, defs, set()) for _, args in d.body for a in args)):
            raise Unverifiable(f"type {n}: a constructor holds a record with a mutable field and the type itself")
        if d.kind == "poly" and may_hold(d.body, mutable, defs, set()):
            raise Unverifiable(f"type {n}: a tag holds a record with a mutable field")
    return mutable


MUTABLE_BLOCKS = {n for n, b in ALIASES.items() if b in ("array", "bytes", "ref")} | {"array", "bytes", "ref"}


def _looped_mutable(t: Type, defs: dict, blocks: set[str], seen: set[str]) -> str:
    """A variant that holds itself, in a parameter's type, whose values may hold mutable blocks (a
    tree of arrays): what an entry point changes there is not written back (writeback.py looks into
    a variant only when it ends), so a test of what the answer left unchanged would see a copy.
    Its name, or ""."""
    if t[0] == "con":
        d = defs.get(t[1])
        inner = []
        if d is not None and t[1] not in seen:
            seen.add(t[1])
            inner = _members(d)
            if (d.kind == "variant" and any(may_hold(a, {t[1]}, defs, set()) for a in inner)
                    and any(may_hold(a, blocks, defs, set()) for a in inner + list(t[2]))):
                return t[1]
        for a in list(t[2]) + inner:
            if name := _looped_mutable(a, defs, blocks, seen):
                return name
    elif t[0] == "tuple":
        for a in t[1]:
            if name := _looped_mutable(a, defs, blocks, seen):
                return name
    return ""


def _check(iface: Interface) -> None:
    defs = {d.name: d for d in iface.types}
    mutable = _check_mutable(defs)  # the records with a mutable field
    for e in iface.entries:
        for t in [p for _, p in e.params] + [e.result]:
            if t[0] == "arrow" and may_hold(t, mutable, defs, set()):
                raise Unverifiable(f"{e.name}: a function passed or returned holds a record with a mutable field")
        for _, p in e.params:
            if name := _looped_mutable(p, defs, MUTABLE_BLOCKS | mutable, set()):
                raise Unverifiable(f"{e.name}: type {name} holds itself and mutable blocks, which cannot be written "
                                   "back after a call")

    def ok(t: Type, params: tuple[str, ...] | None) -> None:
        kind = t[0]
        if kind == "var":
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
            elif t[1] in SIGNALS:
                if len(t[2]) != 1:
                    raise Unverifiable(f"type {t[1]} takes 1 argument")
            elif (key := map_key(t[1])) is not None:
                if key not in MAP_KEYS or len(t[2]) != 1:
                    raise Unverifiable(f"type {t[1]}: a map's keys cross only as {', '.join(MAP_KEYS)}")
            elif name not in BUILTINS:
                raise Unverifiable(f"type {t[1]} has no wire format (a library's or an abstract type)")
            for a in t[2]:
                ok(a, params)
        elif kind == "tuple":
            for a in t[1]:
                ok(a, params)
        elif kind == "arrow":
            if t[1]:
                raise Unverifiable("a labelled function type inside a value")
            ok(t[2], params)
            ok(t[3], params)
        elif kind == "poly":
            for _, a in t[1]:
                if a is not None:
                    ok(a, params)

    for d in iface.types:
        if d.kind == "alias":
            ok(d.body, d.params)
        elif d.kind == "poly":
            ok(d.body, d.params)
        elif d.kind == "variant":
            for _, args in d.body:
                for a in args:
                    ok(a, d.params)
        elif d.kind == "record":
            for _, a in d.body:
                ok(a, d.params)
    for _, args in iface.exceptions:
        for a in args:
            ok(a, ())
    for e in iface.entries:
        for _, p in e.params:
            ok(p, None)
            if mentions(p, SIGNALS - set(defs)):  # a prompt's own `signal` type is not React's
                raise Unverifiable("a React signal as an argument (only results can be mirrored)")
        ok(e.result, None)
        if len(e.vars()) > TOKEN_TYPES:
            raise Unverifiable(f"entry point {e.name} has more than {TOKEN_TYPES} type variables")
        # an entry point's own arrows are curried parameters only
        if e.result[0] == "arrow" and any(v for v in e.vars()):
            raise Unverifiable("a polymorphic entry point that returns a function")
