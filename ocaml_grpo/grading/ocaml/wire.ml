(* The wire between the two programs of a grading (ocaml_grpo/oracle.py generates the code that
   uses it; docs/grader.md says why there are two):

   - the trusted program T holds the tests, with each entry point replaced by a stub of the
     prompt's type that asks the oracle; it decides every assertion and reports on a descriptor
     the answer's process never holds;
   - the oracle U holds the answer: it answers calls with values and nothing else, and never holds
     an expected value.

   Both link this unit (under a random name, off the allowlist). Messages are frames
   "KIND LEN\n" + LEN bytes: C (call: a handle, then the arguments), R (the return value), X (an
   exception), Y (U is initialised), F (T's partial applications it dropped), Q and H (T compares
   or hashes values of an abstract type: `serve_query`), M (before a C, R or X: the mutable blocks
   the peer holds that changed since it saw them, `changed_blocks`). Calls go both
   ways: a function value crossing the wire stays
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
let w_ref w b x = w b !x
let w_tag = w_int  (* a constructor's index in the prompt's declaration *)
let w_ptag = w_string  (* a polymorphic variant's tag name *)

(* ---------------------------------------------------------------- reading *)

type reader = { s : string; mutable pos : int }

let reader s = { s; pos = 0 }

let need r n = if n < 0 || n > String.length r.s - r.pos then raise Bad

let at_end r = r.pos = String.length r.s
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
let r_ref rd r = ref (rd r)
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

let keep_new (o : Obj.t) =
  if !kept_count = Array.length !kept_values then begin
    let t = Array.make (max 16 (2 * !kept_count)) (Obj.repr 0) in
    Array.blit !kept_values 0 t 0 !kept_count;
    kept_values := t
  end;
  !kept_values.(!kept_count) <- o;
  incr kept_count;
  !kept_count - 1

let kept k = if k < 0 || k >= !kept_count then raise Bad else Obj.obj !kept_values.(k)

(* In the trusted program: a reply it refuses (malformed, of a value it did not send, over
   [max_frame]) whose frame it read to its end, so the wire is still in step. The call raises
   [Refused] and the assertion under way fails, whatever the tests do with the exception; the
   oracle keeps its state for the assertions after it (no restart gives the answer a fresh start). *)
exception Refused
let refused = ref false
let refuse () = refused := true; raise Refused

(* ---------------------------------------------------------------- mirrors *)

(* A mutable block (an array, bytes, a ref, a record with a mutable field) keeps its identity across
   the wire for the whole run (codecs.py, `Gen.shared`). Each side numbers the blocks it sends first
   (the trusted side even numbers, the oracle odd ones) and keeps, weakly, every block it has sent
   or received by number, so a block that crosses again is the same block on the other side, its
   contents updated in place:
   - `incr_all [a; a]` adds two to one ref in the oracle; a matrix whose rows are one array stays
     so; a result `(a, a)`, or the classic `Array.make n (Array.make n 0)` grid, is one array for
     the tests;
   - the same array passed in two calls is the same array to the answer (a memo keyed on it finds
     it, with what the tests changed in it since); one buffer the answer returns from every call is
     one array for the tests, holding what the last call put in it.
   Written: the number, then 1 and the contents, or 0 where the message already holds them. A
   writer finds its block's number by address: its first shared write in a message promotes what
   is alive to the major heap, which neither program compacts. The key is the position's type
   (only types without variables): a number is only ever one block of one type. The trusted side
   accepts from the oracle a number of its own only for a block it gave it (what an answer can
   hold and change in one program: what it was given), and new numbers of the oracle's in order. *)
let own = ref 1  (* this side's parity: the trusted side 0 *)
let next_own = ref 1
let held = ref (Weak.create 64)  (* number -> the block *)
let held_key = ref (Array.make 64 (-1))
let by_address : (int, int) Hashtbl.t = Hashtbl.create 64  (* where a held block lies -> its number *)
let pruned_at = ref 64
let pending : (int * Obj.t) list ref = ref []  (* received: placed by address once promoted *)
let peer_next = ref 0  (* the peer's next new number (parity 1 - own) *)
let given = ref (Bytes.make 64 '\000')  (* trusted side: its numbers in a message it sent *)

(* this message's: numbers written, blocks read *)
let msg_sent : (int, unit) Hashtbl.t = Hashtbl.create 16
let msg_got : (int, Obj.t) Hashtbl.t = Hashtbl.create 16
let w_promoted = ref false

(* Kept in step (`changed_blocks`): each mirrored type's codec, set by the generated code
   (`mirror_codec`), and the peer's view of each block it holds. *)
let mirror_codecs : (int, (Buffer.t -> Obj.t -> unit) * int array * (reader -> Obj.t) * bool) Hashtbl.t =
  Hashtbl.create 8

(* The peer's view of a block: its bytes (a flat float array's, marshalled: every bit, -0. and nan's
   payload included), or a shallow copy. *)
let view (o : Obj.t) =
  if Obj.tag o = Obj.double_array_tag then Obj.repr (Marshal.to_string o []) else Obj.dup o

let views = ref (Array.make 64 (Obj.repr 0))  (* number -> the peer's view (an int: none) *)
let immediates = ref (Array.make 64 false)  (* number -> its fields are immediates only *)
let viewed = ref (Array.make 64 0)  (* the numbers with a view *)
let viewed_count = ref 0

let grow a n x = if n >= Array.length !a then begin
    let b = Array.make (max (n + 1) (2 * Array.length !a)) x in
    Array.blit !a 0 b 0 (Array.length !a); a := b end

let see n (o : Obj.t) =
  grow views n (Obj.repr 0); grow immediates n false;
  if Obj.is_int !views.(n) then begin
    grow viewed !viewed_count 0;
    !viewed.(!viewed_count) <- n; incr viewed_count;
    !immediates.(n) <- (match Hashtbl.find_opt mirror_codecs !held_key.(n) with Some (_, _, _, i) -> i | None -> false)
  end;
  !views.(n) <- view o

let address (o : Obj.t) : int = (Obj.magic o : int) lor 1  (* an int: a bare pointer would be hashed by contents *)

let ensure n =
  if n >= Weak.length !held then begin
    let size = max (n + 1) (2 * Weak.length !held) in
    let w = Weak.create size in
    Weak.blit !held 0 w 0 (Weak.length !held);
    let k = Array.make size (-1) in
    Array.blit !held_key 0 k 0 (Array.length !held_key);
    held := w; held_key := k
  end

let holding n (o : Obj.t) = match Weak.get !held n with Some v -> v == o | None -> false

let hold n key (o : Obj.t) = ensure n; Weak.set !held n (Some o); !held_key.(n) <- key

(* addresses of blocks that died stay until pruned, when the table has doubled *)
let prune () =
  Hashtbl.filter_map_inplace (fun _ n -> match Weak.get !held n with Some _ -> Some n | None -> None) by_address;
  pruned_at := max 64 (2 * Hashtbl.length by_address)

let promote () =
  Gc.minor ();
  w_promoted := true;
  List.iter (fun (n, o) -> if holding n o then Hashtbl.replace by_address (address o) n) !pending;
  pending := [];
  if Hashtbl.length by_address > !pruned_at then prune ()

let begin_write () = Hashtbl.reset msg_sent; w_promoted := false

(* The number of a value of an abstract type the oracle keeps: the same value, the same number,
   so the trusted side holds one handle for it (`==` holds between two returns of it). Kept
   values never die: an address is never another value's. *)
let kept_at : (int, int) Hashtbl.t = Hashtbl.create 16
let keep v =
  let o = Obj.repr v in
  if Obj.is_block o && not !w_promoted then promote ();
  let a = address o in
  match Hashtbl.find_opt kept_at a with
  | Some k when !kept_values.(k) == o -> k
  | _ -> let k = keep_new o in Hashtbl.replace kept_at a k; k
let begin_read () = Hashtbl.reset msg_got

let w_shared key write b x =
  let o = Obj.repr x in
  if Obj.size o = 0 then (w_int b (-1); write b x)  (* the empty array: one block of every type *)
  else begin
    if not !w_promoted then promote ();
    let a = address o in
    let n = match Hashtbl.find_opt by_address a with
      | Some n when holding n o && !held_key.(n) = key -> n
      | _ ->
        let n = !next_own in
        next_own := n + 2;
        hold n key o;
        Hashtbl.replace by_address a n;
        n in
    w_int b n;
    if Hashtbl.mem msg_sent n then w_char b '\000'
    else (Hashtbl.replace msg_sent n (); w_char b '\001'; write b x)
  end

(* The block read, put into the one held under its number (same kind, same size): a record's
   mutable fields (`muts`; [||]: an array's, bytes' or ref's every one), its others as they were,
   as in one program (a reply that changes one is refused). *)
let copy_into muts (e : Obj.t) (v : Obj.t) =
  let t = Obj.tag e in
  if t <> Obj.tag v || Obj.size e <> Obj.size v then raise Bad;
  let changes i = Array.length muts = 0 || Array.mem i muts in
  if t = Obj.string_tag then begin
    let e : bytes = Obj.obj e and v : bytes = Obj.obj v in
    if Bytes.length e <> Bytes.length v then raise Bad;
    Bytes.blit v 0 e 0 (Bytes.length v)
  end else if t = Obj.double_array_tag then
    for i = 0 to Obj.size e - 1 do
      if changes i then Obj.set_double_field e i (Obj.double_field v i)
      else if Int64.bits_of_float (Obj.double_field e i) <> Int64.bits_of_float (Obj.double_field v i) then raise Bad
    done
  else if t < Obj.no_scan_tag then
    for i = 0 to Obj.size e - 1 do
      if changes i then Obj.set_field e i (Obj.field v i)
      else if compare (Obj.field e i) (Obj.field v i) <> 0 then raise Bad
    done
  else raise Bad

let r_shared key muts read r =
  match r_int r with
  | -1 -> read r
  | n ->
    (match r_char r with
     | '\000' ->
       (match Hashtbl.find_opt msg_got n with
        | Some o when !held_key.(n) = key -> Obj.obj o
        | _ -> raise Bad)  (* not read earlier in this message, whole *)
     | '\001' ->
       let mine = n land 1 = !own in
       if n < 0 || Hashtbl.mem msg_got n then raise Bad;
       (* the trusted side's own: only a block it gave the oracle (one it numbered in a message it
          never sent is not the answer's to name) *)
       if mine && !own = 0 && (n >= Bytes.length !given || Bytes.get !given n = '\000') then raise Bad;
       (* the oracle's new numbers come in order (give or take a message it composed and never sent) *)
       if not mine && !own = 0 && n >= !peer_next + (1 lsl 20) then raise Bad;
       let v = Obj.repr (read r) in
       ensure n;
       let o = match Weak.get !held n with
         | Some e when !held_key.(n) = key -> copy_into muts e v; e
         | Some _ -> raise Bad
         | None -> hold n key v; pending := (n, v) :: !pending; v in  (* (one the tests dropped: anew) *)
       if not mine then peer_next := max !peer_next (n + 2);
       Hashtbl.replace msg_got n o;
       see n o;
       Obj.obj o
     | _ -> raise Bad)

(* Kept in step: a block both sides hold changes between crossings (the answer changes an array it
   keeps in a later call that returns nothing; the tests change one the answer keeps), and one
   program would show the change to the other side at once. Control passes only with a call or a
   reply, so before each one its sender sends (frame M) every block the peer holds that changed
   since the peer last saw it: the peer's view is a shallow copy, taken when the block last
   crossed (a field compared by `==`: a row replaced is a change of the matrix, a row changed in
   place one of the row's own). Each is read as any block that crosses again (`r_shared`: the
   trusted side accepts only its numbers it gave, and only what one program could change). The
   cost: the blocks both hold, compared once per call.

   `mirror_codec`, called by the generated code: the writer, mutable fields and reader of each
   key's type, and whether its fields are immediates only (ints, chars, constant constructors:
   compared by `compare`, in C). *)
let mirror_codec key (w : Buffer.t -> 'a -> unit) muts (r : reader -> 'a) imm =
  Hashtbl.replace mirror_codecs key ((fun b o -> w b (Obj.obj o)), muts, (fun rd -> Obj.repr (r rd)), imm)

let note_seen n = match Weak.get !held n with Some o -> see n o | None -> ()

(* Whether a block changed since the peer's view `s`: its bytes, or each field by `==` (the
   fields of a block of immediates all at once, by `compare`, 20 times faster in the bytecode
   oracle; never a block that may hold a closure or a handle, which `compare` would call on). *)
let differs imm (o : Obj.t) (s : Obj.t) =
  let t = Obj.tag o in
  if t = Obj.string_tag then not (Bytes.equal (Obj.obj o) (Obj.obj s))
  else if t = Obj.double_array_tag then not (String.equal (Obj.obj s) (Marshal.to_string o []))
  else if imm then compare o s <> 0
  else begin
    let d = ref false and i = ref 0 in
    while not !d && !i < Obj.size o do
      d := Obj.field o !i != Obj.field s !i;
      incr i
    done;
    !d
  end

(* Blocks that died stay viewed until a major cycle ends, so a run of calls on fresh arrays would
   compare thousands of dead ones per call: once the views have doubled since the last collection
   and the comparing since it outweighs a collection (a sixteenth of the heap's words), a full one
   (it moves nothing: addresses hold). *)
let live_after = ref 0
let compared = ref 0

(* Frame M's payload ("": nothing changed): each changed block as its key, then as `w_shared`
   writes it. *)
let changed_blocks () =
  if !viewed_count > max 64 (2 * !live_after) && !compared * 16 > (Gc.quick_stat ()).Gc.heap_words then begin
    promote ();  (* the blocks received since this side last wrote one: placed, no longer held here *)
    Gc.full_major ();
    compared := 0;
    live_after := -1
  end;
  compared := !compared + !viewed_count;
  let todo = ref [] and k = ref 0 in
  for i = 0 to !viewed_count - 1 do
    let n = !viewed.(i) in
    match Weak.get !held n with
    | Some o -> if differs !immediates.(n) o !views.(n) then todo := (n, o) :: !todo; !viewed.(!k) <- n; incr k
    | None -> !views.(n) <- Obj.repr 0
  done;
  viewed_count := !k;
  if !live_after < 0 then live_after := !k;
  if !todo = [] then ""
  else begin
    begin_write ();
    let b = Buffer.create 64 in
    List.iter (fun (n, o) ->
        let key = !held_key.(n) in
        match Hashtbl.find_opt mirror_codecs key with
        | Some (w, _, _, _) -> w_int b key; w_shared key w b o
        | None -> failwith "wire: a kept block's type has no codec") (List.sort (fun (a, _) (b, _) -> compare a b) !todo);
    Buffer.contents b
  end

let read_changed p =
  let r = reader p in
  begin_read ();
  while not (at_end r) do
    let key = r_int r in
    match Hashtbl.find_opt mirror_codecs key with
    | Some (_, muts, rd, _) -> ignore (r_shared key muts rd r)
    | None -> raise Bad
  done

(* ---------------------------------------------------------------- type variables *)

(* A value of an entry point's type variable is the value itself on both sides, never a stand-in:
   the trusted program T sends the values of a call's type variables as one [Marshal] blob (the
   oracle U trusts T; T never unmarshals anything U sends), so the answer holds an exact copy,
   sharing included: [compare], [=], [==] among the call's values, [Hashtbl.hash], floats (flat
   float arrays included), [nan] and [-0.] behave as on the tests' own values. U gives a value
   back by naming it, never by its bytes: an immediate as itself (T accepts it only if it sent that
   immediate for that variable), a block as (call, index) of the copy it received (found by
   address: U's copies are promoted to the major heap and the heap is never compacted), a float
   U boxed itself (read from a flat float array) by its bits (accepted only if T sent that float,
   bit for bit, for that variable). So T gets back its own objects, physically: a dedup by [==] or a returned [ref]
   is the tests' own. A closure among the values crosses as a closure of U's that nothing can
   call (the answer cannot call a value of type ['a]): [compare] raises on it and [==] tells two
   apart, as in OCaml; its hash is not the tests' (OCaml hashes code addresses).

   A value is accepted back only where the trusted program's own types make it the same type as
   where it was sent: each (call, variable) is a class, and a value goes back only to a position
   of its class (else the int 1 sent for ['a] could come back as ['b = bool]). Classes are merged
   only by the trusted program's typing: a handle it read at type [('X, i) cell] and passes back
   at type [('Y, j) cell] makes (X, i) and (Y, j) one class (a handle carries its parameters'
   classes; the tests cannot build one). A functor instance's calls share one table: its element
   type is one type. *)
module type TOKEN = sig
  type t
  val w : Buffer.t -> t -> unit
  val r : reader -> t
end

(* ---- classes: the (call, variable) pairs the trusted program's types make one type (only for
   problems whose values come back in later calls; a call of any other problem is a class apiece,
   its tables dropped with it) *)

let parent = ref (Array.make 64 0)
let nclasses = ref 0
(* What U may give back by value: an immediate T sent, or the bits of a float T sent. *)
type atom = Imm of int | Flt of int64

let atom_of (o : Obj.t) =
  if Obj.is_int o then Some (Imm (Obj.obj o))
  else if Obj.tag o = Obj.double_tag then Some (Flt (Int64.bits_of_float (Obj.obj o)))
  else None

let class_imms : (int, (atom, unit) Hashtbl.t) Hashtbl.t = Hashtbl.create 64  (* root -> atoms sent *)

let new_class () =
  if !nclasses = Array.length !parent then begin
    let a = Array.make (2 * !nclasses) 0 in
    Array.blit !parent 0 a 0 !nclasses;
    parent := a
  end;
  !parent.(!nclasses) <- !nclasses;
  incr nclasses;
  !nclasses - 1

let rec find n = let p = !parent.(n) in if p = n then n else (let r = find p in !parent.(n) <- r; r)

let imms_of root = match Hashtbl.find_opt class_imms root with
  | Some h -> h
  | None -> let h = Hashtbl.create 8 in Hashtbl.replace class_imms root h; h

let union a b =
  let a = find a and b = find b in
  if a <> b then begin
    let a, b = if Hashtbl.length (imms_of a) >= Hashtbl.length (imms_of b) then a, b else b, a in
    Hashtbl.iter (fun n () -> Hashtbl.replace (imms_of a) n ()) (imms_of b);
    Hashtbl.remove class_imms b;
    !parent.(b) <- a
  end

(* ---- the trusted side's table of what it sent *)

type sent = {
  id : int;  (* the call's number: U names a value by (id, index) *)
  strict : bool;  (* its values never come back after the call *)
  nodes : int array;  (* each variable's class (not strict) *)
  mutable imms : (int * atom, unit) Hashtbl.t option;  (* (variable, atom) sent (strict), built on first need *)
  mutable vals : Obj.t array;
  mutable vars : int array;  (* the variable each value was sent for *)
  mutable n : int;
  mutable collecting : bool;
  mutable cursor : int;  (* the writing pass's next index *)
  mutable fresh : Obj.t list;  (* the collecting pass's values, newest first *)
}

let calls = ref 0
let registry : (int, sent) Hashtbl.t = Hashtbl.create 16  (* the calls whose values may come back later *)

let new_sent strict =
  incr calls;
  let tb = { id = !calls; strict; nodes = (if strict then [||] else Array.init 8 (fun _ -> new_class ()));
             imms = None; vals = [||]; vars = [||]; n = 0;
             collecting = false; cursor = 0; fresh = [] } in
  if not strict then Hashtbl.replace registry tb.id tb;
  tb

(* A call's table. [strict]: its values never come back after it; else (a problem with handles
   or signals) it is kept, and found again by its number. *)
let tokens _nvars strict = new_sent strict

(* A functor instance's table: all its calls' element values are of one type. *)
let instance_table () = new_sent true

(* Handles: the classes of a handle's parameters where it was read, merged with those where it
   is written back ([-1]: a parameter that is not a variable of the call). *)
let node tb j = if j < 0 || tb.strict then -1 else tb.nodes.(j)
let link tb (ns : int array) (js : int array) =
  if not tb.strict then
    Array.iteri (fun p n -> if n >= 0 && p < Array.length js && js.(p) >= 0 then union n tb.nodes.(js.(p))) ns

let append tb o i =
  if tb.n = Array.length tb.vals then begin
    let m = max 16 (2 * tb.n) in
    let v = Array.make m (Obj.repr 0) and w = Array.make m 0 in
    Array.blit tb.vals 0 v 0 tb.n; Array.blit tb.vars 0 w 0 tb.n;
    tb.vals <- v; tb.vars <- w
  end;
  tb.vals.(tb.n) <- o; tb.vars.(tb.n) <- i; tb.n <- tb.n + 1;
  match atom_of o with
  | None -> ()
  | Some a when tb.strict -> (match tb.imms with Some h -> Hashtbl.replace h (i, a) () | None -> ())
  | Some a -> Hashtbl.replace (imms_of (find tb.nodes.(i))) a ()

let sent_atom tb i a =
  if tb.strict then begin
    let h = match tb.imms with
      | Some h -> h
      | None ->
        let h = Hashtbl.create 64 in
        for k = 0 to tb.n - 1 do
          match atom_of tb.vals.(k) with Some a -> Hashtbl.replace h (tb.vars.(k), a) () | None -> ()
        done;
        tb.imms <- Some h;
        h in
    Hashtbl.mem h (i, a)
  end
  else Hashtbl.mem (imms_of (find tb.nodes.(i))) a

(* Both passes of a writer visit the values in the same order: the first collects them, the
   second writes each one's index. *)
let w_var tb i b v =
  let o = Obj.repr v in
  if tb.collecting then (append tb o i; tb.fresh <- o :: tb.fresh)
  else begin w_int b tb.cursor; tb.cursor <- tb.cursor + 1 end

(* Closures cannot be marshalled (nor run in U): each one among the values is replaced by a
   marker naming it, and U puts a closure of its own in its place (the same for the same one).
   So are the handles below. *)
let marker = "\000grader-closure\000"
(* Each closure's number, found by address (promoted first: `promote`; held here, so never another's). *)
let closures : Obj.t array ref = ref [||]
let closure_count = ref 0
let closure_at : (int, int) Hashtbl.t = Hashtbl.create 64

let closure_number o =
  match Hashtbl.find_opt closure_at (address o) with
  | Some k when !closures.(k) == o -> k
  | _ ->
    if !closure_count = Array.length !closures then begin
      let a = Array.make (max 64 (2 * !closure_count)) (Obj.repr 0) in
      Array.blit !closures 0 a 0 !closure_count;
      closures := a
    end;
    let k = !closure_count in
    !closures.(k) <- o;
    incr closure_count;
    Hashtbl.replace closure_at (address o) k;
    k

(* The trusted side's handles on values of an abstract type are custom blocks (handles.c) that
   Marshal cannot write: among the values, each crosses as a marker with its number, which U keeps
   as it is (the answer cannot look inside a value of a type variable, and gives it back by name). *)
let handle_marker = "\000grader-handle\000"
let handle_ops = ref 0n  (* handles.c's operations, set by the trusted program's handle runtime *)

let rec without_closures depth o =
  if depth > 10_000 then raise Refused;
  if Obj.is_int o then o
  else
    let t = Obj.tag o in
    if t = Obj.closure_tag || t = Obj.infix_tag then Obj.repr (marker, closure_number o)
    else if t = Obj.custom_tag && !handle_ops <> 0n && Obj.raw_field o 0 = !handle_ops then
      Obj.repr (handle_marker, Nativeint.to_int (Obj.raw_field o 1))
    (* a forced lazy value: its value (compare, hash and Marshal look through it too); a block made
       with that tag here could be short-circuited by the GC before its field is set *)
    else if t = Obj.forward_tag then without_closures depth (Obj.field o 0)
    (* an unforced one: copied like any block, its closure a marker (the answer cannot force a
       value of a type variable; the tests force their own) *)
    else if t >= Obj.no_scan_tag || t = Obj.object_tag then o
    else begin
      let c = Obj.new_block t (Obj.size o) in
      for k = 0 to Obj.size o - 1 do Obj.set_field c k (without_closures (depth + 1) (Obj.field o k)) done;
      c
    end

(* The values of this frame, then the frame: [write] runs twice. *)
let w_vals tb (write : Buffer.t -> unit) (b : Buffer.t) =
  let base = tb.n in
  tb.collecting <- true; tb.fresh <- [];
  begin_write ();  (* each pass numbers the shared blocks afresh *)
  (match write (Buffer.create 16) with
   | () -> tb.collecting <- false
   | exception e -> tb.collecting <- false; raise e);
  (* a list, never an array: an array whose first value is a float would be made flat, and its
     floats read back as fresh boxes *)
  let news = List.rev tb.fresh in
  tb.fresh <- [];
  let blob =  (* 'P': plain; 'C': closures replaced by markers *)
    if news = [] then ""
    else match Marshal.to_string news [] with
      | s -> "P" ^ s
      | exception Invalid_argument _ ->
        Gc.minor ();  (* the closures' addresses hold from here (closure_number) *)
        "C" ^ Marshal.to_string (List.map (without_closures 0) news) [] in
  w_int b tb.id; w_string b blob;
  tb.cursor <- base;
  begin_write ();
  write b

(* A value U names for variable [i]: one T sent, or a float U boxed from a sent float's bits. *)
let r_var tb i r =
  let here = if tb.strict then -1 else find tb.nodes.(i) in
  match r_byte r with
  | '\000' ->
    let n = r_int r in
    if sent_atom tb i (Imm n) then Obj.obj (Obj.repr n) else raise Bad
  | '\001' ->
    let c = r_int r in
    let k = r_int r in
    let t = if c = tb.id then tb else match Hashtbl.find_opt registry c with
        | Some t when not tb.strict && not t.strict -> t | _ -> raise Bad in
    if k < 0 || k >= t.n || Obj.is_int t.vals.(k)
       || (if tb.strict then t.vars.(k) <> i else find t.nodes.(t.vars.(k)) <> here) then raise Bad;
    Obj.obj t.vals.(k)
  | '\002' ->  (* a float U boxed itself: only one T sent, bit for bit (nan's payload included) *)
    let f = r_float r in
    if sent_atom tb i (Flt (Int64.bits_of_float f)) then Obj.obj (Obj.repr f) else raise Bad
  | _ -> raise Bad

(* ---- the oracle's copies *)

type copies = { mutable items : Obj.t array; mutable len : int }  (* never a flat float array *)
let got : (int, copies) Hashtbl.t = Hashtbl.create 16  (* call -> its values *)
let reading = ref (-1)  (* the call of the frame being read *)
let by_address : (int, int * int) Hashtbl.t = Hashtbl.create 64  (* address -> (call, index) *)
let closures_of_t : (int, Obj.t) Hashtbl.t = Hashtbl.create 8

(* Where a block lies (`address`): U's copies are in the major heap, which is never compacted. *)

let u_closure k =
  match Hashtbl.find_opt closures_of_t k with
  | Some c -> c
  | None -> let c = Obj.repr (fun () -> ignore k) in Hashtbl.replace closures_of_t k c; c

let rec put_closures depth o =
  if depth <= 10_000 && not (Obj.is_int o) && Obj.tag o < Obj.no_scan_tag && Obj.tag o <> Obj.closure_tag then
    for k = 0 to Obj.size o - 1 do
      let f = Obj.field o k in
      match (Obj.obj f : Obj.t) with
      | _ when not (Obj.is_int f) && Obj.tag f = 0 && Obj.size f = 2 && Obj.is_block (Obj.field f 0)
                 && Obj.tag (Obj.field f 0) = Obj.string_tag && (Obj.obj (Obj.field f 0) : string) = marker ->
        Obj.set_field o k (u_closure (Obj.obj (Obj.field f 1)))
      | _ -> put_closures (depth + 1) f
    done

let r_vals r =
  let c = r_int r in
  let blob = r_string r in
  reading := c;
  if blob <> "" then begin
    let news : Obj.t list = Marshal.from_string blob 1 in
    if blob.[0] = 'C' then put_closures 0 (Obj.repr news);
    Gc.minor ();  (* the copies are promoted: their addresses hold from now on *)
    let cell = match Hashtbl.find_opt got c with
      | Some cell -> cell
      | None -> let cell = { items = Array.make 16 (Obj.repr 0); len = 0 } in Hashtbl.replace got c cell; cell in
    List.iter (fun o ->
        if cell.len = Array.length cell.items then begin
          let a = Array.make (2 * cell.len) (Obj.repr 0) in
          Array.blit cell.items 0 a 0 cell.len;
          cell.items <- a
        end;
        cell.items.(cell.len) <- o;
        if Obj.is_block o then Hashtbl.add by_address (address o) (c, cell.len);
        cell.len <- cell.len + 1) news
  end

let u_value k =
  match Hashtbl.find_opt got !reading with
  | Some cell when k >= 0 && k < cell.len -> cell.items.(k)
  | _ -> raise Bad

let u_write b (o : Obj.t) =
  if Obj.is_int o then (Buffer.add_char b '\000'; w_int b (Obj.obj o))
  else
    match List.find_opt (fun (c, k) -> match Hashtbl.find_opt got c with
        | Some cell -> k < cell.len && cell.items.(k) == o | None -> false)
        (Hashtbl.find_all by_address (address o)) with
    | Some (c, k) -> Buffer.add_char b '\001'; w_int b c; w_int b k
    | None when Obj.tag o = Obj.double_tag -> Buffer.add_char b '\002'; w_float b (Obj.obj o)
    | None -> Buffer.add_char b '\003'

module Tok : TOKEN = struct
  type t = Obj.t
  let w = u_write
  let r r = u_value (r_int r)
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

(* ---------------------------------------------------------------- frames *)

let max_frame = 32 lsl 20
let trusted = ref false  (* this side is the trusted program *)
let req_in = ref stdin
let rep_out = ref stdout

(* What a side does when the wire breaks (the peer died, or wrote a malformed frame): T reports
   the assertion it was in and stops; the oracle exits. Set by each side's start. *)
let broken : (unit -> unit) ref = ref (fun () -> exit 2)
let fail () = !broken (); exit 2

(* The trusted side's numbers in a message it sends are given to the oracle from then on. *)
let mark_given () =
  if !own = 0 then
    Hashtbl.iter (fun n () ->
        if n >= Bytes.length !given then begin
          let g = Bytes.make (max (n + 1) (2 * Bytes.length !given)) '\000' in
          Bytes.blit !given 0 g 0 (Bytes.length !given);
          given := g
        end;
        Bytes.set !given n '\001') msg_sent

let send_frame kind payload =
  try
    output_char !rep_out kind; output_char !rep_out ' ';
    output_string !rep_out (string_of_int (String.length payload)); output_char !rep_out '\n';
    output_string !rep_out payload; flush !rep_out
  with Sys_error _ -> fail ()

let send kind payload =
  if kind = 'C' || kind = 'R' then mark_given ();  (* composed since begin_write: values *)
  send_frame kind payload

let numbers_sent () = Hashtbl.fold (fun n () l -> n :: l) msg_sent []

(* A call or a reply (C, R, X): first the blocks the peer holds that changed since it saw them
   (frame M, `changed_blocks`), then the frame; the peer has now seen what crossed in either. *)
let send_synced kind payload =
  let sent = if kind = 'X' then [] else (mark_given (); numbers_sent ()) in
  let m = if !viewed_count = 0 then "" else changed_blocks () in
  let sent = if m = "" then sent else (mark_given (); numbers_sent () @ sent) in
  if m <> "" then send_frame 'M' m;
  send_frame kind payload;
  List.iter note_seen sent

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

(* The oracle: closures the trusted side dropped (`prefix`). Their numbers are never used again. *)
let drop payload =
  let r = reader payload in
  let dead _ _ = raise Bad in
  List.iter (fun h -> if h >= 0 && h < !count then !table.(h) <- dead) (r_list r_int r)

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
   (* a failed `assert` or an incomplete match, in the answer or in a test closure shipped to the
      oracle: the tests can name them (`with Assert_failure _`), as in one program *)
   | Assert_failure (f, l, c) -> Buffer.add_char b 'A'; w_string b f; w_int b l; w_int b c
   | Match_failure (f, l, c) -> Buffer.add_char b 'm'; w_string b f; w_int b l; w_int b c
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
    | 'A' -> let f = r_string r in let l = r_int r in Assert_failure (f, l, r_int r)
    | 'm' -> let f = r_string r in let l = r_int r in Match_failure (f, l, r_int r)
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
  if h < 0 || h >= !count then (if !trusted then (refused := true; send_synced 'X' "?") else fail ())
  else
    match begin_read (); !table.(h) r b with
    | () -> send_synced 'R' (Buffer.contents b)
    | exception Bad when !trusted -> refused := true; send_synced 'X' "?"  (* its arguments: malformed *)
    | exception e ->
      let e = if !trusted then Foreign (keep_raised e) else e in
      send_synced 'X' (encode_exn e)

(* Values of an abstract type compared or hashed by the tests (handles.c, in the trusted program):
   the oracle compares or hashes the values themselves. Q: two numbers; the reply is the total
   order's result and whether <, = and > hold (none of them: unordered, as with nan). H: a number;
   the reply is the value's hash. An exception (a closure inside: `compare: functional value`)
   goes back as any call's. *)
let serve_query kind payload =
  let r = reader payload in
  let b = Buffer.create 16 in
  match kind with
  | 'Q' ->
    let x : Obj.t = (try kept (r_int r) with Bad -> fail ()) in
    let y : Obj.t = (try kept (r_int r) with Bad -> fail ()) in
    (match compare x y, x < y, x = y, x > y with
     | c, lt, eq, gt ->
       w_int b c;
       Buffer.add_char b (Char.chr ((if lt then 1 else 0) lor (if eq then 2 else 0) lor (if gt then 4 else 0)));
       send 'R' (Buffer.contents b)
     | exception e -> send 'X' (encode_exn e))
  | _ ->
    let x : Obj.t = (try kept (r_int r) with Bad -> fail ()) in
    w_int b (Hashtbl.hash x); send 'R' (Buffer.contents b)

(* The trusted side: a reply to Q or H that is not the value (handles.c hands it over; it never
   returns): the exception it carries, else refused. *)
let query_reply kind payload =
  if Char.chr kind <> 'X' then refuse ();
  raise (match decode_exn ~trusted:true payload with e -> e | exception _ -> refuse ())

(* The trusted side notes, once a run, that a call of the answer's returned a value: an answer
   whose calls only raise or never return is a stub, whatever its text (a metric, never credit). *)
let on_return = ref ignore

(* A reply the oracle sent: its whole frame was read, so a malformed one leaves the wire in step
   (only the trusted side waits on replies it did not compute). *)
let rec wait read =
  match read_frame () with
  | None -> fail ()
  | Some ('R', p) ->
    (match let r = reader p in begin_read (); let v = read r in r_end r; v with
     | v -> !on_return (); v
     | exception (Refused as e) -> raise e
     | exception _ -> if !trusted then refuse () else fail ())
  | Some ('X', p) ->
    raise (match decode_exn ~trusted:!trusted p with e -> e | exception _ -> if !trusted then refuse () else fail ())
  | Some ('C', p) -> serve_one p; wait read
  | Some ('M', p) -> (try read_changed p with _ -> if !trusted then refused := true else fail ()); wait read
  | Some ('F', p) when not !trusted -> (try drop p with Bad -> fail ()); wait read
  | Some (('Q' | 'H') as k, p) when not !trusted -> serve_query k p; wait read
  | Some _ -> if !trusted then refuse () else fail ()

(* The oracle says it is initialised before its first call: one that dies before (the answer's
   top level failed) fails every assertion, with no fresh oracle to retry on. *)
let is_ready = ref false
(* With it, the arity of each entry point as the oracle bound it (`closure_arity`; 0 where not a
   staged one): how many arguments it takes before its code runs. *)
let entry_arity : int array ref = ref [||]
let await_ready () =
  if not !is_ready then
    match read_frame () with
    | Some ('Y', p) ->
      (match let r = reader p in let a = r_array r_int r in r_end r; a with
       | a -> entry_arity := a; is_ready := true
       | exception Bad -> fail ())
    | _ -> fail ()

(* The trusted side's handles of partial applications it no longer holds (`prefix`), told to the
   oracle before its next call, which drops the closures they stand for. *)
let freed : int list ref = ref []

let call h write read =
  await_ready ();
  (match !freed with
   | [] -> ()
   | hs -> freed := []; let b = Buffer.create 64 in w_list w_int b hs; send 'F' (Buffer.contents b));
  let b = Buffer.create 64 in
  w_int b h;
  begin_write ();
  write b;
  send_synced 'C' (Buffer.contents b);
  wait read

(* A partial application of an entry point in the tests (`let triple = scale 3`): it happens in
   the oracle once, which leaves the answer's closure there as a handle; later calls go to that
   closure (oracle.py, `_staged`). It happens where the tests make it when the answer's code runs
   there (`eager`), else at the first call through it (an application short of a closure's arity
   runs nothing, in one program too). `h`: -1 until made; `left`: the arity of the closure made. *)
type prefix = { mutable h : int; mutable left : int; mutable held : string }

let prefix () =
  let p = { h = -1; left = 0; held = "" } in
  Gc.finalise (fun p -> if p.h >= 0 then freed := p.h :: !freed) p;
  p

let rec deepest (ps : prefix array) i = if i < 0 || ps.(i).h >= 0 then i else deepest ps (i - 1)

(* What a prefix made in the oracle holds copies of (values of type variables, oracle.py
   `_copied`), marshalled when it is made, closures as their code and environment, the tests'
   handles (which Marshal cannot write) by their numbers ("": nothing to watch). A call through it
   after the tests changed one of them is refused: the oracle's copy no longer is the tests'
   value, and no grade may rest on the difference. A value that cannot be written even so (a
   handle inside a closure's environment, a cycle, a value too large to walk) is refused at every
   call through the prefix: unwatched, a stale copy could grade. *)
let unwatchable = "\000unwatchable"
let handles_as_numbers v =
  let budget = ref 1_000_000 in
  let rec walk o =
    decr budget;
    if !budget < 0 then raise Exit;
    if Obj.is_int o then o
    else
      let t = Obj.tag o in
      if t = Obj.custom_tag && !handle_ops <> 0n && Obj.raw_field o 0 = !handle_ops then
        Obj.repr (handle_marker, Nativeint.to_int (Obj.raw_field o 1))
      else if t = Obj.forward_tag then walk (Obj.field o 0)
      else if t >= Obj.no_scan_tag || t = Obj.closure_tag || t = Obj.infix_tag || t = Obj.object_tag then o
      else begin
        let c = Obj.new_block t (Obj.size o) in
        for k = 0 to Obj.size o - 1 do Obj.set_field c k (walk (Obj.field o k)) done;
        c
      end in
  walk (Obj.repr v)
let snapshot v =
  try Marshal.to_string v [Marshal.Closures] with _ ->
    try Marshal.to_string (handles_as_numbers v) [Marshal.Closures] with _ -> unwatchable
let no_snapshot () = ""
let still_held (ps : prefix array) (snaps : (unit -> string) array) d =
  if d >= 0 && ps.(d).held <> "" && (ps.(d).held == unwatchable || snaps.(d) () <> ps.(d).held) then refuse ()

(* The tests applied argument s (the last of `ps`, short of the last argument): when that saturates
   the closure the oracle holds (the entry point's own, or the deepest prefix made), the answer's
   code runs now, as in one program (`scale 0` raises here, a table is built once here), and the
   prefixes on the way are made; else nothing runs yet. An arity the oracle did not say is 0:
   every application is then made at once (never wrong, only slower). *)
let eager frame snaps k (ps : prefix array) (ws : (Buffer.t -> unit) array) =
  await_ready ();
  let s = Array.length ps - 1 in
  let d = deepest ps (s - 1) in
  let left = if d >= 0 then ps.(d).left else if k < Array.length !entry_arity then !entry_arity.(k) else 0 in
  if left <= s - d then begin
    still_held ps snaps d;
    call (if d < 0 then k else ps.(d).h) (frame (fun b -> for i = d + 1 to s do ws.(i) b done))
      (fun r -> for i = d + 1 to s do ps.(i).h <- r_int r; ps.(i).held <- snaps.(i) () done; ps.(s).left <- r_int r)
  end

(* A total call through the prefixes `ps` of entry point `k` (ps.(i): its closure once arguments 0
   to i are applied): from the deepest one the oracle holds, with the arguments after it; the
   oracle replies with a handle for each prefix it made on the way, then the result. `keep`:
   whether those are kept (not where a prefix would hold a copy of a value of a type variable:
   oracle.py, `_copied`; they are dropped at once). For `eager` and here, `frame`: how a frame's
   arguments are written (with an entry point's type variables, after the values of this
   application's table: `w_vals tb`, one table for the chain, as one program fixes the variables
   of a partial application once); `snaps`: each prefix's `snapshot`. *)
let call_staged frame snaps keep k (ps : prefix array) (ws : (Buffer.t -> unit) array) read =
  let n = Array.length ws in
  let d = deepest ps (n - 2) in
  still_held ps snaps d;
  call (if d < 0 then k else ps.(d).h) (frame (fun b -> for i = d + 1 to n - 1 do ws.(i) b done))
    (fun r -> for i = d + 1 to n - 2 do let h = r_int r in if keep then ps.(i).h <- h else freed := h :: !freed done;
             read r)

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

(* The trusted side's note, for a metric (never credit), of whether an answer's calls give back
   one value whatever their arguments (a constant answer: `let power b e = 1024`). Each entry
   point's first call that returned keeps its arguments and its result (with the arguments after
   it where it changed them), marshalled; a later call that gave back something else is
   noted once (`V`), one given other arguments too (`A`). A value Marshal cannot write (a
   closure, a handle) counts as given back different: never a constant by mistake that way. *)
let first_calls : (int, string * string) Hashtbl.t = Hashtbl.create 8
let calls_varied = ref false
let args_varied = ref false
(* the calls noted in a run: a constant shows in its first few, and marshalling every call of a
   long test (a million-element list each time) would take its CPU from the answer's tests *)
let notes_left = ref 32
let noted k args f =
  if !calls_varied || !notes_left <= 0 then f ()
  else begin
    decr notes_left;
    let write x = try Some (Marshal.to_string x []) with _ -> None in
    let before = write args in
    let v = f () in
    (* the result, and the arguments after the call where it changed them *)
    let back = if write args = before then write (Some v) else write (v, args) in
    (match before, back with
     | Some a, Some back ->
       (match Hashtbl.find_opt first_calls k with
        | None -> Hashtbl.replace first_calls k (a, back)
        | Some (a0, back0) ->
          if back <> back0 then (calls_varied := true; Hashtbl.reset first_calls; emit "V" 0)
          else if a <> a0 && not !args_varied then (args_varied := true; emit "A" 0))
     | _ -> calls_varied := true; Hashtbl.reset first_calls; emit "V" 0);
    v
  end

(* argv: RESULTS_FD REQUESTS_OUT_FD REPLIES_IN_FD START *)
let start_trusted () =
  ignore_sigpipe ();
  trusted := true;
  results := fd_out (int_of_string Sys.argv.(1));
  rep_out := fd_out (int_of_string Sys.argv.(2));
  req_in := fd_in (int_of_string Sys.argv.(3));
  start := int_of_string Sys.argv.(4);
  own := 0; next_own := 0; peer_next := 1;
  (* never compacted: a frame's shared blocks are found by address (w_shared) *)
  Gc.set { (Gc.get ()) with Gc.max_overhead = 1_000_000 };
  on_return := (fun () -> emit "R" 0; on_return := ignore);
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

(* How many arguments a closure of the oracle's (bytecode) takes before its code runs: a function
   of several parameters starts with GRAB (their number less one), found by the first code word of
   a function known to take two. A partial application's closure reads as 1 (it may take more:
   the trusted side then makes the next prefix at once, which is never wrong). *)
let arity_probe x y = x + y
let code_word f = Obj.raw_field (Obj.field (Obj.repr f) 0) 0
let grab_code = Nativeint.logand (code_word arity_probe) 0xFFFFFFFFn
let closure_arity f =
  let o = Obj.repr f in
  if Obj.is_int o || (Obj.tag o <> Obj.closure_tag && Obj.tag o <> Obj.infix_tag) then 0
  else
    let w = code_word o in
    if Nativeint.logand w 0xFFFFFFFFn = grab_code then Nativeint.to_int (Nativeint.shift_right_logical w 32) + 1
    else 1

(* Each entry point's arity (0: not staged), told to the trusted side when ready; appended in order
   by the generated code. *)
let staged_arity : int list ref = ref []

(* argv: REQUESTS_IN_FD REPLIES_OUT_FD. Runs after the answer's initialisation. *)
let serve () =
  ignore_sigpipe ();
  req_in := fd_in (int_of_string Sys.argv.(1));
  rep_out := fd_out (int_of_string Sys.argv.(2));
  broken := (fun () -> exit 2);
  own := 1; next_own := 1; peer_next := 0;
  (* never compacted: the copies of the trusted side's values keep their addresses (r_vals) *)
  Gc.set { (Gc.get ()) with Gc.max_overhead = 1_000_000 };
  is_ready := true;  (* this side never waits for it *)
  let b = Buffer.create 16 in
  w_array w_int b (Array.of_list (List.rev !staged_arity));
  send 'Y' (Buffer.contents b);
  let rec loop () =
    match read_frame () with
    | None -> exit 0
    | Some ('C', p) -> serve_one p; loop ()
    | Some ('M', p) -> (try read_changed p with _ -> exit 2); loop ()
    | Some ('F', p) -> (try drop p with Bad -> exit 2); loop ()
    | Some (('Q' | 'H') as k, p) -> serve_query k p; loop ()
    | Some _ -> exit 2 in
  loop ()
