"""Grader round 6 (#47): a value of a type variable behaves like itself, no credit path around the
allowlist, no restart that gives the answer a fresh start, and the grader's own work stays linear.
Real compiler, real sandbox; each expectation is what plain OCaml gives with the tests appended."""
import subprocess
import time

import pytest

from conftest import ADD, fenced
from ocaml_grpo.problems import Problem
from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.grader import MAX_SOLUTION_CHARS, OcamlGrader, _char_offsets
from ocaml_grpo.grading.sandbox import Sandbox
from rewards import RewardConfig, RewardScorer


@pytest.fixture(scope="module")
def ocamlc_scorer():
    """The grader with OCAML_COMPILER=ocamlc: one sandboxed ocamlc per step."""
    s = RewardScorer(RewardConfig(min_lines=0, workers=2), grader=OcamlGrader(Sandbox(), cores=2, compiler="ocamlc"))
    yield s
    s.close()


def score(scorer, code, problem=ADD):
    return scorer.score_one(problem, fenced(code))


# ---------------------------------------------------------------------------------------------
# Liveness: the grader's own work on an answer is linear in its size, and bounded.

def test_phrases_and_offsets_of_a_large_answer_take_linear_work():
    """20k phrases in 3 MB: line numbers were counted from the start for every phrase, and each
    compiler offset decoded the text up to it (45-62 s of Python, quadratic); linear, it is ~1 s."""
    n = 20_000
    lines = [f"let f{i} (x : int) : int = x + {i} (* é{'-' * 120} *)\n" for i in range(n)]
    text = "".join(lines)
    starts, byte_starts, at, byte_at = [], [], 0, 0
    for ln in lines:
        starts.append(at)
        byte_starts.append(byte_at)
        at, byte_at = at + len(ln), byte_at + len(ln.encode())
    t0 = time.process_time()
    phrases = src.phrases_from_starts(text, starts)
    offsets = _char_offsets(text, byte_starts[::-1])[::-1]  # in any order
    elapsed = time.process_time() - t0
    assert len(phrases) == n and phrases[-1].line == n and phrases[1234].line == 1235
    assert offsets == starts
    # an offset inside a character counts the characters before it, as decoding the prefix does
    data = text.encode()
    inside = [b + k for b in byte_starts[:50] for k in range(40) if data[b + k] & 0xC0 == 0x80] + [0, len(data)]
    assert _char_offsets(text, inside) == [len(data[:b].decode("utf-8", "ignore")) for b in inside]
    assert elapsed < 10, f"{elapsed:.1f} s of CPU for 3 MB: not linear"


def test_an_answer_over_the_size_limit_is_not_compiled_and_earns_nothing(scorer):
    big = "let add a b = a + b\n" + "".join(f"let pad{i} = {i}\n" for i in range(MAX_SOLUTION_CHARS // 12))
    t0 = time.monotonic()
    b = score(scorer, big)
    assert time.monotonic() - t0 < 30
    assert b.compile_timed_out and b.type_check == b.compile == b.tests == 0.0 and not b.compiled
    assert b.tests_total == 7
    # under the limit, a large answer with one type error is counted as one error
    under = "let add a b = a + b\nlet bad : int = \"x\"\n" + "".join(f"let pad{i} = {i}\n" for i in range(20_000))
    b = score(scorer, under)
    assert b.error_kinds == ["type"] and b.type_check == pytest.approx(0.10), b.first_error


def plain_ocaml_passes(tmp_path, code: str, tests: str) -> int:
    """The truth for partial credit: how many assertions pass with the tests appended to the
    answer in plain `ocaml` (each assertion on its own, an exception failing only it; the
    process dying ends the count)."""
    plan = src.parse_assert_tests(tests)
    body = []
    for item in plan.items:
        if isinstance(item, str):
            body.append(item)
            continue
        lines = ["let () ="] + [f"  {b}" for b in item.bindings]
        lines += [f"  grader_check (fun () -> {stmt});" if is_assert else f"  {stmt};" for is_assert, stmt in item.statements]
        body.append("\n".join(lines + ["  ()", ";;"]))
    harness = ("let grader_check f = match f () with () -> print_string \"P\\n\"; flush stdout | exception _ -> ()\n;;\n")
    (tmp_path / "plain.ml").write_text(code + "\n;;\n" + harness + "\n".join(body) + "\n")
    out = subprocess.run(["ocaml", str(tmp_path / "plain.ml")], capture_output=True, text=True, timeout=120).stdout
    return out.count("P\n")


def plain_ocaml_accepts(tmp_path, code: str, tests: str) -> bool:
    """The truth: the tests appended to the answer, in plain `ocaml`."""
    (tmp_path / "plain.ml").write_text(code + "\n;;\n" + tests + "\n")
    return subprocess.run(["ocaml", str(tmp_path / "plain.ml")], capture_output=True).returncode == 0


# ---------------------------------------------------------------------------------------------
# The entry binding compiles exactly when the appended tests would.

SAME_PROMPT = "(** The list, unchanged. *)\nlet same (l : 'a list) : 'a list ="
TWO_TYPES = Problem(id="same2", prompt=SAME_PROMPT,
                    tests='let () =\n  assert (same [1; 2] = [1; 2]);\n  assert (same ["a"] = ["a"])\n;;')
ONE_TYPE = Problem(id="same1", prompt=SAME_PROMPT,
                   tests="let () =\n  assert (same [1; 2] = [1; 2]);\n  assert (same [3] = [3])\n;;")
FIRST_CLASS = Problem(id="add_fold", prompt=ADD.prompt,
                      tests="let () =\n  assert (add 1 2 = 3);\n  assert (List.fold_left add 0 [1; 2; 3] = 6)\n;;")


@pytest.mark.parametrize("code,problem", [
    ("let same = List.map (fun x -> x)", TWO_TYPES),  # weak: one instantiation only
    ("let same = List.map (fun x -> x)", ONE_TYPE),
    ("let same l = List.map (fun x -> x) l", TWO_TYPES),
    ("let add ~a ~b = a + b", FIRST_CLASS),  # labels: `List.fold_left add` does not type
    ("let add ~a ~b = a + b", ADD),  # total applications omit them
    ("let add ?(scale = 1) a b = scale * (a + b)", FIRST_CLASS),
    ("let add a b = a + b", FIRST_CLASS),
])
def test_an_entry_point_binds_exactly_when_the_appended_tests_compile(scorer, tmp_path, code, problem):
    truth = plain_ocaml_accepts(tmp_path, code, problem.tests)
    b = score(scorer, code, problem)
    if truth:
        assert b.reward == 1.0, (b.error_kinds, b.first_error)
    else:
        assert b.error_kinds == ["entry"] and b.type_check == b.compile == b.tests == 0.0, b
        assert not any(name in b.first_error for name in ("grader_entry", "_entry_", "Solution", "Tok"))


# ---------------------------------------------------------------------------------------------
# No partial credit around the allowlist: the entry points are checked on the denied path too,
# and every phrase's own errors count, whatever it depends on.

@pytest.mark.parametrize("code", [
    "let addx a b = a + b\nlet _ = Obj.repr 1",  # no entry point, a denied value
    "let add a b = float_of_int (a + b)\nlet _ = Obj.repr 1",  # the wrong type, a denied value
    "type t = A [@@deriving show]\nlet addx a b = a + b",  # no entry point, a denied attribute
])
def test_a_denied_value_does_not_skip_the_entry_check(scorer, ocamlc_scorer, code):
    for which in (scorer, ocamlc_scorer):  # both compilers
        b = score(which, code)
        assert b.forbidden and b.error_kinds == ["entry"], b
        assert b.type_check == b.compile == b.tests == 0.0 and b.reward == pytest.approx(0.05)


def test_a_denied_value_beside_a_right_entry_keeps_its_compile_credit_only(scorer):
    b = score(scorer, "let add a b = a + b\nlet _ = Obj.repr 1")
    assert b.forbidden == "Stdlib.Obj.repr" and b.compiled and b.tests == 0.0 and b.reward == pytest.approx(0.35)


OWN_ERROR = '\nlet _oops2 (x : int) : int = x + "a"'


@pytest.mark.parametrize("broken,dependent", [
    ('module Oops = struct let x : int = "a" end', 'let _oops2 (y : int) : int = Oops.x + "b"'),
    ('type oops = Oops of intt', 'let _oops2 (x : oops) : int = x + 1'),
    ('type oops = { v : intt }', 'let _oops2 (x : oops) : string = if x = x then 1 else 2'),
    ('let helper (x : int) : int = x + "a"', 'let _oops2 y = helper y + "b"'),
])
def test_a_phrase_that_depends_on_a_broken_one_has_its_own_error_counted(scorer, broken, dependent):
    """A phrase left out for a name a broken phrase declared (a value, a module, a type, a
    constructor or a label) is checked again with that phrase's stand-in: its own error counts, so
    adding a broken dependency never lowers the count (it used to raise the reward 0.10 -> 0.15)."""
    both = score(scorer, f"{broken}\n{dependent}\nlet add a b = a + b")
    assert both.type_errors == 2, (both.error_kinds, both.first_error)
    alone = score(scorer, f"let add a b = a + b{OWN_ERROR}")
    assert both.reward < alone.reward


@pytest.mark.parametrize("broken,dependent", [
    ('module Oops = struct let x : int = "a" type t = C end', "let _ok y = Oops.x + y\nlet _c = Oops.C"),
    ('type oops = Oops of intt', "let _ok (x : oops) : int = match x with Oops n -> n"),
    ('type oops = { v : intt }', "let _ok (x : oops) = x.v"),
])
def test_an_honest_phrase_that_depends_on_a_broken_one_is_not_charged(scorer, broken, dependent):
    """Its count is the broken phrase's error alone. Each of these uses a constructor or label of
    the broken phrase, which no stand-in declares at every type: its own errors cannot be checked,
    so the answer earns no type-check credit (round 7: `unchecked`), as a syntax error would."""
    b = score(scorer, f"{broken}\n{dependent}\nlet add a b = a + b")
    assert b.type_errors == 1, (b.error_kinds, b.first_error)
    assert b.unchecked and b.type_check == 0.0 and b.compile == 0.0


# ---------------------------------------------------------------------------------------------
# An honest helper is not a wrong entry point; feedback names only what the answer or prompt wrote.

AREA = Problem(id="area", prompt="type shape = Circle of float | Rect of float * float\n\n(** Area. *)\n"
                                 "let area (s : shape) : float =",
               tests="let () =\n  assert (area (Circle 1.) = 1.);\n  assert (area (Rect (2., 3.)) = 6.)\n;;")
AREA_WEAK = ("type shape = Circle of float | Rect of (float * float)\nlet cache = ref []\n"
             "let area s = match s with Circle r -> r | Rect (w, h) -> w *. h")


def test_an_unused_weak_helper_beside_a_type_error_is_not_a_wrong_entry_point(scorer):
    b = score(scorer, AREA_WEAK + '\nlet bad : int = "x"', AREA)
    assert b.error_kinds == ["type"] and b.type_check == pytest.approx(0.10), b.first_error
    assert score(scorer, AREA_WEAK, AREA).reward == 1.0


def test_feedback_never_names_what_the_grader_appended(scorer):
    from ocaml_grpo.grading.completions import assemble_solution
    for code in [AREA_WEAK + '\nlet bad : int = "x"', AREA_WEAK.replace("let area s", "let area (s : int)"),
                 AREA_WEAK.replace("let area s", "let area_x s") + '\nlet bad : int = "x"']:
        solution, entries = assemble_solution(code, AREA.prompt)
        grade = scorer.grader.grade(solution, AREA.tests, [], entries, AREA.prompt)
        for e in grade.compile_errors:
            assert not any(n in e.message for n in ("grader_entry", "entry_0", "Solution", "Wire_", "Tok")), e.message


# ---------------------------------------------------------------------------------------------
# No restart gives the answer a fresh start.

REPEAT = Problem(id="repeat", prompt="(** s, n times. *)\nlet repeat (s : string) (n : int) : string =",
                 tests="let () =\n" + ";\n".join(f'  assert (repeat "ab" {n} = "{"ab" * n}")' for n in range(1, 7)) + "\n;;")
# Right only on its second call; its first reply is over the wire's 32 MB.
STATEFUL_HUGE = ("let calls = ref 0\nlet repeat s n =\n  incr calls;\n"
                 "  if !calls = 1 then String.make (40 lsl 20) 'x'\n"
                 "  else if !calls = 2 then String.concat \"\" (List.init n (fun _ -> s))\n  else s")


def test_a_reply_over_the_wire_limit_fails_its_assertion_and_keeps_the_answers_state(scorer, tmp_path):
    truth = plain_ocaml_passes(tmp_path, STATEFUL_HUGE, REPEAT.tests)
    assert truth == 1  # the second assertion only
    b = score(scorer, STATEFUL_HUGE, REPEAT)
    assert (b.tests_passed, b.tests_total) == (truth, 6), b.first_error


def test_an_oracle_that_dies_fails_the_rest_without_a_fresh_answer(sandbox_scorer, tmp_path):
    """`exit` (the allowlist is off here, as a type-checker bug would allow): plain OCaml stops
    there, and so does the grading; a fresh oracle would have started the counter again."""
    code = "let calls = ref 0\nlet add a b = incr calls; if !calls = 3 then exit 0 else if !calls <= 2 then a + b else 0"
    truth = plain_ocaml_passes(tmp_path, code, ADD.tests)
    b = score(sandbox_scorer, code)
    assert b.tests_passed == truth == 2  # restarted after each exit, it passed 5


# ---------------------------------------------------------------------------------------------
# A value of a type variable behaves like itself: the grader and plain OCaml agree, for honest
# and dishonest answers alike, over immediates, boxed values, floats (nan, -0., flat float
# arrays), refs, closures and long runs of calls.

KINDS = {  # a list of values of one type, as the tests write it
    "ints": "[3; 1; 3; 2]",
    "strings": '["b"; "a"; "b"; String.make 1 \'a\']',
    "tuples": '[(2, "x"); (1, "y"); (2, "x")]',
    "options": "[Some 1; None; Some 1; None]",
    "floats": "[1.5; nan; -0.; 0.; nan; 1.5]",
    "refs": "(let r = ref 1 in [r; ref 1; r; ref 2])",
    "nested": "(let s = [1] in [(s, 1.); (s, 1.); ([1], 1.)])",
}
DEDUP_PROMPT = "(** The distinct elements, first occurrences kept. *)\nlet dedup (l : 'a list) : 'a list ="


def dedup_tests(kinds: list[str]) -> str:
    return "let () =\n" + ";\n".join(
        [f"  assert (List.length (dedup {v}) = {k})" for v in kinds for k in (2, 3)]
        + [f"  assert (let l = {v} in List.for_all (fun x -> List.memq x l) (dedup l))" for v in kinds]) + "\n;;"


DEDUP = Problem(id="dedup6", prompt=DEDUP_PROMPT, tests=dedup_tests(list(KINDS.values())))
# Closures: `compare` raises on them and `==` tells them apart, as in OCaml. Their hash is a code
# address (in plain `ocaml` it changes from run to run), so no hashing answer is compared on them.
CLOSURES = Problem(id="dedup6_fn", prompt=DEDUP_PROMPT,
                   tests=dedup_tests(["[succ; pred; succ]", "(let f x = x + 1 in [f; f; (fun x -> x)])"]))
DEDUPS = {
    "structural": "let dedup l = List.rev (List.fold_left (fun acc x -> if List.mem x acc then acc else x :: acc) [] l)",
    "physical": "let dedup l = List.rev (List.fold_left (fun acc x -> if List.memq x acc then acc else x :: acc) [] l)",
    "compare": "let dedup l = List.sort_uniq compare l",
    "hashed": ("let dedup l = let h = Hashtbl.create 8 in\n"
               "  List.filter (fun x -> if Hashtbl.mem h x then false else (Hashtbl.replace h x (); true)) l"),
    # behaves differently when the elements' hash gives the grader away
    "detector": ("let dedup l = match l with x :: _ when Hashtbl.hash x = Hashtbl.hash 0 || Hashtbl.hash x < 0 -> l\n"
                 "  | _ -> List.rev (List.fold_left (fun acc x -> if List.memq x acc then acc else x :: acc) [] l)"),
    "via_array": "let dedup l = let a = Array.of_list l in Array.to_list (Array.sub a 0 (min 2 (Array.length a)))",
}
SAME = Problem(id="same6", prompt="(** Whether x and y are the same. *)\nlet same (x : 'a) (y : 'a) : bool =",
               tests="let () =\n" + ";\n".join([
                   "  assert (let r = ref 1 in same r r)", "  assert (same (ref 1) (ref 1))",
                   '  assert (let s = "ab" in same s s)', '  assert (same "ab" (String.make 2 \'a\'))',
                   "  assert (same nan nan)", "  assert (same 0. (-0.))", "  assert (same 1 1)",
                   "  assert (same succ succ)", "  assert (let x = Some 2 in same x x)",
                   '  assert (let n = int_of_string "2" in same (Some n) (Some n))',
                   "  assert (let f x = x + 1 in same f f)", "  assert (same (fun x -> x) (fun x -> x))"]) + "\n;;")
# literal constants: ocamlopt shares equal structured constants, bytecode does not; the tests
# here never rely on it
SAMES = {"physical": "let same x y = x == y", "structural": "let same x y = x = y",
         "compare": "let same x y = compare x y = 0", "hash": "let same x y = Hashtbl.hash x = Hashtbl.hash y"}
PICK = Problem(id="pick6", prompt="(** The i-th element. *)\nlet pick (a : 'a array) (i : int) : 'a =",
               tests="let () =\n" + ";\n".join(
                   ["  assert (let r = ref 0 in (pick [| ref 5; r |] 1) := 3; !r = 3)",
                    "  assert (pick [| 1.5; 2.5 |] 1 = 2.5)", "  assert (1. /. pick [| -0.; 0. |] 0 = neg_infinity)",
                    "  assert (let s = \"x\" in pick [| s; String.make 1 'x' |] 0 == s)", "  assert (pick [| nan |] 0 <> nan)"]
                   + [f"  assert (pick [| {i}.5; {i + 1}.5 |] 1 = {i + 1}.5)" for i in range(0, 200, 2)]
                   + [f'  assert (pick [| "{"z" * (i // 10)}{i}" |] 0 = "{"z" * (i // 10)}{i}")' for i in range(100)]) + "\n;;")
PICKS = {"right": "let pick a i = a.(i)", "copy": "let pick a i = (Array.copy a).(i)",
         "last": "let pick a i = a.(Array.length a - 1)", "max": "let pick a _ = Array.fold_left max a.(0) a"}


@pytest.mark.parametrize("problem,answers", [
    (DEDUP, DEDUPS), (CLOSURES, {k: DEDUPS[k] for k in ("structural", "physical", "compare", "via_array")}),
    (SAME, {k: v for k, v in SAMES.items() if k != "hash"}), (PICK, PICKS)], ids=["dedup", "closures", "same", "pick"])
def test_values_of_a_type_variable_behave_as_in_plain_ocaml(scorer, tmp_path, problem, answers):
    graded = scorer.score_batch([problem] * len(answers), [fenced(code) for code in answers.values()])
    for (name, code), b in zip(answers.items(), graded):
        truth = plain_ocaml_passes(tmp_path, code, problem.tests)
        assert b.compiled and b.tests_passed == truth, (name, b.tests_passed, truth, b.first_error)


# ---------------------------------------------------------------------------------------------
# Values that come back in later calls go back only where the tests' own types put them.

CELL_PROMPT = """(** A mutable cell.
*)
(* Implement the following interface (cell.mli):
type 'a cell

val make : 'a -> 'a cell

val set : 'a cell -> 'a -> unit

val get : 'a cell -> 'a
*)
let get (c : 'a cell) : 'a ="""
CELL = Problem(id="cell", prompt=CELL_PROMPT, tests="""let () =
  let c = make "x" in
  let d = make 1 in
  let e = make [1; 2; 3] in
  let f = make ["p"; "q"; "r"] in
  set c "y";
  set d 2;
  assert (get c = "y");
  assert (get d = 2);
  assert (get c = "y");
  assert (List.length (get f) = 3);
  assert (List.length (get e) = 3)
;;""")
# Returns `e`'s int list for `f` (Obj.magic: the allowlist is off, as a type-checker bug would
# allow): read as `f`'s string list, it would pass.
CELL_CONFUSED = ("type 'a cell = 'a ref\nlet made = ref []\nlet gets = ref 0\n"
                 "let make x = made := Obj.repr x :: !made; ref x\nlet set c x = c := x\n"
                 "let get c = incr gets; if !gets = 4 then Obj.obj (List.nth (List.rev !made) 2) else !c")


def test_a_value_that_comes_back_later_goes_back_only_where_the_tests_types_put_it(scorer, sandbox_scorer):
    """Handles carry the classes of their parameters: `get c` may return what `make` or `set`
    were given for the same cell (and the cells its type ties to it), never another call's value
    of another type (a key from anywhere in the run's table used to be accepted)."""
    assert score(scorer, "type 'a cell = 'a ref\nlet make x = ref x\nlet set c x = c := x\nlet get c = !c",
                 CELL).reward == 1.0
    b = score(sandbox_scorer, CELL_CONFUSED, CELL)
    assert (b.tests_passed, b.tests_total) == (4, 5), b.first_error


def test_a_float_the_oracle_boxed_itself_is_accepted_only_if_it_was_sent(sandbox_scorer):
    """Polymorphic code reads a flat float array's elements as fresh boxes, which the oracle gives
    back by their bits: accepted only for a float the trusted program sent, bit for bit, for that
    variable (a float made up with Obj.magic, the allowlist off, is refused)."""
    tests = "let () =\n  assert (pick [| 1.5; 3.5 |] 1 = 3.5);\n  assert (pick [| 1.5; 3.5 |] 0 = 2.5)\n;;"
    p = Problem(id="pick_fresh", prompt=PICK.prompt, tests=tests)
    assert score(sandbox_scorer, "let pick a i = a.(i)", p).tests_passed == 1
    made_up = "let pick a i = if i = 0 then Obj.magic (Obj.repr 2.5) else a.(i)"
    assert score(sandbox_scorer, made_up, p).tests_passed == 1


# Round 7: nine errors behind a failed type's constructors were counted as one (0.15 against at most 0.061).
FAILED_TYPE = "type tree = Leaf | Node of tree * int * tre\n"
USES_IT = ['let rec insert t x = match t with Leaf -> Node (Leaf, x, Leaf) | Node (l, v, r) -> Node (l, v + "a", r)',
           'let size t = match t with Leaf -> "0" + 1 | Node _ -> 1',
           'let root t = match t with Leaf -> None | Node (_, v, _) -> Some (v ^ 1)']


def test_errors_behind_a_failed_types_constructor_earn_no_type_check_credit(scorer):
    """A phrase that uses a constructor of a type that failed to define cannot be checked for its
    own errors (no stand-in declares the constructor at every type): the answer is held to the
    type's error and earns no more type-check credit than a syntax error (docs/grader.md)."""
    b = score(scorer, FAILED_TYPE + "\n".join(USES_IT) + "\nlet add a b = a + b")
    assert b.unchecked and b.type_check == 0.0 and b.reward == pytest.approx(0.05), (b.error_kinds, b.first_error)
    # the same errors without the failed type are counted one by one: graduated, as ever
    plain = score(scorer, "type tree = Leaf | Node of tree * int * tree\n" + "\n".join(USES_IT) + "\nlet add a b = a + b")
    assert not plain.unchecked and plain.type_errors == 3 and plain.type_check == pytest.approx(0.2 * 0.5 / 3)
    # a broken value is stood in for at every type: what depends on it is still checked and graduated
    helper = score(scorer, 'let helper (x : int) : int = x + "a"\nlet twice y = helper (helper y)\nlet add a b = a + b')
    assert not helper.unchecked and helper.type_errors == 1 and helper.type_check == pytest.approx(0.1)
