(* The wire between the two programs of a grading (ocaml_grpo/oracle.py generates the code that
   uses it; docs/grader.md says why there are two):

   - the trusted program T holds the tests, with each entry point replaced by a stub of the
     prompt's type that asks the oracle; it decides every assertion and reports on a descriptor
     the answer's process never holds;
   - the oracle U holds the answer: it answers calls with values and nothing else, and never holds
     an expected value.

   Both link this unit (under a random name, off the allowlist). Messages are frames
   "KIND LEN\n" + LEN bytes: C (call: a handle, then the arguments), R (the return value), X (an
   exception), Y (U is initialised). Calls go both ways: a function value crossing the wire stays
   in its sender's table and reaches the receiver as a handle (the tests' closures passed to a
   higher-order entry point, a function an entry point returns).

   Values are written by their type, in binary: ints and floats as their 8 bytes, strings and
   lists as a length then their contents, options, results, tuples, the prompt's own types
   (constructor indexes, fields in order).
   Every reader is bounds-checked: T parses what U writes as hostile data, and any malformed
   frame ends the oracle (see `broken`), never T. No Marshal, no input_value. *)

exception Bad  (* a malformed frame or value *)

(* ---------------------------------------------------------------- writing *)

(* Binary and fixed-width where it can be (an int is its 8 bytes): a million-element list crosses
   in ~0.1 s of bytecode, where decimal text took ~0.9 s. *)
let w_int b n = Buffer.add_int64_le b (Int64.of_int n)
let w_bool b x = Buffer.add_char b (if x then '\001' else '\000')
let w_char b c = Buffer.add_char b c
let w_unit b () = Buffer.add_char b '\000'
let w_float b f = Buffer.add_int64_le b (Int64.bits_of_float f)
let w_int32 b x = Buffer.add_int32_le b x
let w_int64 b x = Buffer.add_int64_le b x
let w_string b s = w_int b (String.length s); Buffer.add_string b s
let w_bytes b s = w_string b (Bytes.to_string s)
let w_list w b l = w_int b (List.length l); List.iter (w b) l
let w_array w b a = w_int b (Array.length a); Array.iter (w b) a
let w_option w b = function None -> Buffer.add_char b '\000' | Some x -> Buffer.add_char b '\001'; w b x
let w_result wo we b = function
  | Ok x -> Buffer.add_char b '\000'; wo b x
  | Error e -> Buffer.add_char b '\001'; we b e
let w_tag = w_int  (* a constructor's index in the prompt's declaration *)
let w_ptag = w_string  (* a polymorphic variant's tag name *)

(* ---------------------------------------------------------------- reading *)

type reader = { s : string; mutable pos : int }

let reader s = { s; pos = 0 }

let need r n = if n < 0 || n > String.length r.s - r.pos then raise Bad

let r_byte r = need r 1; let c = r.s.[r.pos] in r.pos <- r.pos + 1; c
let r_int r = need r 8; let x = String.get_int64_le r.s r.pos in r.pos <- r.pos + 8; Int64.to_int x
let r_bool r = match r_byte r with '\000' -> false | '\001' -> true | _ -> raise Bad
let r_char r = r_byte r
let r_unit r = if r_byte r <> '\000' then raise Bad
let r_float r = need r 8; let x = String.get_int64_le r.s r.pos in r.pos <- r.pos + 8; Int64.float_of_bits x
let r_int32 r = need r 4; let x = String.get_int32_le r.s r.pos in r.pos <- r.pos + 4; x
let r_int64 r = need r 8; let x = String.get_int64_le r.s r.pos in r.pos <- r.pos + 8; x

let r_string r =
  let n = r_int r in
  need r n;
  let s = String.sub r.s r.pos n in
  r.pos <- r.pos + n;
  s

let r_bytes r = Bytes.of_string (r_string r)

(* A length is believed only as far as the frame holds: every value takes at least one byte. *)
let r_length r = let n = r_int r in need r n; n

let r_list rd r =
  let n = r_length r in
  let rec go k acc = if k = 0 then List.rev acc else go (k - 1) (rd r :: acc) in
  go n []

let r_array rd r =
  let n = r_length r in
  if n = 0 then [||]
  else begin
    let a = Array.make n (rd r) in
    for i = 1 to n - 1 do a.(i) <- rd r done;
    a
  end
let r_option rd r = match r_byte r with '\000' -> None | '\001' -> Some (rd r) | _ -> raise Bad
let r_result ro re r = match r_byte r with '\000' -> Ok (ro r) | '\001' -> Error (re r) | _ -> raise Bad
let r_tag = r_int
let r_ptag = r_string
let r_end r = if r.pos <> String.length r.s then raise Bad

(* An array argument the entry point may have changed in place: the oracle sends it back. *)
let blit_back (a : 'a array) (b : 'a array) =
  if Array.length a <> Array.length b then raise Bad;
  Array.blit b 0 a 0 (Array.length a)

let bytes_back (a : bytes) (b : bytes) =
  if Bytes.length a <> Bytes.length b then raise Bad;
  Bytes.blit b 0 a 0 (Bytes.length a)

(* ---------------------------------------------------------------- handles *)

(* A value of an abstract type the prompt's interface declares stays in the oracle: the trusted
   program holds its number, and gives it back only where its own types allow (so the oracle
   reads it back at the type it kept it). *)
let kept_values : Obj.t array ref = ref [||]
let kept_count = ref 0

let keep v =
  if !kept_count = Array.length !kept_values then begin
    let t = Array.make (max 16 (2 * !kept_count)) (Obj.repr 0) in
    Array.blit !kept_values 0 t 0 !kept_count;
    kept_values := t
  end;
  !kept_values.(!kept_count) <- Obj.repr v;
  incr kept_count;
  !kept_count - 1

let kept k = if k < 0 || k >= !kept_count then raise Bad else Obj.obj !kept_values.(k)

(* ---------------------------------------------------------------- type variables *)

(* The oracle sees a value of a type variable as a token: an integer key whose order is the
   values' order (`compare`) among every value the trusted program has sent as a token, so `=`,
   `compare` and sorting mean in the oracle what they mean on the values (a polymorphic answer can
   do nothing else with them). One table serves the whole run, not one call: a value can come back
   in a later call (`value_of` of a cell `create_input_cell` made, as a handle of the oracle's) or
   from one of the trusted side's closures during a call (`map`'s function, a fold's step). A new
   value gets a key between its neighbours' (a call's new values spread evenly across their gap);
   when no integer is left between them the wire is broken (the assertion under way fails: a key
   is never out of order). Two values of different types never meet in one comparison in the
   oracle, and values `compare` finds equal share a key. *)
module type TOKEN = sig
  type t
  val w : Buffer.t -> t -> unit
  val r : reader -> t
end

module Tok : TOKEN = struct
  type t = int
  let w = w_int
  let r = r_int
end

(* The oracle binds an entry point's i-th type variable at [Tok<i>.t]: an abstract type apiece, so an
   answer is bound as polymorphic as the prompt declares (no `fun (a, b) -> (a, b)` for
   `'a * 'b -> 'b * 'a`). Here, in a unit of their own, they precede the answer: its weak type
   variables can take them, as when tests are appended to it. *)
module Tok0 : TOKEN = Tok
module Tok1 : TOKEN = Tok
module Tok2 : TOKEN = Tok
module Tok3 : TOKEN = Tok
module Tok4 : TOKEN = Tok
module Tok5 : TOKEN = Tok
module Tok6 : TOKEN = Tok
module Tok7 : TOKEN = Tok

let tok_vals : Obj.t array ref = ref [||]  (* sorted by compare, distinct *)
let tok_keys : int array ref = ref [||]  (* increasing *)
let bound = 1 lsl 60  (* keys lie strictly between -bound and bound *)

(* Where [o] is among the sorted values [a]: (true, its index), or (false, where it would go). *)
let search (a : Obj.t array) (o : Obj.t) =
  let rec go lo hi =
    if lo >= hi then (false, lo)
    else
      let mid = (lo + hi) / 2 in
      let c = compare o a.(mid) in
      if c = 0 then (true, mid) else if c < 0 then go lo mid else go (mid + 1) hi in
  go 0 (Array.length a)

(* Add the sorted, distinct values [news], none of them in the table yet. *)
let tok_add (news : Obj.t array) =
  let vals = !tok_vals and keys = !tok_keys in
  let n = Array.length vals and k = Array.length news in
  let gap_of = Array.map (fun o -> snd (search vals o)) news in
  let new_keys = Array.make k 0 in
  let i = ref 0 in
  while !i < k do
    let j = gap_of.(!i) in
    let e = ref !i in
    while !e < k && gap_of.(!e) = j do incr e done;
    let lo = if j = 0 then - bound else keys.(j - 1) and hi = if j = n then bound else keys.(j) in
    let step = (hi - lo) / (!e - !i + 1) in
    if step < 1 then raise Bad;
    for m = !i to !e - 1 do new_keys.(m) <- lo + step * (m - !i + 1) done;
    i := !e
  done;
  let all_vals = Array.append vals news and all_keys = Array.append keys new_keys in
  let order = Array.init (n + k) (fun x -> x) in
  Array.sort (fun a b -> compare all_keys.(a) all_keys.(b)) order;
  tok_vals := Array.map (fun x -> all_vals.(x)) order;
  tok_keys := Array.map (fun x -> all_keys.(x)) order

let tok_key o =
  match search !tok_vals o with
  | true, j -> !tok_keys.(j)
  | false, _ -> tok_add [| o |]; !tok_keys.(snd (search !tok_vals o))

(* A call's tokens: its arguments' values are collected first, so that they get their keys together.
   The oracle names a key, never a type: a reply's value of the call's variable i is accepted only
   if the trusted program sent it for variable i in this call, or one of its closures returned it
   for i (else a key of another variable's value would be read at the wrong type: the int 1 read
   as true). [strict] is false only for problems whose values come back in later calls, through a
   handle the oracle keeps, a mirrored signal or a functor's instance: those look in the run's
   whole table. *)
type tokens = { pools : Obj.t list array; seen : (int, unit) Hashtbl.t array; mutable collecting : bool;
                strict : bool }

let tokens n strict =
  { pools = Array.make n []; seen = Array.init n (fun _ -> Hashtbl.create 16); collecting = true; strict }

let w_var tb i b v =
  let o = Obj.repr v in
  if tb.collecting then tb.pools.(i) <- o :: tb.pools.(i)
  else begin
    let k = tok_key o in
    if tb.strict then Hashtbl.replace tb.seen.(i) k ();
    w_int b k
  end

(* Run the arguments' writer once to collect every value of each variable, then key the new ones. *)
let seal tb write =
  write (Buffer.create 16);
  let vals = !tok_vals in
  let all = Array.fold_left (fun acc pool -> List.rev_append pool acc) [] tb.pools in
  tok_add (Array.of_list (List.filter (fun o -> not (fst (search vals o))) (List.sort_uniq compare all)));
  if tb.strict then
    Array.iteri (fun i pool -> List.iter (fun o -> Hashtbl.replace tb.seen.(i) (tok_key o) ()) pool) tb.pools;
  Array.fill tb.pools 0 (Array.length tb.pools) [];
  tb.collecting <- false

(* The value of key [k] in the run's table. *)
let tok_value k =
  let keys = !tok_keys in
  let rec go lo hi =
    if lo >= hi then raise Bad
    else
      let mid = (lo + hi) / 2 in
      if keys.(mid) = k then Obj.obj !tok_vals.(mid) else if k < keys.(mid) then go lo mid else go (mid + 1) hi in
  go 0 (Array.length keys)

let r_var tb i r =
  let k = r_int r in
  if tb.strict && not (Hashtbl.mem tb.seen.(i) k) then raise Bad;
  tok_value k

(* A value of the run's table by its key, whatever call sent it (a functor instance's elements). *)
let r_var_any r = tok_value (r_int r)

(* ---------------------------------------------------------------- frames *)

let max_frame = 32 lsl 20
let trusted = ref false  (* this side is the trusted program *)
let req_in = ref stdin
let rep_out = ref stdout

(* In the trusted program: a reply it refuses (malformed, of a key it did not send, over
   [max_frame]) whose frame it read to its end, so the wire is still in step. The call raises
   [Refused] and the assertion under way fails, whatever the tests do with the exception; the
   oracle keeps its state for the assertions after it (no restart gives the answer a fresh start). *)
exception Refused
let refused = ref false
let refuse () = refused := true; raise Refused

(* What a side does when the wire breaks (the peer died, or wrote a malformed frame): T reports
   the assertion it was in and stops; the oracle exits. Set by each side's start. *)
let broken : (unit -> unit) ref = ref (fun () -> exit 2)
let fail () = !broken (); exit 2

let send kind payload =
  try
    output_char !rep_out kind; output_char !rep_out ' ';
    output_string !rep_out (string_of_int (String.length payload)); output_char !rep_out '\n';
    output_string !rep_out payload; flush !rep_out
  with Sys_error _ -> fail ()

(* The next frame, or None at the end of the input. Its header is read a byte at a time (at most
   24), its length checked before anything is allocated. *)
let read_frame () =
  let ic = !req_in in
  match input_char ic with
  | exception End_of_file -> None
  | kind ->
    let b = Buffer.create 16 in
    let rec header () =
      match input_char ic with
      | '\n' -> ()
      | c when Buffer.length b < 24 -> Buffer.add_char b c; header ()
      | _ -> raise Bad in
    (try
       header ();
       let h = Buffer.contents b in
       if String.length h < 2 || h.[0] <> ' ' then raise Bad;
       match int_of_string_opt (String.sub h 1 (String.length h - 1)) with
       | Some n when n >= 0 && n <= max_frame -> Some (kind, really_input_string ic n)
       | Some n when n > max_frame && !trusted ->
         (* too long to hold: read past it, then refuse it *)
         let chunk = Bytes.create 65536 in
         let left = ref n in
         while !left > 0 do
           let k = min !left 65536 in
           really_input ic chunk 0 k;
           left := !left - k
         done;
         Some ('!', "")
       | _ -> raise Bad
     with Bad | End_of_file | Sys_error _ -> fail ())

(* ---------------------------------------------------------------- calls *)

(* This side's functions the peer may call: invokers reading their arguments and writing their
   result. *)
let table : (reader -> Buffer.t -> unit) array ref = ref [||]
let count = ref 0

let register (f : reader -> Buffer.t -> unit) =
  if !count = Array.length !table then begin
    let t = Array.make (max 8 (2 * !count)) f in
    Array.blit !table 0 t 0 !count;
    table := t
  end;
  !table.(!count) <- f;
  incr count;
  !count - 1

let w_fun b f = w_int b (register f)

(* A closure of the tests' text that the oracle holds too, compiled from the same text (oracle.py,
   `shippable`): sent as its number instead of a handle, so a callback costs no round trip. The
   tests mark it where it is written (`shipped`); it is found again by physical equality. *)
let shipped_fns : (Obj.t * int * int) list ref = ref []

let shipped site j f =
  let recent = List.filteri (fun i _ -> i < 31) !shipped_fns in
  shipped_fns := (Obj.repr f, site, j) :: recent;
  f

let w_fun_at b site o f =
  match List.find_opt (fun (o', s, _) -> o' == o && s = site) !shipped_fns with
  | Some (_, _, j) -> w_int b (- j - 1)
  | None -> w_fun b f

(* Exceptions: Stdlib's that tests name, the prompt's own (set by the generated code), a
   callback's exception carried back to the side that raised it, and anything else as Unnamed
   (which no test can name: this unit's name is random). *)
exception Unnamed
exception Foreign of int  (* in the oracle: an exception the trusted side's closure raised *)

let prompt_exn_w : (Buffer.t -> exn -> bool) ref = ref (fun _ _ -> false)
let prompt_exn_r : (int -> reader -> exn) ref = ref (fun _ _ -> raise Bad)
let raised : exn array ref = ref [||]  (* T: its closures' exceptions, by number *)

let keep_raised e =
  raised := Array.append !raised [| e |];
  Array.length !raised - 1

let encode_exn e =
  let b = Buffer.create 16 in
  (match e with
   | Failure s -> Buffer.add_char b 'F'; w_string b s
   | Invalid_argument s -> Buffer.add_char b 'I'; w_string b s
   | Sys_error s -> Buffer.add_char b 'Y'; w_string b s
   | Not_found -> Buffer.add_char b 'N'
   | Division_by_zero -> Buffer.add_char b 'Z'
   | End_of_file -> Buffer.add_char b 'E'
   | Exit -> Buffer.add_char b 'x'
   | Stack_overflow -> Buffer.add_char b 'S'
   | Out_of_memory -> Buffer.add_char b 'M'
   | Foreign k -> Buffer.add_char b 'K'; w_int b k
   | e ->
     let p = Buffer.create 16 in
     if !prompt_exn_w p e then (Buffer.add_char b 'P'; Buffer.add_buffer b p) else Buffer.add_char b '?');
  Buffer.contents b

let decode_exn ~trusted s =
  let r = reader s in
  let e = match r_byte r with
    | 'F' -> Failure (r_string r)
    | 'I' -> Invalid_argument (r_string r)
    | 'Y' -> Sys_error (r_string r)
    | 'N' -> Not_found
    | 'Z' -> Division_by_zero
    | 'E' -> End_of_file
    | 'x' -> Exit
    | 'S' -> Stack_overflow
    | 'M' -> Out_of_memory
    | 'K' ->
      let k = r_int r in
      if not trusted then Foreign k
      else if k >= 0 && k < Array.length !raised then !raised.(k)
      else raise Bad
    | 'P' -> let k = r_int r in !prompt_exn_r k r
    | '?' -> Unnamed
    | _ -> raise Bad in
  r_end r;
  e


(* Serve one call of the peer's: run the invoker, reply R or X. On the trusted side an exception
   while reading the oracle's arguments is a broken wire; the tests' own exception goes back as
   a number (it is re-raised if the oracle lets it through). *)
let serve_one payload =
  let r = reader payload in
  let h = try r_int r with Bad -> -1 in
  let b = Buffer.create 64 in
  if h < 0 || h >= !count then (if !trusted then (refused := true; send 'X' "?") else fail ())
  else
    match !table.(h) r b with
    | () -> send 'R' (Buffer.contents b)
    | exception Bad when !trusted -> refused := true; send 'X' "?"  (* its arguments: malformed *)
    | exception e ->
      let e = if !trusted then Foreign (keep_raised e) else e in
      send 'X' (encode_exn e)

(* A reply the oracle sent: its whole frame was read, so a malformed one leaves the wire in step
   (only the trusted side waits on replies it did not compute). *)
let rec wait read =
  match read_frame () with
  | None -> fail ()
  | Some ('R', p) ->
    (match let r = reader p in let v = read r in r_end r; v with
     | v -> v
     | exception (Refused as e) -> raise e
     | exception _ -> if !trusted then refuse () else fail ())
  | Some ('X', p) ->
    raise (match decode_exn ~trusted:!trusted p with e -> e | exception _ -> if !trusted then refuse () else fail ())
  | Some ('C', p) -> serve_one p; wait read
  | Some _ -> if !trusted then refuse () else fail ()

(* The oracle says it is initialised before its first call: one that dies before (the answer's
   top level failed) fails every assertion, with no fresh oracle to retry on. *)
let is_ready = ref false
let await_ready () =
  if not !is_ready then (match read_frame () with Some ('Y', "") -> is_ready := true | _ -> fail ())

let call h write read =
  await_ready ();
  let b = Buffer.create 64 in
  w_int b h;
  write b;
  send 'C' (Buffer.contents b);
  wait read

(* A function value of the peer's, as a handle: calls go to the peer. *)
let r_handle r = r_int r

(* React signals an entry point returns stay in the oracle; the trusted program holds a mirror of
   each (a signal of its own, made by `React.S.create`), set to the oracle's value when it arrives
   and again after every later call of an entry point: a signal changes only while the answer's
   code runs, so a mirror holds the oracle's value whenever the tests look. *)
let refreshers : (unit -> unit) list ref = ref []
let on_refresh f = refreshers := f :: !refreshers
let refresh () = List.iter (fun f -> f ()) (List.rev !refreshers)

external fd_in : int -> in_channel = "caml_ml_open_descriptor_in"
external fd_out : int -> out_channel = "caml_ml_open_descriptor_out"

let ignore_sigpipe () = Sys.set_signal Sys.sigpipe Sys.Signal_ignore

(* ---------------------------------------------------------------- the trusted side *)

let results = ref stdout
let start = ref 0
let current = ref (-1)

let emit tag i =
  output_string !results tag; output_char !results ' ';
  output_string !results (string_of_int i); output_char !results '\n';
  flush !results

(* argv: RESULTS_FD REQUESTS_OUT_FD REPLIES_IN_FD START *)
let start_trusted () =
  ignore_sigpipe ();
  trusted := true;
  results := fd_out (int_of_string Sys.argv.(1));
  rep_out := fd_out (int_of_string Sys.argv.(2));
  req_in := fd_in (int_of_string Sys.argv.(3));
  start := int_of_string Sys.argv.(4);
  (* the oracle is gone, or its frames are out of step: the assertion under way is marked and
     nothing after it runs (as when the answer's process dies in plain OCaml; no fresh oracle) *)
  broken := fun () -> (if !is_ready then emit "K" !current else emit "I" 0); exit 0

let check i f =
  if i >= !start then begin
    current := i;
    refused := false;
    emit "S" i;
    (match f () with
     | () when not !refused -> emit "P" i
     | () | exception _ -> emit "F" i);
    current := -1
  end

let finish () = emit "D" 0

(* ---------------------------------------------------------------- the oracle *)

(* argv: REQUESTS_IN_FD REPLIES_OUT_FD. Runs after the answer's initialisation. *)
let serve () =
  ignore_sigpipe ();
  req_in := fd_in (int_of_string Sys.argv.(1));
  rep_out := fd_out (int_of_string Sys.argv.(2));
  broken := (fun () -> exit 2);
  is_ready := true;  (* this side never waits for it *)
  send 'Y' "";
  let rec loop () =
    match read_frame () with
    | None -> exit 0
    | Some ('C', p) -> serve_one p; loop ()
    | Some _ -> exit 2 in
  loop ()
