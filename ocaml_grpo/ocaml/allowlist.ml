(* Which library code a solution reaches, decided on the compiler's typed tree against an
   allowlist (ocaml_grpo/ocaml/allowlist.txt, embedded at build time as Allowlist_data.text).

   Deny by default. Every path the typed tree holds whose head is a compilation unit (a library:
   Stdlib, Base, the grader's own harness, ...) is written canonically, `Stdlib.List.map` for
   `List.map`, `Stdlib.List.map` and `Stdlib__List.map` alike (unit `A__B` is module `A.B`), and
   must be on the list:
   - a value (`Texp_ident`, a `let*` operator): on the list as a value of its module;
   - a whole module, used as a module (`include`, a functor argument, a constraint, a packed
     first-class module, an alias nested in a structure): only modules every value of which is on
     the list (marked `*`); a library functor only when listed (`Make()`), and then any module may
     be its argument (it sees the argument through its parameter's signature and re-exports none
     of its values); a first-class module packed at a listed package type (`S!`);
   - a class: none.
   Exceptions that cannot widen access: `open M` (every use of M's values is a library path,
   checked above) and an alias `module S = String` at the top level or in `let module ... in`
   (uses of S are rewritten to String's paths before the check, so `S.unsafe_get` is denied).
   `external` declarations are denied wherever they are (a structure or a signature). The
   solution's own names never matter: a local module `Obj` or a value `unsafe_total` is its own. *)

open Typedtree

type allowlist = {
  values : (string, unit) Hashtbl.t;  (* "Stdlib.List.map" *)
  whole : (string, unit) Hashtbl.t;  (* modules usable as modules: "Stdlib.List" *)
  functors : (string, unit) Hashtbl.t;  (* "Stdlib.Set.Make" *)
  packages : (string, unit) Hashtbl.t;  (* module types a library module may be packed at *)
}

let words s = List.filter (( <> ) "") (String.split_on_char ' ' (String.concat " " (String.split_on_char '\t' s)))

(* Lines `Module[ *]: name name ...`; `F()` is a functor, `S!` a module type (or a type abbreviating
   one) a library module may be packed at; `#` starts a comment line. *)
let parse text =
  let t = { values = Hashtbl.create 2048; whole = Hashtbl.create 64; functors = Hashtbl.create 16;
            packages = Hashtbl.create 16 } in
  List.iter (fun line ->
      match String.index_opt line ':' with
      | _ when String.length line > 0 && line.[0] = '#' -> ()
      | None -> ()
      | Some i ->
        let head = words (String.sub line 0 i) in
        let names = words (String.sub line (i + 1) (String.length line - i - 1)) in
        let m, is_whole = match head with
          | [m] -> m, false
          | [m; "*"] -> m, true
          | _ -> failwith ("allowlist: bad module header: " ^ line) in
        if is_whole then Hashtbl.replace t.whole m ();
        List.iter (fun n ->
            let strip k = String.sub n 0 (String.length n - k) in
            match n.[0] with
            | 'A'..'Z' when Filename.check_suffix n "()" -> Hashtbl.replace t.functors (m ^ "." ^ strip 2) ()
            | _ when String.length n > 1 && Filename.check_suffix n "!" ->
              Hashtbl.replace t.packages (m ^ "." ^ strip 1) ()
            | 'A'..'Z' -> failwith ("allowlist: a capitalised name is a functor F(): " ^ n)
            | _ -> Hashtbl.replace t.values (m ^ "." ^ n) ()) names)
    (String.split_on_char '\n' text);
  t

let list = lazy (parse Allowlist_data.text)

(* Unit `Stdlib__List` is module `Stdlib.List` (the naming dune and the standard library use). *)
let unit_path name =
  let b = Buffer.create (String.length name) in
  let n = String.length name in
  let i = ref 0 in
  while !i < n do
    if !i + 1 < n && name.[!i] = '_' && name.[!i + 1] = '_' && !i > 0 && !i + 2 < n then begin
      Buffer.add_char b '.'; i := !i + 2 end
    else begin Buffer.add_char b name.[!i]; incr i end
  done;
  Buffer.contents b

(* Every library path the structure reaches that the list does not allow, in tree order. *)
let denied_paths (str : structure) : string list =
  let l = Lazy.force list in
  let denied = ref [] in
  let deny what = if not (List.mem what !denied) then denied := what :: !denied in
  let aliases : (Ident.t, string) Hashtbl.t = Hashtbl.create 8 in
  let rec lib (p : Path.t) = match p with
    | Pident id when Ident.persistent id -> Some (unit_path (Ident.name id))
    | Pident id -> Hashtbl.find_opt aliases id
    | Pdot (q, s) -> Option.map (fun m -> m ^ "." ^ s) (lib q)
    | Papply (f, _) -> Option.map (fun _ -> Path.name p) (lib f) in
  let value p = match lib p with Some n when not (Hashtbl.mem l.values n) -> deny n | _ -> () in
  let whole p = match lib p with Some n when not (Hashtbl.mem l.whole n) -> deny n | _ -> () in
  let rec ident_of me = match me.mod_desc with
    | Tmod_ident (p, _) -> Some p
    | Tmod_constraint (me, _, _, _) -> ident_of me
    | _ -> None in
  (* A scoped alias of a library module: remembered, and not a use of the whole module. *)
  let alias id me = match id, ident_of me with
    | Some id, Some p -> (match lib p with Some n -> Hashtbl.replace aliases id n; true | None -> false)
    | _ -> false in
  let super = Tast_iterator.default_iterator in
  let depth = ref 0 in  (* structures we are inside: aliases are scoped only at the top *)
  let module_expr it me = match me.mod_desc with
    | Tmod_ident (p, _) -> whole p
    | Tmod_apply (f, arg, _) ->
      (match Option.bind (ident_of f) lib with
       | Some n when Hashtbl.mem l.functors n -> if ident_of arg = None then it.Tast_iterator.module_expr it arg
       | _ -> super.module_expr it me)
    | Tmod_structure _ | Tmod_functor _ -> incr depth; super.module_expr it me; decr depth
    | _ -> super.module_expr it me in
  let expr it e = match e.exp_desc with
    | Texp_ident (p, _, _) -> value p
    | Texp_new (p, _, _) -> (match lib p with Some n -> deny n | None -> ()); super.expr it e
    | Texp_letmodule (id, _, _, me, body) ->
      if not (alias id me) then it.module_expr it me;
      it.expr it body
    | Texp_pack me ->
      (* The typer wraps the packed module in a constraint to the package's module type. *)
      let package = match me.mod_desc, (Btype.repr e.exp_type).desc with
        | Tmod_constraint (_, Types.Mty_ident pt, Tmodtype_implicit, _), _ | _, Tpackage (pt, _) -> Some pt
        | _, Tconstr (pt, _, _) -> Some pt  (* a library's abbreviation for a package type *)
        | _ -> None in
      (match Option.bind (ident_of me) lib, package with
       | Some m, Some pt when not (Hashtbl.mem l.whole m) ->
         let at = match lib pt with Some n -> n | None -> Path.name pt in
         if not (Hashtbl.mem l.packages at) then deny (Printf.sprintf "%s(as:%s)" m at)
       | _ -> super.expr it e)
    | _ -> super.expr it e in
  let structure_item it si = match si.str_desc with
    | Tstr_module mb when !depth = 0 && alias mb.mb_id mb.mb_expr -> ()
    | Tstr_primitive _ -> deny "external"
    | _ -> super.structure_item it si in
  let signature_item it si = match si.sig_desc with
    | Tsig_value { val_prim = _ :: _; _ } -> deny "external"
    | _ -> super.signature_item it si in
  let open_declaration it (od : open_declaration) =
    if ident_of od.open_expr = None then super.open_declaration it od in
  let binding_op it (bop : binding_op) = value bop.bop_op_path; super.binding_op it bop in
  let class_expr it ce = (match ce.cl_desc with
      | Tcl_ident (p, _, _) -> (match lib p with Some n -> deny n | None -> ())
      | _ -> ()); super.class_expr it ce in
  let it = { super with module_expr; expr; structure_item; signature_item; open_declaration;
                        binding_op; class_expr } in
  it.structure it str;
  List.rev !denied
