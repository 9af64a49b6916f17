"""The code that carries the entry points' values across the wire (ocaml/wire.ml) between the two
programs of a grading:

- the trusted program (T): the prompt's definitions, a stub per entry point at the prompt's type
  that asks the oracle, then the tests. It never runs model code and decides every assertion;
- the oracle (U): the answer as module `Solution`, each entry point bound at the prompt's type
  (a mismatch is the answer's error, in `entry.ml`), serving T's calls with values only.

Values are written by their type (entry_interface.py says which types have a form): Stdlib's basic
types, lists, arrays, options, results, tuples, the prompt's own variants, records and polymorphic
variants, functions (as handles both ways: higher-order entry points, functions returned), and type
variables (the values themselves, copied to the oracle as one Marshal blob per frame and named
back by index: wire.ml, `w_vals`). A functor entry point over an ordered type is served as
instances: one per application in the tests, its values' calls carrying the instance's number.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.completions import OCAML_KEYWORDS
from ocaml_grpo.grading.interface import (ALIASES, BUILTINS, ELEMENT_VAR, MAP_KEYS, ORDERED_SIG, SIGNALS, Entry,
                                          Functor, Interface, Type, map_key, may_hold, mentions)

HANDLES = "Handles__"  # T's module of the handles' primitives (ocaml/handles.c)

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
            elif (key := map_key(t[1])) is not None:
                name = f"Base.Map.M(Base.{key}).t"
            elif t[1] in SIGNALS:
                name = "React.signal"
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
            return self.shared(t, self.con(t, env, "w"), "w")
        if k == "tuple":
            xs = [f"x{i}" for i in range(len(t[1]))]
            body = "; ".join(f"{self.w(a, env)} b {x}" for a, x in zip(t[1], xs))
            return f"(fun b ({', '.join(xs)}) -> {body})"
        if k == "arrow":
            return f"(fun b f -> {W}.w_fun b {self.invoker(t, env)})"
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
            return self.shared(t, self.con(t, env, "r"), "r")
        if k == "tuple":
            xs = [f"x{i}" for i in range(len(t[1]))]
            reads = " ".join(f"let {x} = {self.r(a, env)} r in" for a, x in zip(t[1], xs))
            return f"(fun r -> {reads} ({', '.join(xs)}))"
        if k == "arrow":
            return f"(fun r -> let h = {W}.r_handle r in {self.proxy(t, env)})"
        if k == "poly":
            cases = []
            for tag, a in t[1]:
                if a is None:
                    cases.append(f"{_ocaml_string(tag)} -> `{tag}")
                else:
                    cases.append(f"{_ocaml_string(tag)} -> `{tag} ({self.r(a, env)} r)")
            return f"(fun r -> match {W}.r_ptag r with " + " | ".join(cases) + f" | _ -> Stdlib.raise {W}.Bad)"
        raise AssertionError(t)

    # -- sharing: the same mutable block twice in one message (`incr_all [a; a]`, a matrix and one
    # of its rows, a result `(a, a)`) crosses as one block (wire.ml, `w_shared`)
    def shared(self, t: Type, codec: str, way: str) -> str:
        """`codec` (a writer or reader of `t`) through the message's table of blocks, when `t` is a
        mutable block (an array, bytes, a ref, a record with a mutable field) of a type without
        variables: the key must name one type, since the trusted side trusts a number from the
        oracle only for a block of that key (inside the codec of `'a box`, `'a` is every type)."""
        if self.has_var(t):
            return codec
        name = ALIASES.get(t[1], t[1])
        d = self.defs.get(t[1])
        if not ((d is None and name in ("array", "bytes", "ref")) or (d is not None and d.kind == "record" and d.mutable)):
            return codec
        # the type is part of the key: a block is only ever shared with a position of its own type
        # (the empty array is one block of every type)
        key = zlib.crc32(repr(t).encode()) & 0x3FFFFFFF
        return f"({self.W}.{way}_shared {key} {codec})"

    def con(self, t: Type, env: dict[str, str], way: str) -> str:
        """A named type's writer (way "w") or reader ("r"): the prompt's own, or the wire's."""
        sub = self.w if way == "w" else self.r
        d = self.defs.get(t[1])
        if d is not None and d.kind == "handle" and self.side == "T":
            # A handle the trusted program holds carries the classes of its parameters where it was
            # read (wire.ml, `link`): written back where its parameters are this call's variables,
            # it makes them one type with those.
            js = [env.get("i:" + a[1], "-1") if self.resolve(a)[0] == "var" else "-1"
                  for a in (self.resolve(x) for x in t[2])]
            if any(j != "-1" for j in js):
                W, arr = self.W, "[| " + "; ".join(js) + " |]"
                if way == "w":
                    return (f"(fun b (Handle__{t[1]} h) -> {W}.w_int b ({HANDLES}.number h); "
                            f"{W}.link tb ({HANDLES}.classes h) {arr})")
                return (f"(fun r -> Handle__{t[1]} ({HANDLES}.read r [| "
                        + "; ".join(f"{W}.node tb ({j})" for j in js) + " |]))")
        if d is not None:
            return "(" + " ".join([f"{way}_{t[1]}"] + [sub(a, env) for a in t[2]]) + ")"
        if t[1] in SIGNALS:  # the oracle keeps it; the trusted program mirrors it (wire.ml, refreshers)
            W, x = self.W, t[2][0]
            if way == "w":
                return (f"(fun b s -> {W}.w_fun b (fun r b -> {W}.r_end r; {self.w(x, env)} b (React.S.value s)); "
                        f"{self.w(x, env)} b (React.S.value s))")
            return (f"(fun r -> let h = {W}.r_handle r in let s, set = React.S.create ({self.r(x, env)} r) in "
                    f"{W}.on_refresh (fun () -> set ({W}.call h (fun _ -> ()) {self.r(x, env)})); s)")
        if (key := map_key(t[1])) is not None:  # as its (key, value) list, in key order
            W, k = self.W, MAP_KEYS[key]
            if way == "w":
                return (f"(fun b m -> {W}.w_list (fun b (k, v) -> {W}.w_{k} b k; {sub(t[2][0], env)} b v) b "
                        f"(Base.Map.to_alist m))")
            return (f"(fun r -> match Base.Map.of_alist (module Base.{key}) ({W}.r_list (fun r -> "
                    f"let k = {W}.r_{k} r in let v = {sub(t[2][0], env)} r in (k, v)) r) with "
                    f"`Ok m -> m | `Duplicate_key _ -> Stdlib.raise {W}.Bad)")
        name = ALIASES.get(t[1], t[1])
        if name in ("list", "array", "option", "result", "ref"):
            return f"({self.W}.{way}_{name} " + " ".join(sub(a, env) for a in t[2]) + ")"
        return f"{self.W}.{way}_{name}"

    def invoker(self, t: Type, env: dict[str, str]) -> str:
        """How this side serves calls of its function value `f`: read the arguments, write the result.
        Values of type variables the trusted side sends go first, as one blob (wire.ml, `w_vals`)."""
        args, res = _uncurry(t)
        ys = [f"y{i}" for i in range(len(args))]
        reads = " ".join(f"let {y} = {self.r(a, env)} r in" for a, y in zip(args, ys))
        if self.side == "U" and any(self.has_var(a) for a in args):
            reads = f"{self.W}.r_vals r; " + reads
        write = f"{self.w(res, env)} b v"
        if self.side == "T" and self.has_var(res):
            write = f"{self.W}.w_vals tb (fun b -> {write}) b"
        return f"(fun r b -> {reads} {self.W}.r_end r; let v = f {' '.join(ys)} in {self.W}.begin_write (); {write})"

    def proxy(self, t: Type, env: dict[str, str]) -> str:
        """The function a handle `h` stands for: each call goes to the side that holds it."""
        args, res = _uncurry(t)
        xs = [f"y{i}" for i in range(len(args))]
        writes = "; ".join(f"{self.w(a, env)} b {x}" for a, x in zip(args, xs))
        write = f"(fun b -> {writes})"
        if self.side == "T" and any(self.has_var(a) for a in args):
            write = f"({self.W}.w_vals tb {write})"
        read = self.r(res, env)
        if self.side == "U" and self.has_var(res):
            read = f"(fun r -> {self.W}.r_vals r; {read} r)"
        return f"(fun {' '.join(xs)} -> {self.W}.call h {write} {read})"

    # -- mutation: the mutable blocks inside an argument (arrays in lists, rows of a matrix), written
    # back in place after each call, a block the answer replaced sent whole (wire.ml, `blit_back`)
    def mutable_inside(self, t: Type) -> bool:
        """Whether an array, bytes or a ref may sit in a value of this type, through lists, options,
        tuples, arrays and refs (the prompt's own types and functions are not looked into)."""
        t = self.resolve(t)
        if t[0] == "tuple":
            return any(self.mutable_inside(a) for a in t[1])
        if t[0] == "con" and t[1] in self.defs and self.defs[t[1]].kind == "record":
            # not a type that refers to itself (interface._check_mutable): the recursion ends
            d = self.defs[t[1]]
            return bool(d.mutable) or any(self.mutable_inside(a) for _, a in self._fields(t))
        if t[0] == "con" and t[1] in self.defs and self.defs[t[1]].kind == "variant":
            # a variant that refers to itself (a tree of arrays) is not looked into: its arrays are
            # not written back (docs/grader.md); interface._check_mutable keeps mutable records out
            return not self._recursive(t[1]) and any(self.mutable_inside(a) for _, args in self._ctors(t) for a in args)
        if t[0] != "con" or t[1] in self.defs or map_key(t[1]) is not None or t[1] in SIGNALS:
            return False
        name = ALIASES.get(t[1], t[1])
        return name in ("array", "bytes", "ref") or (name in ("list", "option") and any(self.mutable_inside(a) for a in t[2]))

    def _parts(self, t: Type) -> tuple[str, list[Type]]:
        t = self.resolve(t)
        if t[0] == "con" and t[1] in self.defs and self.defs[t[1]].kind == "variant":
            return "variant", []
        if t[0] == "con" and t[1] in self.defs:
            return "record", [a for _, a in self._fields(t)]
        return ("tuple", list(t[1])) if t[0] == "tuple" else (ALIASES.get(t[1], t[1]), list(t[2]))

    def _fields(self, t: Type) -> list[tuple[str, Type]]:
        """A record's fields at this instance of its parameters."""
        d = self.defs[t[1]]
        m = dict(zip(d.params, t[2]))
        return [(f, _subst(a, m)) for f, a in d.body]

    def _ctors(self, t: Type) -> list[tuple[str, list[Type]]]:
        """A variant's constructors with their arguments at this instance of its parameters."""
        d = self.defs[self.resolve(t)[1]]
        m = dict(zip(d.params, self.resolve(t)[2]))
        return [(c, [_subst(a, m) for a in args]) for c, args in d.body]

    def _recursive(self, name: str) -> bool:
        d = self.defs[name]
        return any(may_hold(a, {name}, self.defs, set()) for _, args in d.body for a in args)

    def _variant_parts(self, t: Type):
        """For each constructor: its pattern over y0.., its arguments (name, type) that hold mutable
        blocks, and its place among those constructors (None: none there)."""
        out, n = [], 0
        for c, args in self._ctors(t):
            ys = [f"y{i}" for i in range(len(args))]
            pat = f"{self.q}{c}" + (f" ({', '.join(ys)})" if ys else "")
            inside = [(y, a) for y, a in zip(ys, args) if self.mutable_inside(a)]
            out.append((pat, inside, n if inside else None))
            n += bool(inside)
        return out, n

    def _record_pieces(self, t: Type) -> list[tuple[str, Type, bool]]:
        """The fields that matter after a call: (name, type, mutable), those that are mutable or hold
        mutable blocks."""
        d = self.defs[self.resolve(t)[1]]
        return [(f, a, f in d.mutable) for f, a in self._fields(self.resolve(t))
                if f in d.mutable or self.mutable_inside(a)]

    def shadow(self, t: Type) -> str:
        """U: `τ -> σ`, taken before a call: each array's elements that hold mutable blocks, as the
        answer received them, so that what it replaced can be told from what it changed."""
        if not self.mutable_inside(t):
            return "(fun _ -> ())"
        kind, args = self._parts(t)
        if kind == "tuple":
            xs = [f"x{i}" for i in range(len(args))]
            return f"(fun ({', '.join(xs)}) -> ({', '.join(f'{self.shadow(a)} {x}' for a, x in zip(args, xs))}))"
        if kind == "array" and self.mutable_inside(args[0]):
            return f"(fun x -> Stdlib.Array.map (fun y -> (y, {self.shadow(args[0])} y)) x)"
        if kind == "ref" and self.mutable_inside(args[0]):
            return f"(fun x -> let y = Stdlib.( ! ) x in (y, {self.shadow(args[0])} y))"
        if kind == "record":  # each piece's value as received, and its own shadow
            pieces = self._record_pieces(t)
            return "(fun x -> (" + ", ".join(f"(x.{self.q}{f}, {self.shadow(a)} x.{self.q}{f})" for f, a, _ in pieces) + ", ()))"
        if kind in ("list", "option"):
            return f"(Stdlib.{kind.capitalize()}.map {self.shadow(args[0])})"
        if kind == "variant":  # one option per constructor that holds mutable blocks: its arguments' shadows
            parts, n = self._variant_parts(t)
            cases = []
            for pat, inside, j in parts:
                opts = ["None"] * n
                if j is not None:
                    opts[j] = "Some (" + ", ".join(f"{self.shadow(a)} {y}" for y, a in inside) + ")"
                cases.append(f"{pat} -> ({', '.join(opts)})")
            return "(fun x -> match x with " + " | ".join(cases) + ")"
        return "(fun _ -> ())"  # a flat array or bytes: its contents go back whole

    def write_back(self, t: Type, env: dict[str, str]) -> str:
        """U: `Stdlib.Buffer.t -> τ -> σ -> unit` after a call: the mutable blocks inside the argument,
        each kept block's contents, each replaced block whole."""
        W = self.W
        if not self.mutable_inside(t):
            return "(fun _ _ _ -> ())"
        kind, args = self._parts(t)
        if kind == "tuple":
            xs, ss = [f"x{i}" for i in range(len(args))], [f"s{i}" for i in range(len(args))]
            body = "; ".join(f"{self.write_back(a, env)} b {x} {s_}" for a, x, s_ in zip(args, xs, ss))
            return f"(fun b ({', '.join(xs)}) ({', '.join(ss)}) -> {body})"
        if kind == "bytes":
            return f"(fun b x () -> {W}.w_bytes b x)"
        if kind == "variant":
            return self._variant_write_back(t, env)
        e = args[0]
        if kind == "array" and not self.mutable_inside(e):
            return f"(fun b x () -> {W}.w_array {self.w(e, env)} b x)"
        if kind == "array":
            return f"(fun b x s -> Stdlib.Array.iteri (fun i y -> let (y0, s0) = s.(i) in {self._slot_w('y', e, env)}) x)"
        if kind == "record":
            pieces = self._record_pieces(t)
            ss = [f"s{i}" for i in range(len(pieces))]
            body = [f"(let (y0, s0) = {s_} in {self._slot_w(f'x.{self.q}{f}', a, env)})" if mut
                    else f"(let (_, s0) = {s_} in {self.write_back(a, env)} b x.{self.q}{f} s0)"
                    for (f, a, mut), s_ in zip(pieces, ss)]
            return f"(fun b x ({', '.join(ss)}, ()) -> " + "; ".join(body) + ")"
        if kind == "ref" and not self.mutable_inside(e):
            return f"(fun b x () -> {self.w(e, env)} b (Stdlib.( ! ) x))"
        if kind == "ref":
            return f"(fun b x (y0, s0) -> let y = Stdlib.( ! ) x in {self._slot_w('y', e, env)})"
        if kind == "list":
            return f"(fun b x s -> Stdlib.List.iter2 (fun y s0 -> {self.write_back(e, env)} b y s0) x s)"
        return f"(fun b x s -> match x, s with Some y, Some s0 -> {self.write_back(e, env)} b y s0 | _ -> ())"

    def _variant_write_back(self, t: Type, env: dict[str, str]) -> str:
        """U: a variant's constructor is what it was (a variant is immutable): the mutable blocks in
        its arguments, as the shadow took them."""
        parts, n = self._variant_parts(t)
        cases = []
        for pat, inside, j in parts:
            if j is None:
                continue
            opts = ["_"] * n
            ss = [f"s{i}" for i in range(len(inside))]
            opts[j] = "Some (" + ", ".join(ss) + ")"
            body = "; ".join(f"{self.write_back(a, env)} b {y} {s_}" for (y, a), s_ in zip(inside, ss))
            cases.append(f"{pat}, ({', '.join(opts)}) -> {body}")
        return "(fun b x s -> match x, s with " + " | ".join(cases + ["_ -> ()"]) + ")"

    def read_back(self, t: Type, env: dict[str, str]) -> str:
        """T: `reader -> τ -> unit`: the oracle's write_back applied in place to the tests' own value
        (a kept block updated, a replaced one set where it was)."""
        W = self.W
        if not self.mutable_inside(t):
            return "(fun _ _ -> ())"
        kind, args = self._parts(t)
        if kind == "tuple":
            xs = [f"x{i}" for i in range(len(args))]
            return f"(fun r ({', '.join(xs)}) -> " + "; ".join(f"{self.read_back(a, env)} r {x}" for a, x in zip(args, xs)) + ")"
        if kind == "bytes":
            return f"(fun r x -> {W}.bytes_back x ({W}.r_bytes r))"
        if kind == "variant":  # the same constructor as sent (immutable): its arguments' blocks
            parts, _ = self._variant_parts(t)
            cases = [f"{pat} -> " + "; ".join(f"{self.read_back(a, env)} r {y}" for y, a in inside)
                     for pat, inside, j in parts if j is not None]
            return "(fun r x -> match x with " + " | ".join(cases + ["_ -> ()"]) + ")"
        e = args[0]
        if kind == "array" and not self.mutable_inside(e):
            return f"(fun r x -> {W}.blit_back x ({W}.r_array {self.r(e, env)} r))"
        if kind == "array":
            return f"(fun r x -> Stdlib.Array.iteri (fun i y -> {self._slot_r('x.(i) <- {}', 'y', e, env)}) x)"
        if kind == "record":
            return "(fun r x -> " + "; ".join(self._slot_r(f"x.{f} <- {{}}", f"x.{f}", a, env) if mut
                                              else f"{self.read_back(a, env)} r x.{f}"
                                              for f, a, mut in self._record_pieces(t)) + ")"
        if kind == "ref" and not self.mutable_inside(e):
            return f"(fun r x -> Stdlib.( := ) x ({self.r(e, env)} r))"
        if kind == "ref":
            return f"(fun r x -> {self._slot_r('Stdlib.( := ) x ({})', '(Stdlib.( ! ) x)', e, env)})"
        if kind == "list":
            return f"(fun r x -> Stdlib.List.iter ({self.read_back(e, env)} r) x)"
        return f"(fun r x -> match x with Some y -> {self.read_back(e, env)} r y | None -> ())"

    # A mutable slot (an array's element, a record's mutable field, a ref's contents) holding a value
    # that may hold mutable blocks itself: the oracle says whether the answer kept what it received
    # there (its insides written back) or put something else (written whole).
    def _slot_w(self, y: str, t: Type, env: dict[str, str]) -> str:
        """U: the slot now holding `y`, received as `y0` with its shadow `s0`."""
        W = self.W
        return (f"(if {y} == y0 then ({W}.w_bool b false; {self.write_back(t, env)} b {y} s0) "
                f"else ({W}.w_bool b true; {self.w(t, env)} b {y}))")

    def _slot_r(self, set_to: str, current: str, t: Type, env: dict[str, str]) -> str:
        """T: the slot set (`set_to` with the value for {}) or its `current` value updated in place."""
        return (f"(if {self.W}.r_bool r then {set_to.format(f'({self.r(t, env)} r)')} "
                f"else {self.read_back(t, env)} r {current})")

    def has_var(self, t: Type) -> bool:
        """Whether values of type variables may cross with a value of this type (both sides agree)."""
        t = self.resolve(t)
        k = t[0]
        if k == "var":
            return True
        if k == "con":
            return any(self.has_var(a) for a in t[2])
        if k == "tuple":
            return any(self.has_var(a) for a in t[1])
        if k == "arrow":
            return self.has_var(t[2]) or self.has_var(t[3])
        if k == "poly":
            return any(a is not None and self.has_var(a) for _, a in t[1])
        return False

    # -- the prompt's variants and records: recursive writer/reader pairs
    def codecs(self) -> str:
        W, q = self.W, self.q
        named = [d for d in self.iface.types if d.kind in ("variant", "record", "handle")]
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
            elif d.kind == "handle" and self.side == "T":
                # nested in another type: no classes for its parameters (they are not merged)
                wbody = f"match v with Handle__{d.name} h -> {W}.w_int b ({HANDLES}.number h)"
                rbody = f"Handle__{d.name} ({HANDLES}.read r [||])"
            elif d.kind == "handle":  # the oracle keeps the value; the trusted program holds its number
                wbody, rbody = f"{W}.w_int b ({W}.keep v)", f"{W}.kept ({W}.r_int r)"
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

    def named_handles(self) -> bool:
        """Whether the interface has handle types (values the oracle keeps across calls)."""
        return any(d.kind == "handle" for d in self.iface.types)

    def handle_types(self) -> str:
        """T's types of the handles: a value the oracle keeps, as a block whose `=`, `compare` and
        `Hashtbl.hash` ask the oracle (ocaml/handles.c); unboxed, so that the block is the value
        (`==` between two returns of one value holds)."""
        return "".join(f"type {_params_text(d.params)}{d.name} = Handle__{d.name} of {HANDLES}.t [@@unboxed]\n"
                       for d in self.iface.types if d.kind == "handle" and self.side == "T")

    def handle_runtime(self) -> str:
        """T's side of the handles (once, before any handle type): handles.c's primitives, and the
        classes each handle's parameters had where it was read (wire.ml, `link`). After the
        prompt's preamble (an `open Base`): every name it uses is qualified."""
        if not self.named_handles() or self.side != "T":
            return ""
        W = self.W
        # One block per value of the oracle's (its number: wire.ml `keep`), so `==` holds between two
        # returns of one value; a handle whose parameters' classes matter is a block of its own,
        # its classes kept by the block.
        return (f"module {HANDLES} = struct\n"
                "  type t\n"
                '  external make : int -> int -> t = "ocaml_grpo_handle_make"\n'
                '  external number : t -> int = "ocaml_grpo_handle_number" [@@noalloc]\n'
                '  external classes_at : t -> int = "ocaml_grpo_handle_classes" [@@noalloc]\n'
                '  external init : Stdlib.out_channel -> Stdlib.in_channel -> unit = "ocaml_grpo_handle_init"\n'
                "  let kept_classes : (int, int array) Stdlib.Hashtbl.t = Stdlib.Hashtbl.create 16\n"
                "  let made = Stdlib.ref (Stdlib.Weak.create 64)\n"
                "  let same h =\n"
                "    let w = Stdlib.(!) made in\n"
                "    if h < 0 || Stdlib.(h >= Stdlib.Weak.length w + 1048576) then make h (-1) else begin\n"
                "      if Stdlib.(h >= Stdlib.Weak.length w) then begin\n"
                "        let w' = Stdlib.Weak.create (Stdlib.max (h + 1) (2 * Stdlib.Weak.length w)) in\n"
                "        Stdlib.Weak.blit w 0 w' 0 (Stdlib.Weak.length w); made := w' end;\n"
                "      match Stdlib.Weak.get (Stdlib.(!) made) h with\n"
                "      | Some v -> v\n"
                "      | None -> let v = make h (-1) in Stdlib.Weak.set (Stdlib.(!) made) h (Some v); v end\n"
                f"  let read r ns = let h = {W}.r_int r in\n"
                "    if Stdlib.(ns = [||]) then same h\n"
                "    else (let c = Stdlib.Hashtbl.length kept_classes in Stdlib.Hashtbl.replace kept_classes c ns; make h c)\n"
                "  let classes h = match Stdlib.Hashtbl.find_opt kept_classes (classes_at h) with Some ns -> ns | None -> [||]\n"
                f"  let () = init (Stdlib.(!) {W}.rep_out) (Stdlib.(!) {W}.req_in);\n"
                f'    Stdlib.Callback.register "ocaml_grpo_handle_reply" {W}.query_reply;\n'
                f'    Stdlib.Callback.register "ocaml_grpo_handle_broken" {W}.fail;\n'
                f"    {W}.handle_ops := Stdlib.Obj.raw_field (Stdlib.Obj.repr (make 0 (-1))) 0\n"
                "end\n")

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


def _params_text(params: tuple[str, ...]) -> str:
    ps = [f"'{p}" for p in params]
    return "" if not ps else (ps[0] + " " if len(ps) == 1 else "(" + ", ".join(ps) + ") ")


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


def _flat(g: _Gen, t: Type) -> str:
    """A top-level array (of values without mutable blocks) or bytes argument, sent back whole."""
    kind = _is_array(g, t)
    return kind if kind == "bytes" or (kind == "array" and not g.mutable_inside(g.resolve(t)[2][0])) else ""


def _nested(g: _Gen, label: str, t: Type) -> bool:
    """An argument holding mutable blocks that are not simply its own contents: arrays in a list,
    the rows of a matrix."""
    return not _flat(g, t) and g.mutable_inside(_param_type(label, t))


def _staged(e: Entry, signals: bool, instance: str = "") -> bool:
    """An entry point of two or more unlabelled arguments and no type variables (outside a functor,
    beside no signal): a partial application of it in the tests happens in the oracle, once, and
    stays the answer's closure there (wire.ml, `call_staged`), so `let triple = scale 3` is one
    application of `scale` however often `triple` is called."""
    return len(e.params) >= 2 and not instance and not signals and not e.vars() and not any(lab for lab, _ in e.params)


# Types whose values are immediate: nothing to alias.
IMMEDIATE = {"int", "bool", "char", "unit"}


def _aliases(g: _Gen, e: Entry) -> dict[int, list[int]]:
    """Each argument that may be the same block as an earlier one of the same type (`f a a`): the
    earlier ones. The oracle then gets one block for both, as the answer would in one program.
    Functions and values of type variables have their own ways (handles; one blob, sharing kept)."""
    seen: dict[str, list[int]] = {}
    out: dict[int, list[int]] = {}
    for i, (lab, p) in enumerate(e.params):
        t = g.resolve(_param_type(lab, p))
        if t[0] == "arrow" or g.has_var(t) or (t[0] == "con" and ALIASES.get(t[1], t[1]) in IMMEDIATE
                                                and t[1] not in g.defs):
            continue
        key = g.ty(t, {})
        if seen.get(key):
            out[i] = list(seen[key])
        seen.setdefault(key, []).append(i)
    return out


def _same_params(g: _Gen, e: Entry) -> list[int]:
    """The parameters of the result's own type: the result may be one of them (`f l == l`, an
    array sorted in place and returned), as the tests may check with `==`. Not for immediates,
    functions, signals, abstract types (their own identity: wire.ml `keep`) or type variables
    (theirs: the values themselves)."""
    t = g.resolve(e.result)
    if (t[0] == "arrow" or g.has_var(t)
            or (t[0] == "con" and (t[1] in SIGNALS or (t[1] in g.defs and g.defs[t[1]].kind == "handle")
                                   or (t[1] not in g.defs and ALIASES.get(t[1], t[1]) in IMMEDIATE)))):
        return []
    want = g.ty(t, {})
    return [i for i, (lab, p) in enumerate(e.params) if g.ty(_param_type(lab, p), {}) == want]


def trusted_stubs(iface: Interface, wire: str) -> str:
    """T's code between the prompt's definitions and the tests: codecs, then one stub per entry
    point, at the prompt's type, that asks the oracle (handle k = the k-th entry point)."""
    g = _Gen(iface, wire, "T")
    if iface.functor:
        return _functor_stubs(g)
    signals = any(mentions(e.result, SIGNALS - set(g.defs)) for e in iface.entries)
    return "".join([g.handle_runtime(), g.handle_types(), g.codecs(), g.exception_codec()]
                   + [_stub(g, k, e, signals) for k, e in enumerate(iface.entries)])


def _stub(g: _Gen, k: int, e: Entry, signals: bool, instance: str = "", table: str = "") -> str:
    """`let name : <its type> = fun args -> <ask the oracle's handle k>` (`instance`: an int
    written first, the functor instance the call is for; `table`: the values' table the calls
    share, a functor instance's)."""
    wire = g.W
    vs = e.vars()
    env = ({v: f"({wire}.w_var tb {i})" for i, v in enumerate(vs)} | {"r:" + v: f"({wire}.r_var tb {i})"
                                                                       for i, v in enumerate(vs)}
           | {"i:" + v: str(i) for i, v in enumerate(vs)})
    full = e.result
    for label, p in reversed(e.params):
        full = ("arrow", label, p, full)
    quant = (" ".join("'" + v for v in vs) + ". ") if vs else ""
    ty = g.ty(full, {}) if e.params else g.ty(e.result, {})
    xs = [f"a{i}" for i in range(len(e.params))]
    binders = " ".join(_labelled(lab, x) for (lab, _), x in zip(e.params, xs))
    aliases = _aliases(g, e)

    def write(i: int, lab: str, p: Type, x: str) -> str:
        w = _arg_writer(g, k, i, lab, p, env) + f" b {x}"
        if i not in aliases:
            return w
        same = " else ".join(f"if {x} == {xs[j]} then {wire}.w_int b {j}" for j in aliases[i])
        return f"({same} else ({wire}.w_int b (-1); {w}))"
    writes = "; ".join([write(i, lab, p, x) for i, ((lab, p), x) in enumerate(zip(e.params, xs))]) or "()"
    if any(g.has_var(_param_type(lab, p)) for lab, p in e.params):  # the values first, as one blob
        writes = f"{wire}.w_vals tb (fun b -> {writes}) b"
    if instance:
        writes = f"{wire}.w_int b {instance}; {writes}"
    backs = "".join(f" {wire}.blit_back {x} ({wire}.r_array {g.r(g.resolve(p)[2][0], env)} r);"
                    if _flat(g, p) == "array" else f" {wire}.bytes_back {x} ({wire}.r_bytes r);" if _flat(g, p)
                    else f" {g.read_back(_param_type(lab, p), env)} r {x};" if _nested(g, lab, p) else ""
                    for (lab, p), x in zip(e.params, xs))
    same = _same_params(g, e)
    value = g.r(e.result, env) + " r"
    if same:  # the oracle says when the result is one of the arguments, as the tests may check (==)
        value = (f"(match {wire}.r_int r with -1 -> {value} | "
                 + " | ".join(f"{i} -> {xs[i]}" for i in same) + f" | _ -> Stdlib.raise {wire}.Bad)")
    read = f"(fun r -> let v = {value} in{backs} v)"
    if _staged(e, signals, instance):
        ws_list = [f"(fun b -> {write(i, lab, p, x)})" for i, ((lab, p), x) in enumerate(zip(e.params, xs))]
        ws = "; ".join(ws_list)
        ps = [f"p{i}" for i in range(len(xs) - 1)]
        # each application short of the last may run the answer's code now (wire.ml, `eager`)
        lam = "".join(f"fun {x} -> let {q} = {wire}.prefix () in {wire}.eager {k} [| {'; '.join(ps[:i + 1])} |] "
                      f"[| {'; '.join(ws_list[:i + 1])} |]; " for i, (x, q) in enumerate(zip(xs, ps)))
        body = f"{wire}.call_staged {k} [| {'; '.join(ps)} |] [| {ws} |] {read}"
        return f"let {e.name} : {ty} = {lam}fun {xs[-1]} -> {body}\n"
    strict = "false" if g.iface.functor or g.named_handles() or signals else "true"
    tb = table or f"{wire}.tokens {len(vs)} {strict}"
    body = (f"let tb = {tb} in " if vs else "") + f"let write b = {writes} in "
    body += f"{wire}.call {k} write {read}"
    if signals:  # after any call, every mirrored signal takes the oracle's value
        body = f"let v = {body} in {wire}.refresh (); v"
    if e.params:
        return f"let {e.name} : {quant}{ty} = fun {binders} -> {body}\n"
    return f"let {e.name} : {ty} = {body}\n"


# The element module's `compare`, as the wire carries it (a handle of the tests' own compare).
ELEMENT_COMPARE: Type = ("arrow", "", ("var", ELEMENT_VAR), ("arrow", "", ("var", ELEMENT_VAR), ("con", "int", ())))


def _functor_type(f: Functor) -> str:
    """The functor's module type as the prompt declares it, over an ordered type."""
    return f"functor ({f.param} : {ORDERED_SIG}) -> {f.result_sig}"


def _functor_stubs(g: _Gen) -> str:
    """T's functor: applied, it asks the oracle for an instance of the answer's functor over an
    element module whose `compare` calls the tests' own (handle 0 makes one); its values are
    stubs of that instance (handle k + 1 = the k-th value), its abstract types its handles'."""
    f, W = g.iface.functor, g.W
    env = {"r:" + ELEMENT_VAR: f"({W}.r_var grader_tb 0)"}
    head = f"functor ({f.param} : {ORDERED_SIG}) ->"
    return "".join([g.handle_runtime(), f"module {f.name} : {_functor_type(f)} = {head} struct\n", g.handle_types(),
                    f.types_text + "\n", g.codecs(), f"let grader_tb = {W}.instance_table ()\n",
                    f"let grader_instance : int = {W}.call 0 (fun b -> {g.w(ELEMENT_COMPARE, env)} b {f.param}.compare) {W}.r_int\n"]
                   + [_stub(g, k + 1, e, False, "grader_instance", "grader_tb") for k, e in enumerate(g.iface.entries)]
                   + ["end\n"])


ENTRY_ALIAS = "grader_entry_"  # + k: the k-th entry point, named where the answer's scope ends


def entry_aliases(iface: Interface) -> str:
    """Appended inside the answer's module: each entry point as the answer's own scope resolves it
    at its end (a name brought in by `open Impl` included), which is what tests appended to the
    answer would call. Last, so it shadows any name the answer gave itself."""
    if iface.functor:
        return f"module {ENTRY_MODULE} = {iface.functor.name}\n"
    return "".join(f"let {ENTRY_ALIAS}{k} = {e.name}\n" for k, e in enumerate(iface.entries))


ENTRY_MODULE = "Grader_entry_functor"  # a functor entry point, named where the answer's scope ends


def entry_binding(g: "_Gen", k: int, name: str, vars_as: dict[str, str], quantify: bool, eta: bool = True,
                  target: str = "") -> str:
    """`let name : <the k-th entry point's type at the prompt> = <the answer's entry point>`.
    A function is bound through a total application (`fun a0 a1 -> f a0 a1`): OCaml lets a total
    application omit labels, so an answer whose parameters carry labels the prompt's type does not
    is bound as the tests' unlabelled calls would reach it. `quantify`: the prompt's type
    variables as written, universally quantified (`'a. 'a -> 'a`); else as `vars_as` maps them.
    `eta=False`: bound directly (what the compiler then says of a mismatch reads better).
    `target`: the value bound (default: the answer's k-th entry point)."""
    e = g.iface.entries[k]
    full = e.result
    for label, p in reversed(e.params):
        full = ("arrow", label, p, full)
    names = list(dict.fromkeys(e.vars()))
    quant = " ".join("'" + v for v in names) + ". " if quantify and names else ""
    target = target or f"Solution.{ENTRY_ALIAS}{k}"
    if not e.params or not eta:
        return f"let {name} : {quant}{g.ty(full, vars_as)} = {target}\n"
    args = " ".join(_labelled(lab, f"a{i}") for i, (lab, _) in enumerate(e.params))
    return f"let {name} : {quant}{g.ty(full, vars_as)} = fun {args} -> {target} {args}\n"


def entry_check(iface: Interface, eta: bool = True) -> str:
    """The bindings of every entry point at the prompt's type with its type variables as written,
    after the answer's module (grader._entry_mismatch): the check of the entry points on the path
    where the answer has type errors, and the words feedback quotes on every path."""
    if f := iface.functor:  # the answer's functor seen through the prompt's signature
        return f"module {f.name} : {_functor_type(f)} = Solution.{ENTRY_MODULE}\n"
    g = _Gen(iface, "", "U")
    return "".join(entry_binding(g, k, f"_entry_{k}", {}, quantify=True, eta=eta) for k in range(len(iface.entries)))


def oracle_server(iface: Interface, wire: str, lambdas: tuple["Lambda", ...] = (), lambda_unit: str = "",
                  direct: bool = False) -> str:
    """U's code after the answer's `Solution` module: each entry point bound at the prompt's type
    (each type variable a token type of its own), registered as handle k, then the serve loop.
    `lambdas` (compiled in `lambda_unit`): the tests' closures it holds as well. `direct`: the
    entry points are known to bind directly at the prompt's types (harness.render_oracle's strict
    check precedes this code), so a staged one is bound as the answer's own function, and its
    partial applications are the answer's; else through a total application (labels the prompt
    lacks), whose partial applications do nothing until the last argument."""
    g = _Gen(iface, wire, "U")
    if iface.functor:
        return _functor_server(g)
    signals = any(mentions(e.result, SIGNALS - set(g.defs)) for e in iface.entries)
    out = [g.codecs(), g.exception_codec()]
    for k, e in enumerate(iface.entries):
        # Each type variable its own abstract token type (wire.ml, Tok<i>): else `fun (a, b) -> (a, b)`
        # would be bound at `'a * 'b -> 'b * 'a`. A weak one is fine, as when tests are appended.
        mods = {v: f"{wire}.Tok{i}" for i, v in enumerate(e.vars())}
        staged = _staged(e, signals)
        out.append(entry_binding(g, k, f"entry_{k}", {v: f"{m}.t" for v, m in mods.items()}, quantify=False,
                                 eta=not (staged and direct)))
        env = {v: f"{m}.w" for v, m in mods.items()} | {"r:" + v: f"{m}.r" for v, m in mods.items()}
        serve = _serve_staged if staged else _serve
        out.append(f"let () = ignore ({wire}.register {serve(g, k, e, env, lambdas, lambda_unit)})\n")
        # how many arguments the bound closure takes before the answer's code runs (wire.ml, `eager`)
        arity = f"{wire}.closure_arity entry_{k}" if staged else "0"
        out.append(f"let () = {wire}.staged_arity := ({arity}) :: Stdlib.( ! ) {wire}.staged_arity\n")
    out.append(f"let () = {wire}.serve ()\n")
    return "".join(out)


def _arg_reads(g: _Gen, k: int, e: Entry, env: dict[str, str], lambdas: tuple["Lambda", ...],
               lambda_unit: str):
    """The oracle's reader of argument i (`read(i)`): an argument that may be an earlier one of its
    type (`_aliases`) is that one when the trusted side says so."""
    wire, xs, aliases = g.W, [f"a{i}" for i in range(len(e.params))], _aliases(g, e)

    def read(i: int) -> str:
        lab, p = e.params[i]
        rd = f"{_arg_reader(g, k, i, lab, p, env, lambdas, lambda_unit)} r"
        if i not in aliases:
            return rd
        cases = " | ".join(f"{j} -> {xs[j]}" for j in aliases[i])
        return f"(match {wire}.r_int r with -1 -> {rd} | {cases} | _ -> Stdlib.raise {wire}.Bad)"
    return read


def _call_and_reply(g: _Gen, e: Entry, env: dict[str, str], call: str) -> str:
    """The oracle's code once every argument is read (a0 ...): the shadows of the arguments that
    hold mutable blocks, `call` as `v`, the result (or which argument it is), then what changed in
    the arguments."""
    wire = g.W
    xs = [f"a{i}" for i in range(len(e.params))]
    backs = "".join(f"; {wire}.w_array {g.w(g.resolve(p)[2][0], env)} b {x}" if _flat(g, p) == "array"
                    else f"; {wire}.w_bytes b {x}" if _flat(g, p)
                    else f"; {g.write_back(_param_type(lab, p), env)} b {x} s{i}" if _nested(g, lab, p) else ""
                    for i, ((lab, p), x) in enumerate(zip(e.params, xs)))
    shadows = "".join(f" let s{i} = {g.shadow(_param_type(lab, p))} {x} in"
                      for i, ((lab, p), x) in enumerate(zip(e.params, xs)) if _nested(g, lab, p))
    write = f"{g.w(e.result, env)} b v"
    same = _same_params(g, e)
    if same:
        which = " else ".join(f"if v == {xs[i]} then {i}" for i in same) + " else -1"
        write = f"(match {which} with -1 -> {wire}.w_int b (-1); {write} | i -> {wire}.w_int b i)"
    return f"{shadows} let v = {call} in {wire}.begin_write (); {write}{backs}"


def _serve(g: _Gen, k: int, e: Entry, env: dict[str, str], lambdas: tuple["Lambda", ...] = (),
           lambda_unit: str = "") -> str:
    """How the oracle serves calls of `entry_k`: read the arguments, call, write the result (and
    what it changed in the arguments); `env`: the type variables' writers and readers."""
    wire = g.W
    xs = [f"a{i}" for i in range(len(e.params))]
    read = _arg_reads(g, k, e, env, lambdas, lambda_unit)
    reads = " ".join(f"let {x} = {read(i)} in" for i, x in enumerate(xs))
    if any(g.has_var(_param_type(lab, p)) for lab, p in e.params):  # the trusted side's values, first
        reads = f"{wire}.r_vals r; " + reads
    args = " ".join(_labelled(lab, x) for (lab, _), x in zip(e.params, xs))
    call = f"entry_{k} {args}" if e.params else f"entry_{k}"
    return f"(fun r b -> {reads} {wire}.r_end r;{_call_and_reply(g, e, env, call)})"


def _serve_staged(g: _Gen, k: int, e: Entry, env: dict[str, str], lambdas: tuple["Lambda", ...] = (),
                  lambda_unit: str = "") -> str:
    """How the oracle serves a staged entry point (`_staged`): one argument at a time, each partial
    application registered as a handle the trusted side calls from then on (its number written
    back), the last one called; then the result and what changed in the arguments, as `_serve`."""
    wire, n = g.W, len(e.params)
    xs = [f"a{i}" for i in range(n)]
    read = _arg_reads(g, k, e, env, lambdas, lambda_unit)
    # stage s: the closure `c` after arguments 0 .. s-1 (held as a0 .. a{s-1}) reads argument s
    last = n - 1
    stages = [f"let stage{last} {' '.join(xs[:last])} c = fun r b -> let {xs[last]} = {read(last)} in "
              f"{wire}.r_end r;{_call_and_reply(g, e, env, f'c {xs[last]}')} in"]
    for s_ in range(last - 1, -1, -1):
        held = " ".join(xs[:s_ + 1])
        # a frame that ends here made a partial application the tests hold (wire.ml, `eager`):
        # its handle, then how many arguments its closure takes before it runs
        stages.append(f"let stage{s_} {' '.join(xs[:s_])} c = fun r b -> let {xs[s_]} = {read(s_)} in "
                      f"let c = c {xs[s_]} in {wire}.w_int b ({wire}.register (stage{s_ + 1} {held} c)); "
                      f"if {wire}.at_end r then {wire}.w_int b ({wire}.closure_arity c) else "
                      f"stage{s_ + 1} {held} c r b in")
    return "(" + " ".join(stages) + f" stage0 entry_{k})"


def _functor_server(g: _Gen) -> str:
    """U's side of a functor entry point: handle 0 applies the answer's functor to an element
    module over the wire's tokens whose `compare` is the trusted program's handle, binds the
    instance's values at the prompt's types (a mismatch is the answer's error, in entry.ml) and
    answers with the instance's number; handle k + 1 serves the k-th value of instance number i,
    its first argument."""
    W = g.W
    g.q = "M."  # the instance's types
    env = {ELEMENT_VAR: f"{W}.Tok.w", "r:" + ELEMENT_VAR: f"{W}.Tok.r"}
    tok = {ELEMENT_VAR: f"{W}.Tok.t"}
    codecs = g.codecs()
    out = [(f"let grader_instances : (int, ({W}.reader -> Stdlib.Buffer.t -> unit) array) Stdlib.Hashtbl.t = "
            "Stdlib.Hashtbl.create 4\n"),
           (f"let grader_make (compare : {W}.Tok.t -> {W}.Tok.t -> int) : int =\n"
            f"  let module M = Solution.{ENTRY_MODULE} (struct type t = {W}.Tok.t let compare = compare end) in\n"),
           f"  {codecs} in\n" if codecs else ""]
    out += [f"  {entry_binding(g, k, f'entry_{k}', tok, quantify=False, target=f'M.{e.name}').rstrip()} in\n"
            for k, e in enumerate(g.iface.entries)]
    out.append("  let i = Stdlib.Hashtbl.length grader_instances in\n"
               "  Stdlib.Hashtbl.replace grader_instances i [|" + "; ".join(_serve(g, k, e, env) for k, e in enumerate(g.iface.entries))
               + "|];\n  i\n")
    out.append(f"let () = ignore ({W}.register (fun r b -> let c = {g.r(ELEMENT_COMPARE, env)} r in {W}.r_end r; "
               f"{W}.w_int b (grader_make c)))\n")
    for k in range(len(g.iface.entries)):
        out.append(f"let () = ignore ({W}.register (fun r b -> match Stdlib.Hashtbl.find_opt grader_instances ({W}.r_int r) "
                   f"with Some s -> s.({k}) r b | None -> Stdlib.raise {W}.Bad))\n")
    out.append(f"let () = {W}.serve ()\n")
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
    g = _Gen(iface, "W", "U")
    head = ""
    if poison:
        head = '# 1 "grader_poison.ml"\ntype grader_poison\n' + "".join(
            f"let {n} : grader_poison = Obj.magic 0\n" for n in sorted(poison) if n[0].islower()) + "".join(
            f"module {n} = struct end\n" for n in sorted(poison) if n[0].isupper()) + ";;\n"
    return head + "".join(f'# 1 "lambda_{lam.j}.ml"\nlet l_{lam.j} : {g.ty(lam.type, {})} = ({lam.text})\n;;\n'
                          for lam in lambdas)


def _arg_writer(g: _Gen, k: int, i: int, label: str, p: Type, env: dict[str, str]) -> str:
    t = g.resolve(p)
    if label or t[0] != "arrow":
        return g.w(_param_type(label, p), env)
    return f"(fun b f -> {g.W}.w_fun_at b {k * SITE_STRIDE + i} (Obj.repr f) {g.invoker(t, env)})"


def _arg_reader(g: _Gen, k: int, i: int, label: str, p: Type, env: dict[str, str],
                lambdas: tuple[Lambda, ...], unit: str) -> str:
    here = [lam.j for lam in lambdas if lam.site == k * SITE_STRIDE + i]
    plain = g.r(_param_type(label, p), env)
    if not here or not unit:
        return plain
    W = g.W
    cases = " | ".join(f"{j} -> {unit}.l_{j}" for j in here)
    return (f"(fun r -> let h = {W}.r_int r in if h >= 0 then {g.proxy(g.resolve(p), env)} "
            f"else match - h - 1 with {cases} | _ -> Stdlib.raise {W}.Bad)")
