"""Round 7's shapes: a value that crosses between the answer's process and the tests' keeps its
identity, its aliases and its mutations, and a partial application the tests make once happens
once. The truth for each is plain `ocaml` with the tests appended, each assertion on its own
(test_round6.plain_ocaml_passes). What the wire does not keep yet is listed in docs/grader.md,
"Not covered yet".
"""
import re

import pytest

from conftest import fenced
from ocaml_grpo.grading.interface import interface_of
from ocaml_grpo.grading.oracle import trusted_stubs
from ocaml_grpo.problems import Problem
from test_round6 import plain_ocaml_passes


SCALE = Problem(id="scale7", prompt="(** k times x. *)\nlet scale (k : int) (x : int) : int =", tests="""let () =
  let triple = scale 3 in
  assert (triple 1 = 3);
  assert (triple 2 = 6);
  assert (List.map (scale 2) [1; 2; 3] = [2; 4; 6])
;;""")
SCALE_MANY = Problem(id="scale7c", prompt=SCALE.prompt, tests="""let () =
  let double = scale 2 in
  assert (List.init 3000 double = List.init 3000 (fun i -> 2 * i))
;;""")
CLAMP = Problem(id="clamp7", prompt="(** x clamped to [lo, hi]. *)\nlet clamp (lo : int) (hi : int) (x : int) : int =",
                tests="""let () =
  let from0 = clamp 0 in
  let to9 = from0 9 in
  assert (to9 5 = 5);
  assert (to9 12 = 9);
  assert (from0 3 7 = 3);
  assert (clamp 1 2 0 = 1)
;;""")
SCALE_CHECKED = Problem(id="scale7b", prompt=SCALE.prompt, tests="""let () =
  assert (try ignore (scale 0); false with Invalid_argument _ -> true);
  assert (scale 2 3 = 6)
;;""")
CLAMP_CHECKED = Problem(id="clamp7b", prompt=CLAMP.prompt, tests="""let () =
  let from5 = clamp 5 in
  assert (try ignore (clamp 5 1); false with Invalid_argument _ -> true);
  assert (from5 9 7 = 7);
  assert (try ignore (from5 1 7); false with Invalid_argument _ -> true)
;;""")
SCALE_ONCE = Problem(id="scale7d", prompt=SCALE.prompt, tests="""let () =
  let triple = scale 3 in
  assert (try ignore (triple (-1)); false with Invalid_argument _ -> true);
  assert (triple 2 = 6);
  assert (triple 5 = 15)
;;""")
REVERSE_INTO = Problem(id="reverse_into7", prompt=(
    "(** Write src reversed into dst (same length). *)\nlet reverse_into (src : int array) (dst : int array) : unit ="),
    tests="""let () =
  let a = [| 1; 2; 3 |] and b = Array.make 3 0 in
  reverse_into a b;
  assert (b = [| 3; 2; 1 |]);
  let c = [| 1; 2; 3 |] in
  reverse_into c c;
  assert (c = [| 3; 2; 1 |])
;;""")
SAME_LIST = Problem(id="same_list7", prompt="(** Whether a and b are one list. *)\nlet same (a : int list) (b : int list) : bool =",
                    tests="""let () =
  let l = List.init 3 (fun i -> i) in
  assert (same l l);
  assert (not (same l (List.init 3 (fun i -> i))))
;;""")
SORT_ROWS = Problem(id="sort_rows7", prompt="(** Sort each row in place. *)\nlet sort_rows (m : int array array) : unit =",
                    tests="""let () =
  let m = [| [| 3; 1 |]; [| 2; 0 |] |] in
  let r0 = m.(0) in
  sort_rows m;
  assert (m.(0) = [| 1; 3 |]);
  assert (r0 = [| 1; 3 |]);
  assert (r0 == m.(0))
;;""")
SORT_EACH = Problem(id="sort_each7", prompt="(** Sort each array in place. *)\nlet sort_each (l : int array list) : unit =",
                    tests="""let () =
  let a = [| 2; 1 |] and b = [| 9; 8; 7 |] in
  sort_each [a; b];
  assert (a = [| 1; 2 |]);
  assert (b = [| 7; 8; 9 |])
;;""")
SWAP_FIRST = Problem(id="swap_first7", prompt="(** Swap the first elements of a and b in place. *)\n"
                     "let swap_first (p : int array * int array) : unit =", tests="""let () =
  let a = [| 1; 2 |] and b = [| 9 |] in
  swap_first (a, b);
  assert (a = [| 9; 2 |]);
  assert (b = [| 1 |])
;;""")
FILL_SOME = Problem(id="fill_some7", prompt="(** Fill the array, if any, with 7. *)\nlet fill_some (o : int array option) : unit =",
                    tests="""let () =
  let a = [| 1; 2 |] in
  fill_some (Some a);
  assert (a = [| 7; 7 |]);
  fill_some None;
  assert (a = [| 7; 7 |])
;;""")
APPLY_ALL = Problem(id="apply_all7", prompt="(** f on each element. *)\nlet apply_all (f : int -> int) (xs : int list) : int list =",
                    tests="""let () =
  assert (apply_all succ [1; 2] = [2; 3]);
  assert (try ignore (apply_all (fun x -> assert (x > 0); x) [1; -1]); false with Assert_failure _ -> true);
  assert (try ignore (apply_all (fun x -> match x with 1 -> 1) [1; 2]); false with Match_failure _ -> true)
;;""")
SORT_WITH = Problem(id="sort_with7", prompt=(
    "(** xs sorted by cmp. *)\nlet sort_with (cmp : int -> int -> int) (xs : int list) : int list ="), tests="""let by compare xs = sort_with compare xs
let () =
  assert (by (fun a b -> compare b a) [1; 3; 2] = [3; 2; 1]);
  assert (by (fun a b -> compare (a mod 3) (b mod 3)) [5; 3; 4] = [3; 4; 5]);
  assert (by compare [2; 1] = [1; 2])
;;""")

# the parameter used inside a closure the tests write: the closure means the tests' `compare`
SORT_WITH_LAMBDA = Problem(id="sort_with7b", prompt=SORT_WITH.prompt, tests="""let by compare xs = sort_with (fun a b -> compare a b) xs
let () =
  assert (by (fun a b -> compare b a) [1; 3; 2] = [3; 2; 1]);
  assert (by compare [2; 1] = [1; 2])
;;""")

REV_LAZY = Problem(id="rev_lazy7", prompt="(** l reversed. *)\nlet rev_all (l : 'a list) : 'a list =", tests="""let () =
  let hits = ref 0 in
  let l = [lazy (incr hits; 1); lazy (incr hits; 2)] in
  let r = rev_all l in
  assert (!hits = 0);
  assert (Lazy.force (List.hd r) = 2);
  assert (!hits = 1);
  assert (List.hd r == List.nth l 1);
  let f = lazy (fun x -> x + 1) in
  ignore (Lazy.force f);
  assert (Lazy.force (List.hd (rev_all [f])) 1 = 2)
;;""")

INCR_ALL = Problem(id="incr_all7", prompt="(** Add one to every ref. *)\nlet incr_all (l : int ref list) : unit =",
                   tests="""let () =
  let a = ref 1 and b = ref 5 in
  incr_all [a; b];
  assert (!a = 2 && !b = 6)
;;""")
INCR_TWICE = Problem(id="incr_twice7", prompt=INCR_ALL.prompt, tests="""let () =
  let a = ref 1 in
  incr_all [a; a];
  assert (!a = 3)
;;""")
SWAP_REFS = Problem(id="swap_refs7", prompt="(** Swap the contents of a and b. *)\nlet swap_refs (a : 'a ref) (b : 'a ref) : unit =",
                    tests="""let () =
  let a = ref "x" and b = ref "y" in
  swap_refs a b;
  assert (!a = "y" && !b = "x");
  let c = ref [| 1 |] and d = ref [| 2 |] in
  let c0 = !c in
  swap_refs c d;
  assert (!d == c0)
;;""")
PUSH = Problem(id="push7", prompt="(** Put x in front of the stack. *)\nlet push (s : int list ref) (x : int) : unit =",
               tests="""let () =
  let s = ref [] in
  push s 1;
  push s 2;
  assert (!s = [2; 1])
;;""")

ACCOUNT = "type account = { owner : string; mutable balance : int }\n"
DEPOSIT = Problem(id="deposit7", prompt=ACCOUNT + "\n(** Add x to the balance. *)\nlet deposit (a : account) (x : int) : unit =",
                  tests="""let () =
  let a = { owner = "x"; balance = 100 } in
  deposit a 50;
  assert (a.balance = 150);
  deposit a 1;
  assert (a.balance = 151 && a.owner = "x")
;;""")
RESET_ALL = Problem(id="reset_all7", prompt=ACCOUNT + "\n(** Set every balance to 0. *)\nlet reset_all (l : account list) : unit =",
                    tests="""let () =
  let a = { owner = "a"; balance = 5 } and b = { owner = "b"; balance = 7 } in
  reset_all [a; b];
  assert (a.balance = 0);
  assert (b.balance = 0)
;;""")
BUF = "type buf = { mutable data : int array; mutable len : int }\n"
PUSH_BUF = Problem(id="push_buf7", prompt=BUF + "\n(** Append x, growing data when full. *)\nlet push_buf (b : buf) (x : int) : unit =",
                   tests="""let () =
  let b = { data = [| 0 |]; len = 0 } in
  let first = b.data in
  push_buf b 1;
  assert (b.data == first && first.(0) = 1);
  push_buf b 2;
  assert (b.len = 2 && b.data.(1) = 2 && b.data != first)
;;""")
REV_LAZY_MANY = Problem(id="rev_lazy7b", prompt=REV_LAZY.prompt, tests="""let () =
  let l = List.init 20000 (fun i -> lazy (fun x -> x + i)) in
  List.iteri (fun i z -> if i mod 2 = 0 then ignore (Lazy.force z)) l;
  let r = rev_all l in
  assert (List.length r = 20000);
  assert (Lazy.force (List.hd r) 1 = 20000);
  assert (List.for_all2 (==) (List.rev r) l);
  let m = List.init 20000 (fun i -> lazy (ref i)) in
  List.iteri (fun i z -> if i mod 3 = 0 then incr (Lazy.force z)) m;
  let s = rev_all m in
  assert (!(Lazy.force (List.hd s)) = 19999);
  assert (!(Lazy.force (List.nth s 19999)) = 1)
;;""")

# Values of an abstract type: `=`, `compare` and `Hashtbl.hash` as on their representation, deep in
# lists and hash tables too (a counter that bumps in place is the same value after; nan is unordered).
COUNTER_IFACE = ("(** A counter.\n*)\n(* Implement the following interface (counter.mli):\ntype counter\n\n"
                 "val make : int -> counter\n\nval bump : counter -> counter\n\nval get : counter -> int\n*)\n"
                 "let rec get (x : counter) : int =")
COUNTER_EQ = Problem(id="counter_eq7", prompt=COUNTER_IFACE, tests="""let () =
  assert (make 1 = make 1);
  assert (bump (make 0) = make 1);
  assert (bump (make 0) <> make 0);
  assert (compare (make 2) (make 3) < 0);
  assert (List.mem (make 2) [make 1; make 2]);
  assert (List.sort compare [make 3; make 1; make 2] = [make 1; make 2; make 3]);
  assert (Hashtbl.hash (make 5) = Hashtbl.hash (make 5));
  let h = Hashtbl.create 4 in
  Hashtbl.replace h (make 1) "one";
  assert (Hashtbl.find h (make 1) = "one");
  let c = make 0 in
  let d = bump c in
  assert (c = d)
;;""")
COUNTER = "type counter = int ref\nlet make n = ref n\nlet get c = !c\n"
COUNTER_SAME = Problem(id="counter_same7", prompt=COUNTER_IFACE, tests="""let () =
  let c = make 0 in
  assert (bump c == c);
  assert (get c = 1);
  assert (make 0 != make 0)
;;""")
COUNTER_NAN = Problem(id="counter_nan7", prompt=COUNTER_IFACE, tests="""let () =
  assert (make 0 = make 0);
  assert (compare (make 0) (make 0) = 0);
  assert (not (make 0 < make 1));
  assert (make 1 = make 1)
;;""")
STACK_IFACE = ("(** A stack.\n*)\n(* Implement the following interface (stack.mli):\ntype 'a stack\n\n"
               "val empty : unit -> 'a stack\n\nval push : 'a -> 'a stack -> 'a stack\n\nval top : 'a stack -> 'a option\n*)\n"
               "let rec top (s : 'a stack) : 'a option =")
STACKS = Problem(id="stacks7", prompt=STACK_IFACE, tests="""let () =
  assert (top (push 1 (empty ())) = Some 1);
  let inner = push 2 (empty ()) in
  let outer = push inner (empty ()) in
  assert (top outer = Some inner);
  assert (match top outer with Some s -> top s = Some 2 | None -> false);
  assert (push 1 (empty ()) = push 1 (empty ()))
;;""")
ZERO_ROW = Problem(id="zero_row7", prompt=(
    "(** Zero row, then set m.(0).(0) to 7. *)\nlet zero_row (m : int array array) (row : int array) : unit ="),
    tests="""let () =
  let m = [| [| 1; 2 |]; [| 3; 4 |] |] in
  zero_row m m.(1);
  assert (m = [| [| 7; 2 |]; [| 0; 0 |] |]);
  let m = [| [| 1; 2 |]; [| 3; 4 |] |] in
  zero_row m m.(0);
  assert (m.(0) = [| 7; 0 |]);
  let r = [| 5 |] in
  let m = [| r; r |] in
  zero_row m [| 1 |];
  assert (m.(1).(0) = 7)
;;""")
SCALE_ALL = Problem(id="scale_all7", prompt="(** Double every element of every array, in place. *)\nlet scale_all (rows : int array list) : unit =",
                    tests="""let () =
  let a = [| 1; 2 |] in
  scale_all [a; [| 3 |]];
  assert (a = [| 2; 4 |]);
  let b = [| 1 |] in
  scale_all [b; b; b];
  assert (b = [| 8 |]);
  let e = [||] in
  scale_all [e; e];
  assert (e = [||]);
  let c = [| 1 |] and d = [| 1 |] in
  scale_all [c; d];
  assert (c = [| 2 |] && d = [| 2 |])
;;""")
CELL = "type cell = Box of int array | Pair of int * int ref | Empty\n"
CLEAR_CELLS = Problem(id="clear_cells7", prompt=CELL + "(** Zero every array and ref in the cells. *)\nlet clear (l : cell list) : unit =",
                      tests="""let () =
  let a = [| 1; 2 |] and r = ref 5 in
  clear [Box a; Empty; Pair (3, r)];
  assert (a = [| 0; 0 |]);
  assert (!r = 0);
  let b = [| 4 |] in
  clear [Box b; Box b];
  assert (b = [| 0 |])
;;""")
SLOT = ACCOUNT + "type slot = Open of account | Closed of string\n"
DEPOSIT_ALL = Problem(id="deposit_all7", prompt=SLOT + "(** Add x to every open account. *)\nlet deposit_all (l : slot list) (x : int) : unit =",
                      tests="""let () =
  let a = { owner = "a"; balance = 1 } in
  deposit_all [Open a; Closed "b"; Open a] 10;
  assert (a.balance = 21);
  let c = { owner = "c"; balance = 0 } in
  deposit_all [Open c] 5;
  assert (c.balance = 5)
;;""")
GRID = Problem(id="grid7", prompt="(** An n by n grid of zeros, each row its own array. *)\nlet make_grid (n : int) : int array array =",
               tests="""let () =
  let g = make_grid 2 in
  assert (g = [| [| 0; 0 |]; [| 0; 0 |] |]);
  g.(0).(0) <- 1;
  assert (g.(1).(0) = 0);
  let h = make_grid 3 in
  h.(2).(2) <- 9;
  assert (h.(0).(2) = 0)
;;""")
SUM_ARRAY = Problem(id="sum7", prompt="(** The sum of the array's elements. *)\nlet sum (a : int array) : int =",
                    tests="""let () =
  let a = [| 1; 2 |] in
  assert (sum a = 3);
  a.(0) <- 10;
  assert (sum a = 12);
  assert (sum [| 5 |] = 5);
  assert (sum [| 1; 2 |] = 3)
;;""")
SQUARES = Problem(id="squares7", prompt="(** The squares of k, k+1 and k+2, in a fresh array. *)\nlet squares3 (k : int) : int array =",
                  tests="""let () =
  let a = squares3 0 in
  assert (a = [| 0; 1; 4 |]);
  let b = squares3 1 in
  assert (b = [| 1; 4; 9 |]);
  assert (a = [| 0; 1; 4 |]);
  assert (a != b)
;;""")
KEEP_LIST = Problem(id="keep_list7", prompt="(** l without x (l itself when x is not in it). *)\nlet remove (x : int) (l : int list) : int list =",
                   tests="""let () =
  let l = [1; 2; 3] in
  assert (remove 5 l == l);
  assert (remove 2 l = [1; 3])
;;""")

# A block both sides hold changes between calls where it does not cross: the answer changes one it
# keeps in a later call (the tests' own array, its own buffer, a record's field), or the tests change
# one the answer keeps; the other side sees it at its next call or reply, as in one program.
TRACK_IFACE = ("(** Counters kept by reference.\n*)\n(* Implement the following interface (track.mli):\n"
               "val track : int array -> unit\n\nval bump : unit -> unit\n\nval total : unit -> int\n*)\n"
               "let track (a : int array) : unit =")
TRACKED = "let kept = ref [||]\nlet track a = kept := a\nlet bump () = Array.iteri (fun i x -> (!kept).(i) <- x + 1) !kept\n" \
          "let total () = Array.fold_left (+) 0 !kept"
COPIED = TRACKED.replace("kept := a", "kept := Array.copy a")
TRACK_SEES = Problem(id="track7", prompt=TRACK_IFACE, tests="""let () =
  let a = [| 0; 5 |] in
  track a;
  bump ();
  assert (a = [| 1; 6 |]);
  a.(0) <- 10;
  assert (total () = 16);
  bump ();
  assert (a.(0) = 11 && total () = 18)
;;""")
TRACK_COPIES = Problem(id="track7b", prompt=TRACK_IFACE, tests="""let () =
  let a = [| 1; 2 |] in
  track a;
  bump ();
  assert (a = [| 1; 2 |]);
  a.(0) <- 10;
  assert (total () = 5)
;;""")
# the answer's own buffer, returned once, changed by later calls that return nothing
FILL_IFACE = ("(** A buffer.\n*)\n(* Implement the following interface (buffer.mli):\nval buffer : unit -> int array\n\n"
              "val fill : int -> unit\n*)\nlet buffer () : int array =")
FILL = Problem(id="fill7", prompt=FILL_IFACE, tests="""let () =
  let b = buffer () in
  fill 5;
  assert (b = [| 5; 5 |]);
  fill 7;
  assert (b.(1) = 7);
  assert (buffer () == b)
;;""")
# a matrix the answer keeps: the tests change a row, the answer a cell and a record's field
GRID_IFACE = ("(** A kept grid.\n*)\n(* Implement the following interface (grid.mli):\nval keep : int array array -> unit\n\n"
              "val sum : unit -> int\n\nval clear : unit -> unit\n*)\nlet keep (m : int array array) : unit =")
GRID_KEPT = Problem(id="grid_kept7", prompt=GRID_IFACE, tests="""let () =
  let m = [| [| 1; 2 |]; [| 3 |] |] in
  let r = m.(1) in
  keep m;
  r.(0) <- 30;
  assert (sum () = 33);
  m.(0) <- [| 4 |];
  assert (sum () = 34);
  clear ();
  assert (r = [| 0 |] && m.(0) = [| 0 |])
;;""")
GRID_CODE = ("let kept = ref [||]\nlet keep m = kept := m\n"
             "let sum () = Array.fold_left (fun s r -> Array.fold_left (+) s r) 0 !kept\n"
             "let clear () = Array.iter (fun r -> Array.fill r 0 (Array.length r) 0) !kept")
LEDGER_IFACE = (ACCOUNT + "(** Interest on kept accounts.\n*)\n(* Implement the following interface (ledger.mli):\n"
                "val open_account : account -> unit\n\nval pay_interest : unit -> unit\n*)\n"
                "let open_account (a : account) : unit =")
LEDGER = Problem(id="ledger7", prompt=LEDGER_IFACE, tests="""let () =
  let a = { owner = "a"; balance = 100 } in
  open_account a;
  pay_interest ();
  assert (a.balance = 110);
  a.balance <- 0;
  pay_interest ();
  assert (a.balance = 0)
;;""")
LEDGER_CODE = (ACCOUNT + "let kept = ref []\nlet open_account a = kept := a :: !kept\n"
               "let pay_interest () = List.iter (fun a -> a.balance <- a.balance + a.balance / 10) !kept")

# the tests' function changes an array the answer made and passes it: the answer sees the change
# when the function returns, as in one program
APPLY_SUM = Problem(id="apply_sum7", prompt=("(** The sum of [| 1; 2 |] after f has seen it. *)\n"
                                             "let apply_sum (f : int array -> unit) : int ="), tests="""let () =
  assert (apply_sum (fun a -> a.(0) <- 10) = 12);
  assert (apply_sum (fun _ -> ()) = 3)
;;""")

BUMPED = Problem(id="bumped7", prompt=("(** The counter's value after f has bumped it. *)\n"
                                        "let bumped (f : int ref -> unit) : int ="), tests="""let () =
  assert (bumped incr = 1);
  assert (bumped (fun r -> r := !r + 5) = 5)
;;""")

# labelled arguments: a partial application by label happens once too; one that names a later
# label first waits for the earlier ones, in one program as here
LAB_SCALE = Problem(id="lab_scale7", prompt="(** k times x. *)\nlet scale ~(k : int) (x : int) : int =", tests="""let () =
  let triple = scale ~k:3 in
  assert (triple 1 = 3);
  assert (triple 2 = 6);
  assert (List.map (scale ~k:2) [1; 2] = [2; 4])
;;""")
LAB_CLAMP = Problem(id="lab_clamp7", prompt=("(** x clamped to [lo, hi]. *)\n"
                                             "let clamp ~(lo : int) ~(hi : int) (x : int) : int ="), tests="""let () =
  let upto9 = clamp ~hi:9 in
  assert (upto9 ~lo:0 12 = 9);
  let from5 = clamp ~lo:5 in
  assert (try ignore (from5 ~hi:1); false with Invalid_argument _ -> true);
  assert (from5 ~hi:9 7 = 7);
  assert (upto9 ~lo:2 1 = 2)
;;""")

# type variables: fixed once per partial application, its values one table across its frames (a
# value sent with the first argument comes back with the last as the tests' own)
APP = Problem(id="app7", prompt="(** f applied to x. *)\nlet app (f : 'a -> 'b) (x : 'a) : 'b =", tests="""let () =
  let g = app (fun x -> x + 1) in
  assert (g 1 = 2);
  assert (g 2 = 3);
  assert (List.map (app string_of_int) [1; 2] = ["1"; "2"])
;;""")
PAIR = Problem(id="pair7", prompt="(** x and y as a pair. *)\nlet pair (x : 'a) (y : 'b) : 'a * 'b =", tests="""let () =
  let s = String.make 2 'a' in
  let p = pair s in
  assert (p 1 = (s, 1));
  assert (fst (p 2) == s);
  assert (List.map (pair 0) [true; false] = [(0, true); (0, false)])
;;""")
ONCE = "let used = ref false in fun y -> if !used then raise Exit else (used := true; "

# a partial application that holds a value of a type variable is made in the oracle only where the
# answer's code runs at it (a copy there, which the tests' later change would not reach): the
# honest `push s x` sees `s := []`
PUSH_POLY = Problem(id="push_poly7", prompt="(** Push x onto s. *)\nlet push (s : 'a list ref) (x : 'a) : unit =",
                    tests="""let () =
  let s = ref [] in
  let p = push s in
  p 1;
  p 2;
  assert (!s = [2; 1]);
  s := [];
  p 3;
  assert (!s = [3])
;;""")

# a partial application made in the oracle (the answer's code runs at it) holds a copy of a value
# of a type variable: once the tests change that value, a call through it is refused (the copy is
# no longer theirs), never graded on the stale copy
LARGER = Problem(id="larger7", prompt="(** The larger of x and y (by compare). *)\nlet larger (x : 'a) (y : 'a) : 'a =",
                 tests="""let () =
  let a = [| 1 |] in
  let l = larger a in
  assert (l [| 0 |] == a);
  a.(0) <- -1;
  assert (l [| 0 |] == a)
;;""")

# the same with a handle in the held value (the tests' value of an abstract type, which Marshal
# cannot write): the rest of the value is still watched, the handle by its number
LARGER_HANDLE = Problem(id="larger_handle7", prompt=(
    "(** A counter, and the larger of two values.\n*)\n(* Implement the following interface (larger.mli):\n"
    "type counter\n\nval make : int -> counter\n\nval larger : 'a -> 'a -> 'a\n*)\n"
    "let larger (x : 'a) (y : 'a) : 'a ="), tests="""let () =
  let a = ([| 1 |], make 0) in
  let l = larger a in
  assert (l ([| 0 |], make 0) == a);
  (fst a).(0) <- -1;
  assert (l ([| 0 |], make 0) == a)
;;""")
LARGER_HANDLE_KEPT = Problem(id="larger_handle_kept7", prompt=LARGER_HANDLE.prompt, tests="""let () =
  let a = ([| 1 |], make 0) in
  let l = larger a in
  assert (l ([| 0 |], make 0) == a);
  assert (l ([| 2 |], make 0) != a)
;;""")

CASES = [
    # a closure right only once: truth 1/3; replayed per call it earns 3/3
    pytest.param(SCALE, "let scale k = let used = ref false in fun x -> if !used then 0 else (used := true; k * x)",
                 id="partial-once"),
    # staged honestly: a table built once per k, then read per x (rebuilt per call it would take minutes)
    pytest.param(SCALE_MANY, "let scale k = let t = Array.init 1_000_000 (fun i -> k * i) in fun x -> t.(x)",
                 id="partial-staged"),
    # three arguments, applied one, two and three at a time
    pytest.param(CLAMP, "let clamp lo = let calls = ref 0 in fun hi -> incr calls; fun x -> "
                 "if !calls > 1 then -1 else max lo (min hi x)", id="partial-three"),
    # validated early: the partial application itself raises in one program
    pytest.param(SCALE_CHECKED, "let scale k = if k = 0 then invalid_arg \"scale\" else fun x -> k * x",
                 id="partial-raises-early"),
    # applied short of its arity, a function runs nothing: `scale 0` does not raise here
    pytest.param(SCALE_CHECKED, "let scale k x = if k = 0 then invalid_arg \"scale\" else k * x",
                 id="partial-runs-nothing"),
    # the second of three arguments runs the answer's code (`clamp 5 1` raises), the first does not
    pytest.param(CLAMP_CHECKED, "let clamp lo = fun hi -> if hi < lo then invalid_arg \"clamp\" else fun x -> max lo (min hi x)",
                 id="partial-raises-at-the-second"),
    pytest.param(CLAMP_CHECKED, "let clamp lo hi x = if hi < lo then invalid_arg \"clamp\" else max lo (min hi x)",
                 id="partial-raises-at-the-last"),
    # a partial application made once, whatever its calls raise after it
    pytest.param(SCALE_ONCE, "let made = ref 0\nlet scale k = incr made; if !made > 1 then failwith \"twice\" "
                 "else fun x -> if x < 0 then invalid_arg \"x\" else k * x", id="partial-once-after-a-raise"),
    pytest.param(SCALE, "let scale k x = k * x", id="partial-honest"),
    # aliasing: a naive reverse into itself is wrong in OCaml
    pytest.param(REVERSE_INTO, "let reverse_into src dst =\n  let n = Array.length src in\n"
                 "  for i = 0 to n - 1 do dst.(i) <- src.(n - 1 - i) done", id="alias-args"),
    pytest.param(REVERSE_INTO, "let reverse_into src dst =\n  let c = Array.copy src and n = Array.length src in\n"
                 "  for i = 0 to n - 1 do dst.(i) <- c.(n - 1 - i) done", id="alias-args-honest"),
    pytest.param(SAME_LIST, "let same a b = a == b", id="identity-twice"),
    pytest.param(SAME_LIST, "let same a b = a = b", id="identity-structural"),
    # nested mutation: rows sorted in place, and arrays inside a list
    pytest.param(SORT_ROWS, "let sort_rows m = Array.iter (Array.sort compare) m", id="mutation-rows"),
    pytest.param(SORT_EACH, "let sort_each l = List.iter (Array.sort compare) l", id="mutation-in-list"),
    # a row replaced, not changed: the tests' old row keeps its contents and is no longer the matrix's
    pytest.param(SORT_ROWS, "let sort_rows m = Array.iteri (fun i r -> let c = Array.copy r in Array.sort compare c; "
                 "m.(i) <- c) m", id="mutation-rows-replaced"),
    # arrays inside a tuple and an option, one changed and one not
    pytest.param(SWAP_FIRST, "let swap_first (a, b) = let t = a.(0) in a.(0) <- b.(0); b.(0) <- t", id="mutation-in-tuple"),
    pytest.param(FILL_SOME, "let fill_some o = match o with Some a -> Array.fill a 0 (Array.length a) 7 | None -> ()",
                 id="mutation-in-option"),
    # refs: their contents written back in place, through a list too, aliased or not
    pytest.param(INCR_ALL, "let incr_all l = List.iter incr l", id="refs-in-list"),
    # one block twice inside one argument: two copies in the oracle
    pytest.param(INCR_TWICE, "let incr_all l = List.iter incr l", id="alias-inside-an-argument"),
    pytest.param(ZERO_ROW, "let zero_row m row = Array.fill row 0 (Array.length row) 0; m.(0).(0) <- 7",
                 id="alias-between-arguments"),
    pytest.param(SCALE_ALL, "let scale_all rows = List.iter (fun r -> Array.iteri (fun i x -> r.(i) <- 2 * x) r) rows",
                 id="alias-in-a-list-of-arrays"),
    pytest.param(SCALE_ALL, "let scale_all rows = List.iter (fun r -> ignore (Array.map (fun x -> 2 * x) r)) rows",
                 id="alias-in-a-list-of-arrays-untouched"),
    pytest.param(SWAP_REFS, "let swap_refs a b = let t = !a in a := !b; b := t", id="refs-polymorphic"),
    pytest.param(PUSH, "let push s x = s := x :: !s", id="ref-argument"),
    pytest.param(PUSH, "let push s x = ignore (ref (x :: !s))", id="ref-argument-untouched"),
    # records with mutable fields: a field set, an array in one changed or replaced
    pytest.param(DEPOSIT, ACCOUNT + "let deposit a x = a.balance <- a.balance + x", id="mutable-field"),
    pytest.param(DEPOSIT, ACCOUNT + "let deposit a x = ignore { a with balance = a.balance + x }", id="mutable-field-untouched"),
    pytest.param(RESET_ALL, ACCOUNT + "let reset_all l = List.iter (fun a -> a.balance <- 0) l", id="mutable-fields-in-list"),
    pytest.param(PUSH_BUF, BUF + "let push_buf b x =\n  if b.len = Array.length b.data then begin\n"
                 "    let d = Array.make (2 * b.len) 0 in Array.blit b.data 0 d 0 b.len; b.data <- d end;\n"
                 "  b.data.(b.len) <- x; b.len <- b.len + 1", id="mutable-field-replaced"),
    # values of a type variable that are lazy, unforced or forced to a function, cross as themselves
    pytest.param(REV_LAZY, "let rev_all l = List.rev l", id="lazy-values"),
    # many of them, half forced: the copies are made while the collector runs
    pytest.param(REV_LAZY_MANY, "let rev_all l = List.rev l", id="lazy-values-many"),
    # the tests' own exceptions raised inside the answer keep their constructor
    pytest.param(APPLY_ALL, "let apply_all f xs = List.map f xs", id="test-exceptions"),
    # a test helper's parameter named `compare` is the tests' closure, not Stdlib's
    pytest.param(SORT_WITH, "let sort_with cmp xs = List.sort cmp xs", id="test-parameter"),
    pytest.param(SORT_WITH_LAMBDA, "let sort_with cmp xs = List.sort cmp xs", id="test-parameter-in-a-closure"),
    pytest.param(SORT_WITH, "let sort_with _ xs = List.sort compare xs", id="test-parameter-ignored"),
    # a result's blocks keep their sharing: the classic aliased-rows bug fails as in one program
    pytest.param(GRID, "let make_grid n = Array.make n (Array.make n 0)", id="result-aliased-rows"),
    pytest.param(GRID, "let make_grid n = Array.make_matrix n n 0", id="result-rows-apart"),
    # identity across calls: a memo keyed on the argument array finds it again, changed; one
    # buffer returned by every call is one array for the tests
    pytest.param(SUM_ARRAY, "let memo = ref []\nlet sum a = match List.assq_opt a !memo with Some s -> s\n"
                 "  | None -> let s = Array.fold_left (+) 0 a in memo := (a, s) :: !memo; s", id="memo-by-identity"),
    pytest.param(SUM_ARRAY, "let sum a = Array.fold_left (+) 0 a", id="memo-none"),
    pytest.param(SQUARES, "let buf = Array.make 3 0\nlet squares3 k = for i = 0 to 2 do buf.(i) <- (i + k) * (i + k) done; buf",
                 id="global-buffer"),
    pytest.param(SQUARES, "let squares3 k = Array.init 3 (fun i -> (i + k) * (i + k))", id="fresh-results"),
    # a result that is one of the arguments is the tests' own value (`==`)
    pytest.param(KEEP_LIST, "let remove x l = if List.mem x l then List.filter ((<>) x) l else l", id="result-is-an-argument"),
    pytest.param(KEEP_LIST, "let remove x l = List.filter ((<>) x) l", id="result-is-a-copy"),
    # mutable blocks inside a variant's arguments, written back
    pytest.param(CLEAR_CELLS, CELL + "let clear l = List.iter (function Box a -> Array.fill a 0 (Array.length a) 0 "
                 "| Pair (_, r) -> r := 0 | Empty -> ()) l", id="variant-arrays"),
    pytest.param(CLEAR_CELLS, CELL + "let clear l = List.iter (function Box a -> ignore (Array.map (fun _ -> 0) a) "
                 "| _ -> ()) l", id="variant-arrays-untouched"),
    pytest.param(DEPOSIT_ALL, SLOT + "let deposit_all l x = List.iter (function Open a -> a.balance <- a.balance + x "
                 "| Closed _ -> ()) l", id="variant-mutable-records"),
    # values of an abstract type compare and hash as their representations
    pytest.param(COUNTER_EQ, COUNTER + "let bump c = ref (!c + 1)", id="abstract-equal"),
    pytest.param(COUNTER_EQ, COUNTER + "let bump c = c", id="abstract-bump-does-nothing"),
    pytest.param(COUNTER_EQ, COUNTER + "let bump c = incr c; c", id="abstract-bump-in-place"),
    # the same value returned twice is one handle (`==`)
    pytest.param(COUNTER_SAME, COUNTER + "let bump c = incr c; c", id="abstract-same-value"),
    pytest.param(COUNTER_SAME, COUNTER + "let bump c = ref (!c + 1)", id="abstract-new-value"),
    pytest.param(COUNTER_EQ, "type counter = { n : int; f : unit -> int }\nlet make n = { n; f = (fun () -> n) }\n"
                 "let get c = c.f ()\nlet bump c = make (c.n + 1)", id="abstract-holding-a-closure"),
    pytest.param(COUNTER_NAN, "type counter = float\nlet make n = if n = 0 then Float.nan else float n\n"
                 "let get c = int_of_float c\nlet bump c = c +. 1.", id="abstract-unordered"),
    # a stack of stacks: the tests' handles cross inside values of a type variable, and come back
    pytest.param(STACKS, "type 'a stack = 'a list\nlet empty () = []\nlet push x s = x :: s\n"
                 "let top = function [] -> None | x :: _ -> Some x", id="abstract-inside-a-type-variable"),
    # a kept block changes between calls where it does not cross, both ways (by reference or copied)
    pytest.param(TRACK_SEES, TRACKED, id="kept-changes-seen"),
    pytest.param(TRACK_SEES, COPIED, id="kept-copy-changes-unseen"),
    pytest.param(TRACK_COPIES, TRACKED, id="kept-by-reference-where-a-copy-is-asked"),
    pytest.param(TRACK_COPIES, COPIED, id="kept-copy-where-a-copy-is-asked"),
    pytest.param(FILL, "let buf = Array.make 2 0\nlet buffer () = buf\nlet fill x = Array.fill buf 0 2 x", id="kept-own-buffer"),
    pytest.param(FILL, "let buffer () = Array.make 2 0\nlet fill _ = ()", id="kept-own-buffer-fresh"),
    pytest.param(GRID_KEPT, GRID_CODE, id="kept-grid"),
    pytest.param(GRID_KEPT, GRID_CODE.replace("kept := m", "kept := Array.map Array.copy m"), id="kept-grid-copied"),
    pytest.param(LEDGER, LEDGER_CODE, id="kept-record"),
    pytest.param(APPLY_SUM, "let apply_sum f = let a = [| 1; 2 |] in f a; Array.fold_left (+) 0 a", id="changed-by-the-tests-function"),
    pytest.param(APPLY_SUM, "let apply_sum f = let a = [| 1; 2 |] in f (Array.copy a); Array.fold_left (+) 0 a",
                 id="changed-by-the-tests-function-a-copy"),
    pytest.param(BUMPED, "let bumped f = let r = ref 0 in f r; !r", id="ref-changed-by-the-tests-function"),
    pytest.param(LAB_SCALE, "let scale ~k = let used = ref false in fun x -> if !used then 0 else (used := true; k * x)",
                 id="labelled-partial-once"),
    pytest.param(LAB_SCALE, "let scale ~k x = k * x", id="labelled-partial-honest"),
    pytest.param(LAB_CLAMP, "let clamp ~lo = fun ~hi -> if hi < lo then invalid_arg \"clamp\" else fun x -> max lo (min hi x)",
                 id="labelled-raises-at-the-second"),
    pytest.param(LAB_CLAMP, "let clamp ~lo = let calls = ref 0 in fun ~hi -> incr calls; fun x -> "
                 "if !calls > 2 then -1 else max lo (min hi x)", id="labelled-partial-counted"),
    pytest.param(LAB_CLAMP, "let clamp ~lo ~hi x = if hi < lo then invalid_arg \"clamp\" else max lo (min hi x)",
                 id="labelled-raises-at-the-last"),
    pytest.param(APP, "let app f x = f x", id="polymorphic-partial-honest"),
    pytest.param(APP, "let app f = " + ONCE.replace("fun y", "fun x") + "f x)", id="polymorphic-partial-once"),
    pytest.param(PAIR, "let pair x y = (x, y)", id="polymorphic-value-across-frames"),
    pytest.param(PAIR, "let pair x = " + ONCE + "(x, y))", id="polymorphic-value-once"),
    pytest.param(PUSH_POLY, "let push s x = s := x :: !s", id="polymorphic-held-value-changed-by-the-tests"),
    pytest.param(LARGER, "let larger x = let calls = ref 0 in fun y -> incr calls; if compare x y >= 0 then x else y",
                 id="polymorphic-held-copy-changed"),
    pytest.param(LARGER, "let larger x y = if compare x y >= 0 then x else y", id="polymorphic-held-copy-replayed"),
    pytest.param(LARGER_HANDLE, "type counter = int ref\nlet make n = ref n\nlet larger x = let calls = ref 0 in "
                 "fun y -> incr calls; if compare x y >= 0 then x else y", id="polymorphic-held-copy-with-a-handle"),
    pytest.param(LARGER_HANDLE_KEPT, "type counter = int ref\nlet make n = ref n\nlet larger x = let calls = ref 0 in "
                 "fun y -> incr calls; if compare x y >= 0 then x else y", id="polymorphic-held-handle-unchanged"),
]


@pytest.mark.parametrize("problem,code", CASES)
def test_a_value_across_the_wire_behaves_as_in_one_program(scorer, tmp_path, problem, code):
    truth = plain_ocaml_passes(tmp_path, code, problem.tests)
    b = scorer.score_one(problem, fenced(code))
    assert b.compiled and b.tests_passed == truth, (b.tests_passed, truth, b.first_error)


def test_a_record_with_a_mutable_field_crosses_only_where_it_can_be_written_back():
    """Through lists, options, tuples, arrays, refs, records and variants, yes; through a function,
    or in a type that holds itself, the problem is unverifiable (no test credit, said why)."""
    assert not interface_of(DEPOSIT.prompt, "deposit").unverifiable
    assert not interface_of(RESET_ALL.prompt, "reset_all").unverifiable
    looped = interface_of("type node = { v : int; mutable next : node option }\nlet f (n : node) : unit =", "f")
    assert "holds a value of its own type" in looped.unverifiable
    assert not interface_of(ACCOUNT + "type t = A of account | B\nlet f (x : t) : unit =", "f").unverifiable
    looped_variant = interface_of(ACCOUNT + "type t = A of account * t | B\nlet f (x : t) : unit =", "f")
    assert "holds a record with a mutable field and the type itself" in looped_variant.unverifiable
    # a variant that holds itself and arrays (a tree of arrays): its mutation cannot be written back
    tree = interface_of("type 'a tree = Leaf | Node of 'a tree * 'a * 'a tree\nlet f (t : int array tree) : unit =", "f")
    assert "holds itself and mutable blocks" in tree.unverifiable
    assert not interface_of("type 'a tree = Leaf | Node of 'a tree * 'a * 'a tree\nlet f (t : int tree) : unit =",
                            "f").unverifiable
    called = interface_of(ACCOUNT + "let f (g : account -> unit) : unit =", "f")
    assert "a function passed or returned" in called.unverifiable


# A block of the tests' the answer was given in an earlier call and keeps is the answer's to give
# back, changed, as in one program; a hostile oracle (the answer writes its own reply frame:
# `external`, so the library check is off) that names a number the trusted side never gave it is
# refused, so a block of the tests' the answer never saw is never its to rewrite.
KEPT = Problem(id="kept7", prompt=(
    "(** Arrays.\n*)\n(* Implement the following interface (arrays.mli):\nval length : int array -> int\n\n"
    "val make : unit -> int array\n*)\nlet length (a : int array) : int ="), tests="""let () =
  let expected = [| 0 |] in
  assert (length expected = 1);
  assert (make () = expected)
;;""")
FORGED = '''external fd_out : int -> out_channel = "caml_ml_open_descriptor_out"
let length a = Array.length a
(* the reply to `make ()`: an array's number, then its contents [| 5 |] *)
let make () =
  let oc = fd_out (int_of_string Sys.argv.(2)) in
  output_string oc ("R 25\\n" ^ NUMBER ^ "\\001\\001" ^ String.make 7 '\\000' ^ "\\005" ^ String.make 7 '\\000');
  flush oc; exit 0
'''
KEPT_AND_CHANGED = "let kept = ref [||]\nlet length a = kept := a; Array.length a\nlet make () = (!kept).(0) <- 5; !kept"


def test_a_block_of_the_tests_is_the_answers_to_give_back_only_if_it_was_given(sandbox_scorer, tmp_path):
    truth = plain_ocaml_passes(tmp_path, KEPT_AND_CHANGED, KEPT.tests)
    assert truth == 2 and sandbox_scorer.score_one(KEPT, fenced(KEPT_AND_CHANGED)).tests_passed == truth
    # the tests' array is number 0 (the trusted side numbers evenly): named, it is given back changed
    given = sandbox_scorer.score_one(KEPT, fenced(FORGED.replace("NUMBER", "String.make 8 '\\000'")))
    assert given.compiled and given.tests_passed == 2, given
    # number 2 was never given: refused, the assertion fails
    forged = sandbox_scorer.score_one(KEPT, fenced(FORGED.replace("NUMBER", '"\\002" ^ String.make 7 \'\\000\'')))
    assert forged.compiled and (forged.tests_passed, forged.tests_total) == (1, 2), forged


# A record given back changed: its mutable fields, as in one program; a reply that changes a field
# it does not declare mutable is refused (the honest answer keeps the tests' record and sets its
# balance; the forged reply names that record with another owner).
BANK = Problem(id="bank7", prompt=(ACCOUNT + "(** An account kept by the bank. *)\n(* Implement the following interface "
                                   "(bank.mli):\nval deposit : account -> int -> unit\n\nval last : unit -> account\n*)\n"
                                   "let deposit (a : account) (x : int) : unit ="), tests="""let () =
  let a = { owner = "alice"; balance = 0 } in
  deposit a 5;
  assert (a.balance = 5);
  assert ((last ()).balance = 9 && a.balance = 9)
;;""")
BANK_HONEST = (ACCOUNT + "let kept = ref None\nlet deposit a x = a.balance <- a.balance + x; kept := Some a\n"
               "let last () = match !kept with Some a -> a.balance <- 9; a | None -> failwith \"none\"")
BANK_FORGED = ACCOUNT + '''external fd_out : int -> out_channel = "caml_ml_open_descriptor_out"
let deposit a x = a.balance <- a.balance + x
(* the tests' record (number 0), its owner changed, its balance 9 *)
let last () =
  let oc = fd_out (int_of_string Sys.argv.(2)) in
  output_string oc ("R 32\\n" ^ String.make 8 '\\000' ^ "\\001\\007" ^ String.make 7 '\\000' ^ "mallory\\009" ^ String.make 7 '\\000');
  flush oc; exit 0
'''


def test_a_record_given_back_changes_only_in_its_mutable_fields(sandbox_scorer, tmp_path):
    truth = plain_ocaml_passes(tmp_path, BANK_HONEST, BANK.tests)
    assert truth == 2 and sandbox_scorer.score_one(BANK, fenced(BANK_HONEST)).tests_passed == truth
    forged = sandbox_scorer.score_one(BANK, fenced(BANK_FORGED))
    assert forged.compiled and (forged.tests_passed, forged.tests_total) == (1, 2), forged


# Frame M (a block the answer holds, changed between calls) passes the same checks as a block that
# crosses again: the hostile oracle below sends one before its reply to `probe ()`, naming the
# tests' array it was given (number 0: accepted, as the honest answer's change is) or a number it
# was never given (2: refused, the assertion fails).
KEPT_PROBE = Problem(id="kept_probe7", prompt=(
    "(** Arrays.\n*)\n(* Implement the following interface (arrays.mli):\nval length : int array -> int\n\n"
    "val probe : unit -> int\n*)\nlet length (a : int array) : int ="), tests="""let () =
  let given = [| 0 |] in
  assert (length given = 1);
  assert (probe () = 0 && given = [| 5 |])
;;""")
PROBE_HONEST = "let kept = ref [||]\nlet length a = kept := a; Array.length a\nlet probe () = (!kept).(0) <- 5; 0"
PROBE_FORGED = '''external fd_out : int -> out_channel = "caml_ml_open_descriptor_out"
let le n = String.init 8 (fun i -> Char.chr ((n lsr (8 * i)) land 255))
let length a = Array.length a
(* frame M: the key, the number, 1, then the array [| 5 |]; then the reply 0 *)
let probe () =
  let oc = fd_out (int_of_string Sys.argv.(2)) in
  let m = le KEY ^ le NUMBER ^ "\\001" ^ le 1 ^ le 5 in
  output_string oc ("M " ^ string_of_int (String.length m) ^ "\\n" ^ m ^ "R 8\\n" ^ le 0);
  flush oc; exit 0
'''


def test_a_changed_block_the_oracle_sends_is_only_one_it_was_given(sandbox_scorer, tmp_path):
    truth = plain_ocaml_passes(tmp_path, PROBE_HONEST, KEPT_PROBE.tests)
    assert truth == 2 and sandbox_scorer.score_one(KEPT_PROBE, fenced(PROBE_HONEST)).tests_passed == truth
    key = re.search(r"W\.w_shared (\d+)", trusted_stubs(interface_of(KEPT_PROBE.prompt, "length"), "W")).group(1)
    given = sandbox_scorer.score_one(KEPT_PROBE, fenced(PROBE_FORGED.replace("KEY", key).replace("NUMBER", "0")))
    assert given.compiled and given.tests_passed == 2, given
    forged = sandbox_scorer.score_one(KEPT_PROBE, fenced(PROBE_FORGED.replace("KEY", key).replace("NUMBER", "2")))
    assert forged.compiled and (forged.tests_passed, forged.tests_total) == (1, 2), forged
