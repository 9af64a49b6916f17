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

from ocaml_grpo.grading.codecs import Gen, param_type
from ocaml_grpo.grading.interface import ALIASES, ELEMENT_VAR, ORDERED_SIG, SIGNALS, Entry, Functor, Interface, Type, mentions, type_vars
from ocaml_grpo.grading.shipped import Lambda, arg_reader, arg_writer


def _is_array(g: Gen, t: Type) -> str:
    t = g.resolve(t)
    if t[0] == "con" and ALIASES.get(t[1], t[1]) in ("array", "bytes") and t[1] not in g.defs:
        return ALIASES.get(t[1], t[1])
    return ""


def _labelled(label: str, x: str) -> str:
    return f"{label}:{x}" if label.startswith("?") else (f"~{label}:{x}" if label else x)




def _flat(g: Gen, t: Type) -> str:
    """A top-level array (of values without mutable blocks) or bytes argument, sent back whole."""
    kind = _is_array(g, t)
    return kind if kind == "bytes" or (kind == "array" and not g.mutable_inside(g.resolve(t)[2][0])) else ""


def _nested(g: Gen, label: str, t: Type) -> bool:
    """An argument holding mutable blocks that are not simply its own contents: arrays in a list,
    the rows of a matrix."""
    return not _flat(g, t) and g.mutable_inside(param_type(label, t))


def _staged(e: Entry, signals: bool, instance: str = "") -> bool:
    """An entry point of two or more arguments, none optional (outside a functor, beside no
    signal): a partial application of it in the tests happens in the oracle, once, and stays the
    answer's closure there (wire.ml, `call_staged`), so `let triple = scale 3` (or `scale ~k:3`,
    or `app f`) is one application of `scale` however often `triple` is called. Labels are the
    tests' business: an application that names a later label first waits, in one program too, for
    the arguments before it. Type variables are fixed once per application chain (a partial
    application is never generalised): one table of values for its frames."""
    return len(e.params) >= 2 and not instance and not signals and not any(lab.startswith("?") for lab, _ in e.params)


def _copied(e: Entry) -> list[int]:
    """The arguments a partial application of `e` would hold as copies in the oracle: those but
    the last of a type with variables, not functions (a function stays in the trusted program, a
    handle; a type without variables is immutable or kept in step: wire.ml). A copy (Marshal) is
    not reached by the tests' later changes (`let p = push s` over `s : 'a list ref`, then
    `s := []`): with any, a partial application is made in the oracle only where the answer's code
    runs at it (`eager`), never on the way of a total call, and is watched (wire.ml `still_held`)."""
    return [j for j, (_, p) in enumerate(e.params[:-1]) if p[0] != "arrow" and type_vars(p)]


# Types whose values are immediate: nothing to alias.
IMMEDIATE = {"int", "bool", "char", "unit"}


def _aliases(g: Gen, e: Entry) -> dict[int, list[int]]:
    """Each argument that may be the same block as an earlier one of the same type (`f a a`): the
    earlier ones. The oracle then gets one block for both, as the answer would in one program.
    Functions and values of type variables have their own ways (handles; one blob, sharing kept)."""
    seen: dict[str, list[int]] = {}
    out: dict[int, list[int]] = {}
    for i, (lab, p) in enumerate(e.params):
        t = g.resolve(param_type(lab, p))
        if t[0] == "arrow" or g.has_var(t) or (t[0] == "con" and ALIASES.get(t[1], t[1]) in IMMEDIATE
                                                and t[1] not in g.defs):
            continue
        key = g.ty(t, {})
        if seen.get(key):
            out[i] = list(seen[key])
        seen.setdefault(key, []).append(i)
    return out


def _same_params(g: Gen, e: Entry) -> list[int]:
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
    return [i for i, (lab, p) in enumerate(e.params) if g.ty(param_type(lab, p), {}) == want]


def trusted_stubs(iface: Interface, wire: str) -> str:
    """T's code between the prompt's definitions and the tests: codecs, then one stub per entry
    point, at the prompt's type, that asks the oracle (handle k = the k-th entry point)."""
    g = Gen(iface, wire, "T")
    if iface.functor:
        return _functor_stubs(g)
    signals = any(mentions(e.result, SIGNALS - set(g.defs)) for e in iface.entries)
    stubs = [_stub(g, k, e, signals) for k, e in enumerate(iface.entries)]
    return "".join([g.handle_runtime(), g.handle_types(), g.codecs(), g.exception_codec()] + stubs + [g.mirror_codecs()])


def _stub(g: Gen, k: int, e: Entry, signals: bool, instance: str = "", table: str = "") -> str:
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
        w = arg_writer(g, k, i, lab, p, env) + f" b {x}"
        if i not in aliases:
            return w
        same = " else ".join(f"if {x} == {xs[j]} then {wire}.w_int b {j}" for j in aliases[i])
        return f"({same} else ({wire}.w_int b (-1); {w}))"
    writes = "; ".join([write(i, lab, p, x) for i, ((lab, p), x) in enumerate(zip(e.params, xs))]) or "()"
    if any(g.has_var(param_type(lab, p)) for lab, p in e.params):  # the values first, as one blob
        writes = f"{wire}.w_vals tb (fun b -> {writes}) b"
    if instance:
        writes = f"{wire}.w_int b {instance}; {writes}"
    backs = "".join(f" {wire}.blit_back {x} ({wire}.r_array {g.r(g.resolve(p)[2][0], env)} r);"
                    if _flat(g, p) == "array" else f" {wire}.bytes_back {x} ({wire}.r_bytes r);" if _flat(g, p)
                    else f" {g.read_back(param_type(lab, p), env)} r {x};" if _nested(g, lab, p) else ""
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
        # one table of the type variables' values for the chain, its values before each frame's
        frame = f"({wire}.w_vals tb)" if any(g.has_var(param_type(lab, p)) for lab, p in e.params) else "(fun w -> w)"
        table = f"let tb = {wire}.tokens {len(vs)} {'false' if g.named_handles() else 'true'} in " if vs else ""
        # what each prefix would hold copies of (wire.ml, `snapshot`); prefix i's thunk names
        # arguments 0..i, in scope from stage i on
        copied = _copied(e)

        def snap(i: int) -> str:
            held = [xs[j] for j in copied if j <= i]
            return f"(fun () -> {wire}.snapshot ({', '.join(held)}))" if held else f"{wire}.no_snapshot"

        def snaps(upto: int) -> str:
            return "[| " + "; ".join(snap(i) for i in range(upto + 1)) + " |]"
        # each application short of the last may run the answer's code now (wire.ml, `eager`)
        lam = "".join(f"fun {_labelled(lab, x)} -> {table if i == 0 else ''}let {q} = {wire}.prefix () in "
                      f"{wire}.eager {frame} {snaps(i)} {k} [| {'; '.join(ps[:i + 1])} |] "
                      f"[| {'; '.join(ws_list[:i + 1])} |]; "
                      for i, ((lab, _), x, q) in enumerate(zip(e.params, xs, ps)))
        keep = "false" if copied else "true"
        body = _noted(g, k, xs, instance,
                      f"{wire}.call_staged {frame} {snaps(len(ps) - 1)} {keep} {k} [| {'; '.join(ps)} |] [| {ws} |] {read}")
        return f"let {e.name} : {ty} = {lam}fun {_labelled(e.params[-1][0], xs[-1])} -> {body}\n"
    strict = "false" if g.iface.functor or g.named_handles() or signals else "true"
    tb = table or f"{wire}.tokens {len(vs)} {strict}"
    body = (f"let tb = {tb} in " if vs else "") + f"let write b = {writes} in "
    body += _noted(g, k, xs, instance, f"{wire}.call {k} write {read}")
    if signals:  # after any call, every mirrored signal takes the oracle's value
        body = f"let v = {body} in {wire}.refresh (); v"
    if e.params:
        return f"let {e.name} : {quant}{ty} = fun {binders} -> {body}\n"
    return f"let {e.name} : {ty} = {body}\n"


def _noted(g: Gen, k: int, xs: list[str], instance: str, call: str) -> str:
    """A call of entry point k with arguments `xs`, noted for the constant-answer metric (wire.ml,
    `noted`); a functor instance's entry points share k, and are not."""
    if not xs or instance:
        return call
    return f"{g.W}.noted {k} ({', '.join(xs)}) (fun () -> {call})"


# The element module's `compare`, as the wire carries it (a handle of the tests' own compare).
ELEMENT_COMPARE: Type = ("arrow", "", ("var", ELEMENT_VAR), ("arrow", "", ("var", ELEMENT_VAR), ("con", "int", ())))


def _functor_type(f: Functor) -> str:
    """The functor's module type as the prompt declares it, over an ordered type."""
    return f"functor ({f.param} : {ORDERED_SIG}) -> {f.result_sig}"


def _functor_stubs(g: Gen) -> str:
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
                   + [g.mirror_codecs(), "end\n"])


ENTRY_ALIAS = "grader_entry_"  # + k: the k-th entry point, named where the answer's scope ends


def entry_aliases(iface: Interface) -> str:
    """Appended inside the answer's module: each entry point as the answer's own scope resolves it
    at its end (a name brought in by `open Impl` included), which is what tests appended to the
    answer would call. Last, so it shadows any name the answer gave itself."""
    if iface.functor:
        return f"module {ENTRY_MODULE} = {iface.functor.name}\n"
    return "".join(f"let {ENTRY_ALIAS}{k} = {e.name}\n" for k, e in enumerate(iface.entries))


ENTRY_MODULE = "Grader_entry_functor"  # a functor entry point, named where the answer's scope ends


def entry_binding(g: "Gen", k: int, name: str, vars_as: dict[str, str], quantify: bool, eta: bool = True,
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
    g = Gen(iface, "", "U")
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
    g = Gen(iface, wire, "U")
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
    out.append(g.mirror_codecs())
    out.append(f"let () = {wire}.serve ()\n")
    return "".join(out)


def _arg_reads(g: Gen, k: int, e: Entry, env: dict[str, str], lambdas: tuple["Lambda", ...],
               lambda_unit: str):
    """The oracle's reader of argument i (`read(i)`): an argument that may be an earlier one of its
    type (`_aliases`) is that one when the trusted side says so."""
    wire, xs, aliases = g.W, [f"a{i}" for i in range(len(e.params))], _aliases(g, e)

    def read(i: int) -> str:
        lab, p = e.params[i]
        rd = f"{arg_reader(g, k, i, lab, p, env, lambdas, lambda_unit)} r"
        if i not in aliases:
            return rd
        cases = " | ".join(f"{j} -> {xs[j]}" for j in aliases[i])
        return f"(match {wire}.r_int r with -1 -> {rd} | {cases} | _ -> Stdlib.raise {wire}.Bad)"
    return read


def _call_and_reply(g: Gen, e: Entry, env: dict[str, str], call: str) -> str:
    """The oracle's code once every argument is read (a0 ...): the shadows of the arguments that
    hold mutable blocks, `call` as `v`, the result (or which argument it is), then what changed in
    the arguments."""
    wire = g.W
    xs = [f"a{i}" for i in range(len(e.params))]
    backs = "".join(f"; {wire}.w_array {g.w(g.resolve(p)[2][0], env)} b {x}" if _flat(g, p) == "array"
                    else f"; {wire}.w_bytes b {x}" if _flat(g, p)
                    else f"; {g.write_back(param_type(lab, p), env)} b {x} s{i}" if _nested(g, lab, p) else ""
                    for i, ((lab, p), x) in enumerate(zip(e.params, xs)))
    shadows = "".join(f" let s{i} = {g.shadow(param_type(lab, p))} {x} in"
                      for i, ((lab, p), x) in enumerate(zip(e.params, xs)) if _nested(g, lab, p))
    write = f"{g.w(e.result, env)} b v"
    same = _same_params(g, e)
    if same:
        which = " else ".join(f"if v == {xs[i]} then {i}" for i in same) + " else -1"
        write = f"(match {which} with -1 -> {wire}.w_int b (-1); {write} | i -> {wire}.w_int b i)"
    return f"{shadows} let v = {call} in {wire}.begin_write (); {write}{backs}"


def _serve(g: Gen, k: int, e: Entry, env: dict[str, str], lambdas: tuple["Lambda", ...] = (),
           lambda_unit: str = "") -> str:
    """How the oracle serves calls of `entry_k`: read the arguments, call, write the result (and
    what it changed in the arguments); `env`: the type variables' writers and readers."""
    wire = g.W
    xs = [f"a{i}" for i in range(len(e.params))]
    read = _arg_reads(g, k, e, env, lambdas, lambda_unit)
    reads = " ".join(f"let {x} = {read(i)} in" for i, x in enumerate(xs))
    if any(g.has_var(param_type(lab, p)) for lab, p in e.params):  # the trusted side's values, first
        reads = f"{wire}.r_vals r; " + reads
    args = " ".join(_labelled(lab, x) for (lab, _), x in zip(e.params, xs))
    call = f"entry_{k} {args}" if e.params else f"entry_{k}"
    return f"(fun r b -> {reads} {wire}.r_end r;{_call_and_reply(g, e, env, call)})"


def _serve_staged(g: Gen, k: int, e: Entry, env: dict[str, str], lambdas: tuple["Lambda", ...] = (),
                  lambda_unit: str = "") -> str:
    """How the oracle serves a staged entry point (`_staged`): one argument at a time, each partial
    application registered as a handle the trusted side calls from then on (its number written
    back), the last one called; then the result and what changed in the arguments, as `_serve`."""
    wire, n = g.W, len(e.params)
    xs = [f"a{i}" for i in range(n)]
    read = _arg_reads(g, k, e, env, lambdas, lambda_unit)
    # stage s: the closure `c` after arguments 0 .. s-1 (held as a0 .. a{s-1}) reads argument s
    last = n - 1
    arg = [_labelled(lab, x) for (lab, _), x in zip(e.params, xs)]
    stages = [f"let stage{last} {' '.join(xs[:last])} c = fun r b -> let {xs[last]} = {read(last)} in "
              f"{wire}.r_end r;{_call_and_reply(g, e, env, f'c {arg[last]}')} in"]
    # each frame starts with the values of the chain's type variables (the trusted side's `frame`)
    vals = any(g.has_var(param_type(lab, p)) for lab, p in e.params)

    def framed(f: str) -> str:
        return f"(fun r b -> {wire}.r_vals r; {f} r b)" if vals else f"({f})"
    for s_ in range(last - 1, -1, -1):
        held = " ".join(xs[:s_ + 1])
        # a frame that ends here made a partial application the tests hold (wire.ml, `eager`):
        # its handle, then how many arguments its closure takes before it runs
        stages.append(f"let stage{s_} {' '.join(xs[:s_])} c = fun r b -> let {xs[s_]} = {read(s_)} in "
                      f"let c = c {arg[s_]} in {wire}.w_int b ({wire}.register {framed(f'stage{s_ + 1} {held} c')}); "
                      f"if {wire}.at_end r then {wire}.w_int b ({wire}.closure_arity c) else "
                      f"stage{s_ + 1} {held} c r b in")
    return "(" + " ".join(stages) + f" {framed(f'stage0 entry_{k}')})"


def _functor_server(g: Gen) -> str:
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
    out += [f"  {line} in\n" for line in g.mirror_codecs().splitlines()]  # the instance's types
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
