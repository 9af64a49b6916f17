"""What an entry point changes in its arguments, carried back after each call: the mutable blocks
inside an argument (arrays in lists, rows of a matrix, refs, records' mutable fields, those in a
variant's arguments) written back in place by the oracle and read back into the tests' own value,
a block the answer replaced sent whole. A part of codecs.Gen (which gives `w`, `r` and `resolve`).
"""
from __future__ import annotations

from ocaml_grpo.grading.interface import ALIASES, SIGNALS, Type, map_key, may_hold, subst


class WriteBack:
    # the mutable blocks inside an argument (arrays in lists, rows of a matrix), written
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
        return [(f, subst(a, m)) for f, a in d.body]

    def _ctors(self, t: Type) -> list[tuple[str, list[Type]]]:
        """A variant's constructors with their arguments at this instance of its parameters."""
        d = self.defs[self.resolve(t)[1]]
        m = dict(zip(d.params, self.resolve(t)[2]))
        return [(c, [subst(a, m) for a in args]) for c, args in d.body]

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

