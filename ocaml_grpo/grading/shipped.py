"""The tests' closures the oracle holds too: a function written in the tests as an argument of an
entry point (`apply_n (fun x -> x + 1) n 0`) is compiled into the oracle from the same text, so
calling it costs the answer no round trip to the trusted program (~17 us each, measured). Only
closed code of Stdlib's types qualifies; what does not compile alone stays a handle. And how a
function argument crosses: shipped, or as a handle.
"""
from __future__ import annotations

from dataclasses import dataclass

from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.codecs import Gen, param_type
from ocaml_grpo.grading.completions import OCAML_KEYWORDS
from ocaml_grpo.grading.interface import ALIASES, BUILTINS, Interface, Type

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


def _shippable_type(g: Gen, t: Type) -> bool:
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
    g = Gen(iface, "W", "U")
    entries = {e.name: (k, e) for k, e in enumerate(iface.entries)
               if e.params and all(not lab for lab, _ in e.params)
               and any(_shippable_type(g, p) and g.resolve(p)[0] == "arrow" for _, p in e.params)}
    if not entries:
        return ()
    toks = src.code_tokens(tests)
    rebound = _names_the_tests_bind(toks)
    if rebound is None:
        return ()
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
            # a name the tests bind themselves means their value in the tests, not Stdlib's
            own = {toks[x].text for x in range(first, last + 1) if toks[x].kind in ("ident", "symbol")} & rebound
            if g.resolve(p)[0] == "arrow" and _shippable_type(g, p) and (is_fun or is_name) and not own:
                out.append(Lambda(len(out), k * SITE_STRIDE + i, toks[first].start,
                                  toks[last].start + len(toks[last].text), text, p))
            pos = last + 1
    return tuple(out)


BINDERS = ("let", "and", "rec", "module", "external", "val")
SCOPE_CHANGERS = ("open", "include", "type", "exception", "class", "object")


# Where OCaml binds a name by a pattern: the pattern runs to the next `=` or `->` (`let f x (y :
# t) =`, `fun x ->`, `| Some x ->`, `with e ->`, `for i =`, `let {a; b} =`, `as x`).
PATTERN_OPENERS = {"let", "and", "fun", "function", "with", "for", "as", "|", "module", "external", "val", "method"}


def names_the_tests_may_bind(tests: str) -> frozenset[str]:
    """Every name that may be bound somewhere in the tests, parameters and pattern variables
    included: every name in any pattern position, over-approximated (a type's name or a label
    counts too). A shipped closure may use none of them freely (lambda_unit_text's poison)."""
    toks = src.code_tokens(tests)
    names: set[str] = set()
    for i, t in enumerate(toks):
        if t.text not in PATTERN_OPENERS:
            continue
        depth, annotation = 0, None  # a type annotation (`: t`) runs to the end of its bracket: no names there
        for u in toks[i + 1:i + 200]:
            if depth == 0 and u.text in ("=", "->", "in", ";;"):
                break
            if u.text in ("(", "[", "{", "[|"):
                depth += 1
            elif u.text in (")", "]", "}", "|]"):
                depth -= 1
                if annotation is not None and depth < annotation:
                    annotation = None
                if depth < 0:
                    break
            elif u.text == ":":
                annotation = depth
            elif (annotation is None and u.kind == "ident" and u.text not in OCAML_KEYWORDS and u.text != "_"
                  and u.text[:1].isalpha()):
                names.add(u.text)
                if t.text == "as":
                    break
    return frozenset(names)


def _names_the_tests_bind(toks: list) -> set[str] | None:
    """The names the tests define (after `let`, `and`, `module`, ...): a closure that uses one is
    not compiled apart from them (alone, `max_int` would be Stdlib's, not the tests' own); it
    stays in the trusted program, where the tests' scope holds. None: the tests open a module or
    define types or exceptions, and then no closure is compiled apart (a handle is always right,
    only slower)."""
    if any(t.kind == "ident" and t.text in SCOPE_CHANGERS for t in toks):
        return None
    names = set()
    for i, t in enumerate(toks[:-1]):
        if t.kind != "ident" or t.text not in BINDERS:
            continue
        if toks[i + 1].kind == "ident":
            names.add(toks[i + 1].text)
        elif toks[i + 1].text == "(" and i + 3 < len(toks) and toks[i + 3].text == ")" and toks[i + 2].text != ")":
            names.add(toks[i + 2].text)  # `let ( +! ) = ...` binds `+!` (`let () =` binds nothing)
    return names


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
    if t.kind in ("string", "char") or t.text[:1].isdigit():  # a literal (numbers lex as symbols)
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


def lambda_unit_text(iface: Interface, lambdas: tuple[Lambda, ...], poison: frozenset[str] = frozenset()) -> str:
    """The closures as a unit of their own (Stdlib only): each under a line directive naming it,
    so a compile error says which one cannot be shipped. `poison`: names declared first at a type
    nothing accepts, so a closure that uses one of them freely (a name the tests may bind: their
    value in the tests, not Stdlib's) does not compile and stays a handle; a closure that binds
    the name itself shadows the poison. The compiler decides what a name in a closure refers to."""
    g = Gen(iface, "W", "U")
    head = ""
    if poison:
        head = '# 1 "grader_poison.ml"\ntype grader_poison\n' + "".join(
            f"let {n} : grader_poison = Obj.magic 0\n" for n in sorted(poison) if n[0].islower()) + "".join(
            f"module {n} = struct end\n" for n in sorted(poison) if n[0].isupper()) + ";;\n"
    return head + "".join(f'# 1 "lambda_{lam.j}.ml"\nlet l_{lam.j} : {g.ty(lam.type, {})} = ({lam.text})\n;;\n'
                          for lam in lambdas)


def arg_writer(g: Gen, k: int, i: int, label: str, p: Type, env: dict[str, str]) -> str:
    t = g.resolve(p)
    if label or t[0] != "arrow":
        return g.w(param_type(label, p), env)
    return f"(fun b f -> {g.W}.w_fun_at b {k * SITE_STRIDE + i} (Obj.repr f) {g.invoker(t, env)})"


def arg_reader(g: Gen, k: int, i: int, label: str, p: Type, env: dict[str, str],
                lambdas: tuple[Lambda, ...], unit: str) -> str:
    here = [lam.j for lam in lambdas if lam.site == k * SITE_STRIDE + i]
    plain = g.r(param_type(label, p), env)
    if not here or not unit:
        return plain
    W = g.W
    cases = " | ".join(f"{j} -> {unit}.l_{j}" for j in here)
    return (f"(fun r -> let h = {W}.r_int r in if h >= 0 then {g.proxy(g.resolve(p), env)} "
            f"else match - h - 1 with {cases} | _ -> Stdlib.raise {W}.Bad)")
