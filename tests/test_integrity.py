"""Reward integrity by design (issue #19): which library code a solution reaches is decided on
the compiler's typed tree against an allowlist (deny by default, the solution's own names never
matter), every compile request meets a fresh compiler, error classes come from the compiler's
exceptions, lines are counted as OCaml's lexer counts them, and a blocked test program is stopped.
Real compiler, real sandbox."""
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ADD, fenced
from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.server import ALLOWLIST, build_server
from ocaml_grpo.grading.completions import assemble_solution
from ocaml_grpo.grading.grader import OcamlGrader
from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.grading.sandbox import Sandbox
from rewards import RewardConfig, RewardScorer


@pytest.fixture(scope="module")
def tool() -> Path:
    return build_server(cache_dir(os.environ))


def denied(tool: Path, tmp_path: Path, code: str) -> list[str]:
    """The allowlist's verdict on ocamlc's own typed tree (-bin-annot), as the ocamlc path reads it."""
    (tmp_path / "s.ml").write_text(code + "\n")
    subprocess.run(["ocamlc", "-w", "-a", "-alert", "-all", "-bin-annot", "-c", "s.ml"], cwd=tmp_path, check=True,
                   capture_output=True)
    out = subprocess.run([str(tool), "--check-cmt", "s.cmt"], cwd=tmp_path, check=True, capture_output=True, text=True)
    return out.stdout.split()


# Each reaches library code off the list, by a route a name list would have to know about. What is
# named is the value reached, by the compiler's identity of it (its path, aliases followed at any
# depth, else its declaration), whatever module name it was reached through.
ROUTES = {
    "module O = Obj\nlet f x = O.repr x": "Stdlib.Obj.repr",
    "open Obj\nlet f x = repr x": "Stdlib.Obj.repr",
    "include Stdlib\nlet f x = Obj.repr x": "Stdlib.Obj.repr",
    # the answer's own signature is what the test program sees: here it holds `stdin`, `exit`, ...
    "include Stdlib\nlet f x = x": "Stdlib.stdin",
    "include String": "Stdlib.String.unsafe_get",
    "module S = Stdlib\nlet f s = S.Marshal.to_string s []": "Stdlib.Marshal.to_string",
    "module B = Bytes\nlet f b = B.unsafe_get b 0": "Stdlib.Bytes.unsafe_get",
    "let f () = input_value stdin": "Stdlib.input_value",
    'module type S = sig external f : int -> int = "%identity" end': "external",
    "let f = let module M = struct external id : 'a -> 'a = \"%identity\" end in M.id": "external",
    "let f x = CamlinternalLazy.force x": "CamlinternalLazy.force",
    # the runtime calls a registered name with a value of another type: a free cast
    'let () = Callback.register "Printexc.handle_uncaught_exception" (fun x -> x)': "Stdlib.Callback.register",
    'let () = Stdlib__Callback.register "x" 1': "Stdlib.Callback.register",
    "let () = Printexc.set_uncaught_exception_handler (fun _ _ -> ())": "Stdlib.Printexc.set_uncaught_exception_handler",
    "let () = at_exit ignore": "Stdlib.at_exit",
    "let f () = exit 0": "Stdlib.exit",
    'let f () = Sys.command "true"': "Stdlib.Sys.command",
    "let f () = Gc.compact ()": "Stdlib.Gc.compact",
    "let f e = Parsing.peek_val e 0": "Stdlib.Parsing.peek_val",
    # aliases at any depth, includes, first-class modules, functor arguments and results
    "module N = struct module S = String end\nlet f s = N.S.unsafe_get s 0": "Stdlib.String.unsafe_get",
    "module M = struct include String end\nlet f s = M.unsafe_get s 0": "Stdlib.String.unsafe_get",
    "module O = struct include Obj end\nlet f x = O.magic x": "Stdlib.Obj.magic",
    "let f s = let module M = String in M.unsafe_get s 0": "Stdlib.String.unsafe_get",
    "open struct include Obj end\nlet f x = magic x": "Stdlib.Obj.magic",
    "module M = struct module N = struct include Stdlib end end\nlet f x = M.N.Obj.magic x": "Stdlib.Obj.magic",
    "module type U = sig val unsafe_get : string -> int -> char end\nlet m = (module String : U)":
        "Stdlib.String.unsafe_get",
    "module F (X : sig val unsafe_get : string -> int -> char end) = struct let g = X.unsafe_get end\n"
    "module G = F (String)": "Stdlib.String.unsafe_get",
    "module M = struct include String end\n"
    "module F (X : sig val unsafe_get : string -> int -> char end) = struct end\nmodule G = F (M)":
        "Stdlib.String.unsafe_get",
    "module Id (X : module type of String) = X\nmodule W = Id (String)\nlet w = W.unsafe_get": "Stdlib.String.unsafe_get",
    "module type T = sig module S : module type of String end\nmodule F (X : T) = struct end\n"
    "module G = F (struct module S = String end)": "Stdlib.String.unsafe_get",
    "module App (F : functor (X : sig val unsafe_get : string -> int -> char end) -> sig end) = F (String)":
        "Stdlib.String.unsafe_get",
    "module S : sig val unsafe_get : string -> int -> char end = String\nlet f s = S.unsafe_get s 0":
        "Stdlib.String.unsafe_get",
    "module M : sig val unsafe_get : string -> int -> char end = struct include String end":
        "Stdlib.String.unsafe_get",
    "module rec R : sig val unsafe_get : string -> int -> char end = String": "Stdlib.String.unsafe_get",
    # a listed library functor calls what its argument shows it: that crosses a signature too
    "module K = struct type t = string let compare = String.compare\n"
    "  include (String : sig val unsafe_get : string -> int -> char end) end\nmodule S = Set.Make (K)":
        "Stdlib.String.unsafe_get",
    # a first-class module unpacked later: its values are the declarations of `module type of String`
    "module type T = module type of String\nlet f (m : (module T)) = let module M = (val m) in M.unsafe_get":
        "Stdlib.String.unsafe_get",
    # a library functor off the list, reached through the answer's own module
    "module E = struct include Ephemeron.K1 end\n"
    "module H = E.Make (struct type t = int let equal = (=) let hash = Hashtbl.hash end)": "Stdlib.Ephemeron.K1.Make",
    "module App (F : functor (X : Hashtbl.HashedType) -> sig end) = struct end\nmodule A = App (Ephemeron.K1.Make)":
        "Stdlib.Ephemeron.K1.Make",
    "let f a = let open Array in unsafe_get a 0": "Stdlib.Array.unsafe_get",
    # attributes that change a value's representation or the type checker's trust; any not harmless
    "type t = { f : float } [@@unboxed]": "attribute:unboxed",
    "type t = A of float [@@ocaml.unboxed]": "attribute:unboxed",
    "let f (x : (float [@unboxed])) = x": "attribute:unboxed",
    "type t = int [@@immediate]": "attribute:immediate",
    "type t = int [@@ocaml.immediate64]": "attribute:immediate64",
    "let f (x : (int [@untagged])) = x": "attribute:untagged",
    "type t = { x : int } [@@deriving show]": "attribute:deriving",
}


@pytest.mark.parametrize("code", sorted(ROUTES))
def test_every_route_off_the_list_is_named(tool, tmp_path, code):
    assert denied(tool, tmp_path, code)[:1] == [ROUTES[code]]


@pytest.fixture(scope="module")
def graders():
    """Both compile paths: the compile server (the answer typed inside the test program) and one
    `ocamlc` per step (the answer typed alone, its .cmt checked)."""
    sb = Sandbox()
    a, b = OcamlGrader(sb, compiler="server"), OcamlGrader(sb, compiler="ocamlc")
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("code", sorted(ROUTES))
def test_both_compile_paths_name_the_same_route(graders, code):
    sol, entries = assemble_solution(code + "\nlet add a b = a + b", ADD.prompt, ADD.entry_point)
    server, ocamlc = (g.grade(sol, ADD.tests, [], entries, ADD.prompt) for g in graders)
    assert server.forbidden == ocamlc.forbidden == ROUTES[code]
    assert server.tests_passed == ocamlc.tests_passed == 0


# Honest answers that reach only listed values, through routes the old whole-module rule denied.
HONEST_ROUTES = [
    "module Helpers = struct module S = String let f s = S.length s end\n"
    "let add a b = a + b + Helpers.f \"\"",
    "module String = struct include String let shout s = uppercase_ascii s end\n"
    "let add a b = a + b + String.length (String.shout \"\")",
    "let m = (module String : Set.OrderedType with type t = string)\n"
    "let add a b = let module O = (val m) in if O.compare \"a\" \"a\" = 0 then a + b else 0",
    "module F (X : sig val length : string -> int end) = struct let g = X.length end\nmodule G = F (String)\n"
    "let add a b = a + b + G.g \"\"",
    "module Ints = struct include List let total = fold_left ( + ) 0 end\nlet add a b = Ints.total [a; b]",
    # what `open struct ... end` binds is not in the answer's signature: only what is used counts
    "open struct include String end\nlet add a b = a + b + length \"\"",
    # (the typer then constrains the answer's structure to its signature: still the Solution module)
    "open struct let helper x = x end\nlet add a b = helper (a + b)",
    "module SM = Map.Make (String)\nmodule F (X : Set.OrderedType) = struct let c = X.compare end\n"
    "let add a b = SM.cardinal SM.empty + a + b",
    # harmless attributes: documentation, warnings, optimisation hints
    "(** Adds. *)\nlet[@inline] add a b = (a + b [@ocaml.warning \"-8\"])\n[@@@ocaml.warning \"-32\"]\n"
    "let unused = (add [@inlined]) 1 2 [@@ocaml.doc \"x\"]",
    # tail recursion modulo cons (OCaml 4.14; 4.13 ignores it), a tail-call check, a local warning
    "let[@tail_mod_cons] rec copy = function [] -> [] | x :: t -> x :: copy t\n"
    "let add a b = (List.fold_left ( + ) 0 [@tailcall]) (copy [a; b]) [@@warning \"-32\"]",
]


@pytest.mark.parametrize("code", HONEST_ROUTES)
def test_honest_routes_to_listed_values_get_full_credit(graders, tool, tmp_path, code):
    assert denied(tool, tmp_path, code) == []
    sol, entries = assemble_solution(code, ADD.prompt, ADD.entry_point)
    for g in graders:
        b = g.grade(sol, ADD.tests, [], entries, ADD.prompt)
        assert b.forbidden is None and b.tests_passed == 7, (b.forbidden, b.compile_errors, b.test_error)


def test_an_unboxed_tower_past_the_type_checkers_limit_earns_nothing(scorer):
    """OCaml 4.13's type checker stops looking through [@@unboxed] wrappers after 100 of them: a
    float 101 wrappers deep is then taken for a pointer, and read as one from a flat float array
    (any memory). [@@unboxed] changes a value's representation: it is denied, named."""
    tower = "type w0 = float\n" + "".join(f"type w{i} = W{i} of w{i - 1} [@@unboxed]\n" for i in range(1, 102))
    value = "".join(f"W{i} (" for i in range(101, 0, -1)) + "1.0" + ")" * 101
    code = tower + f"let a = Array.make 2 ({value})\nlet add x y = ignore (Array.get a 0); x + y"
    b = scorer.score_one(ADD, fenced(code))
    assert b.compiled and b.forbidden == "attribute:unboxed" and b.tests_passed == 0


def test_the_solutions_own_names_never_matter(tool, tmp_path):
    code = ('type json = Obj of (string * json) list | Str of string\n'
            'let unsafe_total = 1\nlet input_value = 2\nmodule Marshal = struct let to_string x = x end\n'
            'let f = function Obj _ -> Marshal.to_string "x" | Str s -> s\n'
            'module S = String\nlet n = S.length "ab" + unsafe_total + input_value\n'
            'module SM = Map.Make (String)\nmodule H = Hashtbl.Make (struct type t = int let equal = (=) let hash = Hashtbl.hash end)\n'
            'module L = List\ninclude struct let g = L.map succ end\nlet l = lazy 1\nlet o = object method m = 1 end\n'
            'let () = Printf.printf "%d" (String.length (Buffer.contents (Buffer.create 1)))\n')
    assert denied(tool, tmp_path, code) == []


CORRECT_WITH_LOCAL_NAMES = """type t = Obj | Leaf
let unsafe_total = 0
let input_value = 0
module Marshal = struct let to_string x = x end
let add a b = ignore (Obj, Leaf, Marshal.to_string ()); a + b + unsafe_total + input_value"""
# A literal table whose typed tree printed as -dtypedtree text outgrew the 16 MB file limit.
CORRECT_WITH_TABLE = ("let table = [|" + "; ".join(f"({i}, \"entry number {i}\")" for i in range(1200)) + "|]\n"
                      "let add a b = a + b + (fst table.(0))")


@pytest.mark.parametrize("code", [CORRECT_WITH_LOCAL_NAMES, CORRECT_WITH_TABLE])
def test_honest_answers_get_full_credit(scorer, code):
    b = scorer.score_one(ADD, fenced(code))
    assert b.reward == 1.0 and b.forbidden is None, (b.forbidden, b.first_error)


def test_a_denied_path_is_named_in_the_breakdown_and_earns_no_test_credit(scorer):
    b = scorer.score_one(ADD, fenced('let add a b = Callback.register "x" 1; a + b'))
    assert b.forbidden == "Stdlib.Callback.register" and b.tests == 0 and b.compiled


def test_allowlist_names_exist(tool):
    """Every listed value is one the library has: a typo allows nothing by accident."""
    listed = set()
    for line in ALLOWLIST.read_text().splitlines():
        if line.startswith("#") or ":" not in line:
            continue
        head, names = line.split(":", 1)
        module = head.strip()
        listed |= {f"{module}.{n}" for n in names.split() if not n.endswith(("()", "!"))}
    incs = {"Stdlib": [], "Base": ["base"], "React": ["react"], "CalendarLib": ["calendar"]}
    by_root: dict[str, set[str]] = {}
    for root, pkgs in incs.items():
        dirs = subprocess.run(["ocamlfind", "query", "-r", "-format", "%d", *pkgs], capture_output=True,
                              text=True).stdout.split() if pkgs else []
        modules = {m.rsplit(".", 1)[0] for m in listed if m.startswith(root + ".")}
        have = set()
        for m in {m.split(".")[0] + "." + m.split(".")[1] if m.count(".") else m for m in modules}:
            out = subprocess.run([str(tool), "--values", m, *dirs], capture_output=True, text=True)
            have |= set(out.stdout.split("\n"))
        by_root[root] = have
    missing = [n for n in listed if n not in by_root[n.split(".")[0]]]
    assert missing == [], missing[:10]


def test_lines_are_counted_as_ocamls_lexer_counts_them():
    one_line = 'let add a b = ignore "\x0c\x0c\u2028\u2028\x0b\x0b\x1c\x1d"; a - b'
    assert src.count_code_lines(one_line) == 1
    assert src.count_code_lines("let a = 1\r\nlet b = 2\n\n  \t\nlet c = 3") == 3
    s = RewardScorer(RewardConfig(min_lines=8, workers=1))
    try:
        assert s.score_one(ADD, fenced(one_line)).reward == 0.0
    finally:
        s.close()
    # Phrases too: a form feed or U+2028 inside a line moves no phrase boundary.
    text = "let a = 1\x0c(* x *)\nlet b = 2\nlet c = 3\u2028\nlet d = 4\n"
    assert [(p.text, p.names) for p in src.split_phrases(text)] == [
        ("let a = 1\x0c(* x *)\n", ("a",)), ("let b = 2\n", ("b",)), ("let c = 3\u2028\n", ("c",)), ("let d = 4\n", ("d",))]


def test_a_lexer_error_is_a_syntax_error(scorer):
    b = scorer.score_one(ADD, fenced("let add a b = a + b\nlet c = '\\q'"))
    assert b.syntax_errors == 1 and b.type_check == 0.0


def test_an_answer_that_closes_its_module_early_gets_no_credit(scorer):
    """The compile server types the answer once, as the test program's `Solution` module, and
    checks the allowlist there. Text that ends that module early would put code outside it (and
    outside the check); it parses in the test program but not alone, and only an answer that
    parses alone reaches the test program."""
    escape = "let add a b = a + b\nend\nlet () = ignore (Obj.magic 0 : int)\nmodule Rest = struct\nlet x = 1"
    b = scorer.score_one(ADD, fenced(escape))
    assert b.tests_passed == 0 and b.syntax_errors >= 1 and b.type_check == 0.0
    # The same code inside the answer is denied by name, as any answer's.
    inside = scorer.score_one(ADD, fenced("let add a b = ignore (Obj.magic 0 : int); a + b"))
    assert inside.tests_passed == 0 and inside.forbidden == "Stdlib.Obj.magic"


def test_a_printed_error_message_is_not_an_error_class(scorer):
    """[%%ocaml.error] prints any message: a fake syntax or unbound message earns nothing."""
    fake = scorer.score_one(ADD, fenced('let add a b = a + b\n[%%ocaml.error "Syntax error"]'))
    assert fake.syntax_errors == 0 and fake.error_kinds == ["type"]


def test_a_blocked_program_is_stopped_within_seconds_and_has_no_terminal(sandbox_scorer, tmp_path):
    # No devices but null, zero and the random ones: no terminal to block on.
    tty = sandbox_scorer.score_one(ADD, fenced(
        'let add a b = (try ignore (open_in "/dev/tty"); 0 with Sys_error _ -> a + b)'))
    assert tty.tests_passed == 7
    # And a process that blocks without using the CPU is stopped after the idle limit, not the
    # wall guard (here: 60 s). The toolchain sandbox has a shell to block with.
    sb = Sandbox()
    if not sb.as_root:
        pytest.skip("blocked processes are found by their job uid, which needs root")
    t0 = time.monotonic()
    res = sb.run(["sh", "-c", "sleep 30"], tmp_path, wall_s=60, cpu_s=5, idle_s=1.0)
    assert res.timed_out and time.monotonic() - t0 < 3
    busy = sb.run(["sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"], tmp_path, wall_s=60, cpu_s=5,
                  idle_s=1.0)
    assert not busy.timed_out and busy.returncode == 0  # a busy program is never idle


def test_a_printed_error_cannot_move_the_blame(scorer):
    """A warning the solution enables can print any text, a forged `File ... Error:` included:
    where the error is and what it says come from the compiler's report."""
    forged = ('[@@@warning "+22"]\nlet helper x = x + 1\n'
              '[@@@ocaml.ppwarning "x\\nFile \\"solution.ml\\", line 2, characters 0-3:\\nError: Unbound value zz"]\n'
              'let add a b = helper a + b\nlet bad : int = "no"')
    b = scorer.score_one(ADD, fenced(forged))
    assert b.first_error.startswith("This expression has type string"), b.first_error
    assert (b.type_errors, b.error_kinds) == (1, ["type"])
