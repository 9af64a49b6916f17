"""How values of the prompt's types cross the wire (ocaml/wire.ml), as OCaml text for either side
(`Gen`): writers and readers by type (Stdlib's basic types, lists, arrays, options, results,
tuples, the prompt's own variants, records and polymorphic variants, functions as handles both
ways, type variables as the values themselves, abstract types as handles), the prompt's
exceptions, and what changes in an argument during a call (writeback.py). oracle.py puts them
together into the two programs' code.
"""
from __future__ import annotations

import zlib

from ocaml_grpo.grading.interface import ALIASES, MAP_KEYS, SIGNALS, Interface, Type, map_key, subst
from ocaml_grpo.grading.writeback import WriteBack

HANDLES = "Handles__"  # T's module of the handles' primitives (ocaml/handles.c)


# Code generation. `side` is "T" (prompt types in scope) or "U" (the answer's, as Solution.*).

class Gen(WriteBack):
    def __init__(self, iface: Interface, wire: str, side: str):
        self.iface, self.W, self.side = iface, wire, side
        self.defs = {d.name: d for d in iface.types}
        self.q = "" if side == "T" else "Solution."
        self.mirrors: dict[int, tuple[Type, str]] = {}  # key -> (type, its mutable fields): `shared`

    def resolve(self, t: Type) -> Type:
        """Aliases of the prompt expanded (their parameters substituted)."""
        while t[0] == "con" and t[1] in self.defs and self.defs[t[1]].kind in ("alias", "poly"):
            d = self.defs[t[1]]
            t = subst(d.body, dict(zip(d.params, t[2])))
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
                    cases.append(f"`{tag} -> {W}.w_ptag b {ocaml_string(tag)}")
                else:
                    cases.append(f"`{tag} x -> {W}.w_ptag b {ocaml_string(tag)}; {self.w(a, env)} b x")
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
                    cases.append(f"{ocaml_string(tag)} -> `{tag}")
                else:
                    cases.append(f"{ocaml_string(tag)} -> `{tag} ({self.r(a, env)} r)")
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
        # a record's fields a block that crosses again may change: its mutable ones ([||]: every one)
        fixed = "[| " + "; ".join(str(i) for i, (f, _) in enumerate(d.body) if f in d.mutable) + " |]" if d else "[||]"
        self.mirrors[key] = (t, fixed)
        if way == "w":
            return f"({self.W}.w_shared {key} {codec})"
        return f"({self.W}.r_shared {key} {fixed} {codec})"

    def mirror_codecs(self) -> str:
        """Each shared key's writer, mutable fields and reader, for the blocks that changed while
        both sides hold them (wire.ml, `changed_blocks`). Both sides register every key either
        met, both ways, so each reads whatever the other sends."""
        done: set[int] = set()
        out = []
        while todo := [k for k in self.mirrors if k not in done]:
            for key in todo:  # generating a codec may meet the types inside it: more keys
                done.add(key)
                t, fixed = self.mirrors[key]
                imm = "true" if all(self.immediate(a) for a in self.fields_of(t)) else "false"
                out.append(f"let () = {self.W}.mirror_codec {key} {self.con(t, {}, 'w')} {fixed} {self.con(t, {}, 'r')} {imm}\n")
        return "".join(out)

    def fields_of(self, t: Type) -> list[Type]:
        """The types of a mirrored block's fields: an array's or a ref's element, a record's fields
        (bytes: none)."""
        d = self.defs.get(t[1])
        if d is not None:
            return [subst(a, dict(zip(d.params, t[2]))) for _, a in d.body]
        return list(t[2])

    def immediate(self, t: Type) -> bool:
        """Whether every value of `t` is an immediate (an int, a char, a bool, unit, a constant
        constructor of the prompt's): never a pointer, a closure or a handle."""
        t = self.resolve(t)
        if t[0] != "con":
            return False
        d = self.defs.get(t[1])
        if d is not None:
            return d.kind == "variant" and all(not args for _, args in d.body)
        return ALIASES.get(t[1], t[1]) in ("int", "char", "bool", "unit")

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
        args, res = uncurry(t)
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
        args, res = uncurry(t)
        xs = [f"y{i}" for i in range(len(args))]
        writes = "; ".join(f"{self.w(a, env)} b {x}" for a, x in zip(args, xs))
        write = f"(fun b -> {writes})"
        if self.side == "T" and any(self.has_var(a) for a in args):
            write = f"({self.W}.w_vals tb {write})"
        read = self.r(res, env)
        if self.side == "U" and self.has_var(res):
            read = f"(fun r -> {self.W}.r_vals r; {read} r)"
        return f"(fun {' '.join(xs)} -> {self.W}.call h {write} {read})"

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
        return "".join(f"type {params_text(d.params)}{d.name} = Handle__{d.name} of {HANDLES}.t [@@unboxed]\n"
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



def params_text(params: tuple[str, ...]) -> str:
    ps = [f"'{p}" for p in params]
    return "" if not ps else (ps[0] + " " if len(ps) == 1 else "(" + ", ".join(ps) + ") ")


def uncurry(t: Type) -> tuple[list[Type], Type]:
    args = []
    while t[0] == "arrow":
        args.append(t[2])
        t = t[3]
    return args, t




def ocaml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

def param_type(label: str, t: Type) -> Type:
    """What a parameter's variable holds: an optional one is an option."""
    return ("con", "option", (t,)) if label.startswith("?") else t
