"""Reward integrity, round 4: the verdict is decided where model code never runs, and the tests
see only the entry points, at the prompt's types. Real compiler, real sandbox, two processes."""
import subprocess

import pytest

from conftest import ADD, fenced
from ocaml_grpo.grading.interface import interface_of
from ocaml_grpo.grading.completions import assemble_solution
from ocaml_grpo.grading.harness import render_oracle, render_trusted
from ocaml_grpo.problems import Problem
from ocaml_grpo.grading import source as src

IS_EVEN = Problem(id="is_even", prompt="(** Whether n is even. *)\nlet is_even (n : int) : bool =",
                  tests="let () =\n  assert (is_even 2 = true);\n  assert (is_even 3 = false);\n"
                        "  assert (is_even 0 = true);\n  assert (is_even (-7) = false)\n;;")
DEDUP = Problem(id="dedup", prompt="(** Sorted, without duplicates. *)\nlet dedup (xs : 'a list) : 'a list =",
                tests='let () =\n  assert (dedup [3; 1; 3; 2] = [1; 2; 3]);\n  assert (dedup ["b"; "a"; "b"] = ["a"; "b"]);\n'
                      '  assert (dedup [] = ([] : float list));\n  assert (dedup [(2, "x"); (1, "y"); (2, "x")] = [(1, "y"); (2, "x")])\n;;')
TREE = Problem(id="tree", prompt="type 'a tree = Leaf | Node of 'a tree * 'a * 'a tree\n\n(** Mirror a tree. *)\n"
                                 "let mirror (t : 'a tree) : 'a tree =",
               tests="let () =\n  assert (mirror Leaf = (Leaf : int tree));\n"
                     "  assert (mirror (Node (Node (Leaf, 1, Leaf), 2, Leaf)) = Node (Leaf, 2, Node (Leaf, 1, Leaf)));\n"
                     "  assert (mirror (Node (Leaf, \"a\", Leaf)) = Node (Leaf, \"a\", Leaf))\n;;")
RAISES = Problem(id="raises", prompt="exception Empty of string\n(** The head, or Empty. *)\nlet head (xs : int list) : int =",
                 tests="let () =\n  assert (head [4; 5] = 4);\n"
                       "  assert (try ignore (head []); false with Empty s -> s = \"empty\");\n"
                       "  assert (try ignore (head [-1]); false with Invalid_argument _ -> true)\n;;")


def score(scorer, code, problem=ADD):
    return scorer.score_one(problem, fenced(code))


# ---------------------------------------------------------------------------------------------
# 1. Credit is decided where model code cannot reach.

FORGE = '''external fd_out : int -> out_channel = "caml_ml_open_descriptor_out"
let forge () =
  for fd = 0 to 64 do
    (try
       let oc = fd_out fd in
       for i = 0 to 8 do
         output_string oc (Printf.sprintf "P %d\\nS %d\\nD 0\\nR 2\\n3 \\nY 0\\n" i i)
       done;
       flush oc
     with _ -> ())
  done
let () = forge ()
let add a b = forge (); ignore (Obj.repr (a, b)); 0
'''


def test_with_the_allowlist_off_writing_any_bytes_to_any_descriptor_earns_nothing_it_did_not_compute(sandbox_scorer):
    # `external`, Obj, every descriptor: all allowed here (the allowlist is off). The answer
    # returns 0, which is right for 2 of ADD's 7 assertions; nothing it writes can add to that.
    b = score(sandbox_scorer, FORGE)
    assert b.tests_total == 7 and b.tests_passed <= 2, b
    # written only during calls (after the oracle said it was ready): the same bound
    b = score(sandbox_scorer, FORGE.replace("let () = forge ()\n", ""))
    assert b.tests_passed <= 2, b


def test_the_oracle_never_holds_an_expected_value():
    sol, entries = assemble_solution("let add a b = a + b", ADD.prompt)
    iface = interface_of(ADD.prompt, entries[0])
    u = render_oracle(sol, iface, "Wire_x")
    t = render_trusted(iface, ADD.tests, src.parse_assert_tests(ADD.tests), "Wire_x")
    assert "101" in t and "assert" in t
    assert "101" not in u and "assert" not in u and "15" not in u


def test_an_oracle_that_dies_in_one_call_fails_that_assertion_and_the_rest(sandbox_scorer):
    b = score(sandbox_scorer, "let add a b = if a = 2 then exit 0 else a + b")  # `exit`: allowlist off
    assert (b.tests_passed, b.tests_total) == (4, 7)  # from `add 2 2` on, as in plain OCaml (round 6)


def test_an_answer_whose_top_level_dies_fails_everything_without_restarts(sandbox_scorer):
    b = score(sandbox_scorer, "let () = exit 3\nlet add a b = a + b")
    assert b.tests_passed == 0 and b.compiled and b.elapsed_ms < 2000


# ---------------------------------------------------------------------------------------------
# 2. The tests see only the entry points, at the prompt's types.

def test_redefining_true_and_false_is_a_type_error_not_credit(scorer):
    for code in ["type b = ..\ntype b += true\ntype b += false = true\nlet is_even (n : int) = true",
                 "exception True\nlet is_even n = True"]:
        b = score(scorer, code, IS_EVEN)
        assert b.tests_passed == 0 and b.type_check == 0.0, (code, b)
        assert "entry point" in (b.first_error or ""), b.first_error
    assert score(scorer, "let is_even n = n mod 2 = 0", IS_EVEN).reward == 1.0


def test_an_entry_point_of_the_wrong_type_gets_no_type_check_credit(scorer):
    b = score(scorer, "let add = ()")
    assert b.type_check == 0.0 and b.tests == 0.0 and b.error_kinds == ["entry"]
    # it compiles, but not as asked: not `compiled` (one verdict with the compile part and the
    # feedback), no compile credit either, only the END marker's
    assert not b.compiled and b.compile == 0.0 and b.reward == pytest.approx(0.05)


def test_a_missing_entry_point_is_named(scorer):
    b = score(scorer, "let plus a b = a + b")
    assert "`add`" in b.first_error and b.tests_passed == 0 and b.type_check == 0.0


@pytest.mark.parametrize("code", [
    "let (add : int -> int -> int) = fun a b -> a + b",
    "module M = struct let add a b = a + b end\ninclude M",
    "let pairs = List.map (fun x -> (x, x))\nlet add a b = a + b",  # an unused weak-typed helper
    "let ( + ) a b = a - b\nlet add a b = Stdlib.( + ) a b\nlet ( = ) _ _ = true",  # operators stay the answer's
])
def test_honest_answers_however_they_bind_the_entry_point_score_one(scorer, code):
    b = score(scorer, code)
    assert b.reward == 1.0, (b.first_error, b.test_error if hasattr(b, "test_error") else None)


def test_a_polymorphic_entry_point_sees_tokens_that_compare_like_the_values(scorer):
    assert score(scorer, "let dedup xs = List.sort_uniq compare xs", DEDUP).reward == 1.0
    # a monomorphic answer is not the prompt's polymorphic entry point
    b = score(scorer, "let dedup (xs : int list) = List.sort_uniq compare xs", DEDUP)
    assert b.error_kinds == ["entry"] and b.tests_passed == 0


def test_the_prompts_own_types_and_exceptions_cross_the_wire(scorer):
    mirror = "let rec mirror t = match t with Leaf -> Leaf | Node (l, x, r) -> Node (mirror r, x, mirror l)"
    assert score(scorer, mirror, TREE).reward == 1.0
    head = 'let head xs = match xs with [] -> raise (Empty "empty") | x :: _ -> if x < 0 then invalid_arg "neg" else x'
    assert score(scorer, head, RAISES).reward == 1.0
    assert score(scorer, "exception Empty of string\n" + head, RAISES).reward == 1.0  # restated


def test_unverifiable_interfaces_say_why_and_earn_no_test_credit(scorer):
    p = Problem(id="abstract", prompt="type t\n(** Count. *)\nlet size (x : t) : int =",
                tests="let () = assert (size (Obj.magic 0) = 0)\n;;")
    b = score(scorer, "type t = int\nlet size x = x", p)
    assert b.unverifiable and "type t" in b.unverifiable and b.tests == 0.0
    assert interface_of("let f x : int =", "f").unverifiable  # an untyped parameter


APPLY = Problem(id="apply", prompt="(** Apply f n times. *)\nlet apply_n (f : int -> int) (n : int) (x : int) : int =",
                tests="let () =\n  assert (apply_n (fun x -> x + 1) 300_000 0 = 300_000);\n  assert (apply_n succ 3 1 = 4);\n"
                      "  let k = ref 0 in\n  assert (apply_n (fun x -> incr k; x * 2) 3 1 = 8 && !k = 3)\n;;")


def test_callbacks_run_in_the_oracle_when_the_tests_closure_is_closed_else_cross_back(scorer):
    # 300k calls of a closed lambda (compiled into the oracle from the tests' text); a closure over
    # the tests' own state (`k`) is called back across the wire, and its effects are the tests'.
    b = score(scorer, "let apply_n f n x = let rec go i acc = if i = 0 then acc else go (i - 1) (f acc) in go n x",
              APPLY)
    assert b.reward == 1.0 and b.elapsed_ms < 4000, b


def test_an_oracle_waiting_on_slow_tests_is_not_idle(scorer):
    # the trusted program computes for seconds before its call: the oracle waits, blocked, longer
    # than the idle limit (2 s), and is not stopped for it
    slow = Problem(id="slow", prompt=ADD.prompt,
                   tests="let () =\n  assert (let n = ref 0 in for _ = 1 to 400_000_000 do incr n done; "
                         "add !n 1 = 400_000_001)\n;;")
    b = score(scorer, "let add a b = a + b", slow)
    assert b.tests_passed == 1 and not b.timed_out, b


HOSTILE_WIRE = '''external fd_out : int -> out_channel = "caml_ml_open_descriptor_out"
let reply s = let oc = fd_out (int_of_string Sys.argv.(2)) in output_string oc s; flush oc; exit 0
let add a b =
  if a = 2 then reply "R 99999999999999\\n"            (* a length past the cap *)
  else if a = 10 then reply "R 3\\nabc"                (* too short for an int *)
  else if a = 100 then reply "C 8\\n\\009\\000\\000\\000\\000\\000\\000\\000"  (* a handle that does not exist *)
  else if a = 7 then reply "X 1\\n?"                   (* an exception no test can name *)
  else if a = -1 then reply ("R 16\\n" ^ String.make 16 '\\000')  (* the partial application's handle, then the value 0, right *)
  else a + b
'''


def test_a_hostile_wire_costs_the_answer_its_own_assertions_and_nothing_else(sandbox_scorer):
    # A well-formed reply with the right value is the answer's own computation: `add (-1) 1`
    # passes with it; the oracle then exits, and every assertion after it fails (no restart).
    b = score(sandbox_scorer, HOSTILE_WIRE)
    assert (b.tests_passed, b.tests_total) == (3, 7), b


COUNTER = Problem(
    id="counter",
    prompt=("(** A counter.\n*)\n(* Implement the following interface (counter.mli):\ntype counter\n\n"
            "val make : int -> counter\n\nval bump : counter -> counter\n\nval get : counter -> int\n*)\n"
            "let rec get (x : counter) : int ="),
    tests="let () =\n  assert (get (make 3) = 3);\n  assert (get (bump (bump (make 0))) = 2);\n"
          "  let c = make 10 in\n  assert (get (bump c) = 11 && get c = 10)\n;;")


def test_an_abstract_type_the_interface_lists_crosses_as_a_handle(scorer):
    code = "type counter = int ref\nlet make n = ref n\nlet bump c = ref (!c + 1)\nlet get c = !c"
    assert score(scorer, code, COUNTER).reward == 1.0
    assert score(scorer, "type counter = int\nlet make n = n\nlet bump c = c\nlet get c = c", COUNTER).tests_passed == 1


# The entry-point rules, as a property of the reward over the bundled reference solutions and
# mutations of them: an answer is never paid more for an added error or for padding, and an
# answer without its entry point at the prompt's type earns no type-check or compile credit on
# any path (it used to earn more with an unrelated type error: 0.15 -> 0.175).
PAD = "\nlet _ = ()\nlet _ = ()\nlet _ = ()"
UNRELATED_ERROR = '\nlet _oops (x : int) : int = x + "a"'
# Round 6 (#47): a denied value, a broken module and a broken type, each with a dependent phrase
# whose own error must still count.
DENIED = "\nlet _peek = Obj.repr 1"
BROKEN_MODULE = '\nmodule Oops = struct let x : int = "a" end\nlet _oops2 (y : int) : int = Oops.x + "b"'
BROKEN_TYPE = '\ntype oops = Oops of intt\nlet _oops2 (x : oops) : int = x + 1'


def test_errors_and_padding_never_raise_the_reward_and_the_entry_is_checked_first(scorer):
    from ocaml_grpo.problems import load_problems
    problems = [p for p in load_problems("bundled") if not p.requires][::8]  # 16 of them, every kind
    variants = {}
    for p in problems:
        entry = p.entry_point or src.parse_signature(p.prompt).entry
        renamed = p.solution.replace(f"let rec {entry} ", f"let rec {entry}_x ").replace(f"let {entry} ", f"let {entry}_x ")
        assert renamed != p.solution, p.id
        variants[p.id] = {"right": p.solution, "right+pad": p.solution + PAD,
                          "right+error": p.solution + UNRELATED_ERROR,
                          "right+pad+error": p.solution + PAD + UNRELATED_ERROR,
                          "no_entry": renamed, "no_entry+error": renamed + UNRELATED_ERROR,
                          "no_entry+pad+error": renamed + PAD + UNRELATED_ERROR,
                          "right+denied": p.solution + DENIED, "no_entry+denied": renamed + DENIED,
                          "right+broken_module": p.solution + BROKEN_MODULE,
                          "right+broken_type": p.solution + BROKEN_TYPE,
                          "no_entry+broken_module": renamed + BROKEN_MODULE,
                          "no_entry+broken_type": renamed + BROKEN_TYPE}
    names = list(next(iter(variants.values())))
    scored = scorer.score_batch([p for p in problems for _ in names],
                                [fenced(variants[p.id][n]) for p in problems for n in names])
    for k, p in enumerate(problems):
        r = {n: b for n, b in zip(names, scored[k * len(names):(k + 1) * len(names)])}
        assert r["right"].reward == r["right+pad"].reward == 1.0, p.id  # padding earns nothing
        assert r["right+error"].reward < 1.0 and r["right+pad+error"].reward == r["right+error"].reward, p.id
        for n in ("no_entry", "no_entry+error", "no_entry+pad+error", "no_entry+denied", "no_entry+broken_module",
                  "no_entry+broken_type"):
            assert r[n].type_check == r[n].compile == r[n].tests == 0.0, (p.id, n, r[n].error_kinds)
            assert "entry" in r[n].error_kinds, (p.id, n)
        for n in ("no_entry+error", "no_entry+denied", "no_entry+broken_module", "no_entry+broken_type"):
            assert r[n].reward <= r["no_entry"].reward, (p.id, n)  # an added error never pays
        assert r["right+denied"].tests == 0.0 and r["right+denied"].reward < 1.0, p.id
        for n in ("right+broken_module", "right+broken_type"):  # two errors each: below one error
            assert r[n].type_errors == 2 and r[n].reward < r["right+error"].reward, (p.id, n, r[n].error_kinds)


@pytest.mark.parametrize("code", [
    "let add ~a ~b = a + b",  # labels the prompt's type does not have: the tests' total calls omit them
    "let add ?(scale = 1) a b = scale * (a + b)",  # an optional parameter the tests never pass
    "module Impl = struct let add a b = a + b end\nopen Impl",  # in scope at the end of the answer
    "module Impl = struct let add a b = a + b end\ninclude Impl",
    "let add a b =\n  let r = ref (a + b) in\n  r := !r;\n  !r;",  # a trailing `;`
])
def test_honest_idioms_that_plain_ocaml_accepts_score_one(scorer, tmp_path, code):
    """The tests appended to the answer pass in plain `ocaml`: the grader gives full credit too."""
    (tmp_path / "plain.ml").write_text(code + "\n;;\n" + ADD.tests + "\n")
    assert subprocess.run(["ocaml", str(tmp_path / "plain.ml")], capture_output=True).returncode == 0
    b = score(scorer, code)
    assert b.reward == 1.0, (b.error_kinds, b.first_error)


def test_what_the_scope_does_not_hold_at_the_end_is_not_an_entry(scorer):
    for code in ["module Impl = struct let add a b = a + b end",  # never brought into scope
                 "let add a b = a + b\nlet add = ()"]:  # shadowed by a value of another type
        b = score(scorer, code)
        assert b.tests == b.type_check == b.compile == 0.0 and "entry" in b.error_kinds, code


APPLY_PROMPT = "(** Apply f to x, n times. *)\nlet apply_n (f : int -> int) (n : int) (x : int) : int ="
APPLY_ANSWER = "let rec apply_n f n x = if n <= 0 then x else apply_n f (n - 1) (f x)"


@pytest.mark.parametrize("tests", [
    # the tests' own `max_int` (and operator): a closure compiled apart from them would use Stdlib's
    "let max_int = 10\nlet ( +! ) a b = a * b\nlet () =\n  assert (apply_n (fun x -> x + max_int) 2 0 = 20);\n"
    "  assert (apply_n (fun x -> x +! 2) 3 1 = 8)\n;;",
    # a module the tests open: every name may mean something else there
    "open struct let succ x = x + 2 end\nlet () =\n  assert (apply_n succ 3 0 = 6)\n;;",
])
def test_a_test_closure_means_what_the_tests_scope_says(scorer, tmp_path, tests):
    problem = Problem(id="apply", prompt=APPLY_PROMPT, tests=tests)
    (tmp_path / "plain.ml").write_text(APPLY_ANSWER + "\n;;\n" + tests + "\n")
    assert subprocess.run(["ocaml", str(tmp_path / "plain.ml")], capture_output=True).returncode == 0
    b = score(scorer, APPLY_ANSWER, problem)
    assert b.reward == 1.0 and b.tests_passed == b.tests_total, (b.tests_passed, b.tests_total, b.first_error)
