(* Which library code a solution reaches, decided on the compiler's typed tree against an
   allowlist (ocaml_grpo/ocaml/allowlist.txt, embedded at build time as Allowlist_data.text).

   Deny by default, decided by what the compiler resolved (denied_paths below says how):
   - a value: by its path when that is a library path (`Stdlib.List.map`, however spelled:
     `List.map`, `Stdlib__List.map`), and by its identity (the declaration the compiler links it
     to) however it was reached: aliases at any depth, an include in the answer's own module, a
     functor's result, a module seen through a signature (a functor's argument, a constraint, a
     packed first-class module: each value of that signature stands for the source's);
   - a library functor only when listed (`Make()`), and then any module may be its argument;
   - a class of a library: none; `external` declarations: none, wherever they are;
   - attributes: only those that change neither representations nor what the type checker
     trusts (harmless_attributes); `[@@unboxed]`, `[@@immediate]`, `[@untagged]` are denied.
   Aliasing, including or opening a library module reaches nothing by itself. The solution's own
   names never matter: a local module `Obj` or a value `unsafe_total` is its own. *)

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

(* Attributes are denied by default too: some change a value's representation or what the type
   checker trusts ([@@unboxed] 101 wrappers deep reads a flat float array as pointers in 4.13,
   [@@immediate] asserts what the checker cannot see). These change neither: *)
let harmless_attributes = [
  "warning"; "warnerror"; "alert"; "deprecated"; "deprecated_mutable"; "doc"; "text"; "inline"; "inlined";
  "tailcall"; "specialise"; "specialised"; "unrolled"; "local"; "explicit_arity"; "warn_on_literal_pattern";
  "ppwarning"; "boxed"; "ocaml.afl_inst_ratio" ]

let attribute_allowed name =
  let bare = if String.length name > 6 && String.sub name 0 6 = "ocaml." then String.sub name 6 (String.length name - 6)
    else name in
  List.mem bare harmless_attributes

let denied_attributes (str : structure) deny =
  let super = Ast_iterator.default_iterator in
  let attribute it (a : Parsetree.attribute) =
    (* `#default` and the like are markers the untyping adds (no source attribute can be named so) *)
    let name = a.attr_name.txt in
    if not (attribute_allowed name || (name <> "" && name.[0] = '#')) then deny ("attribute:" ^ name);
    super.attribute it a in
  let it = { super with attribute } in
  it.structure it (Untypeast.untype_structure str)

(* A typed tree read from a .cmt holds only environment summaries (the ocamlc path): the tool sets
   this to rebuild them (Envaux) before looking anything up. *)
let real_env : (Env.t -> Env.t) ref = ref (fun env -> env)

(* The signature a module type stands for (aliases and module type names followed). *)
let rec signature_of env mty =
  match Mtype.scrape env mty with
  | Types.Mty_signature sg -> Some sg
  | Types.Mty_alias p -> (try signature_of env (Env.find_module p env).md_type with Not_found -> None)
  | _ -> None

(* Every library path the structure reaches that the list does not allow, in tree order.

   A value is judged by what the compiler resolved, not by how it is spelled: by its path when
   that is a library path (`Stdlib.List.map`), and by its identity (the declaration the compiler
   links it to, `val_uid`) however it was reached: through aliases at any depth, the answer's own
   module that includes a library one, a functor's result. A module is not judged as a whole:
   aliasing, including or opening a library module reaches nothing by itself; where a module is
   seen through a signature (a functor's argument, a constraint, a packed first-class module),
   each value of that signature is judged by the identity of the value it stands for. The
   structure's own top-level values are judged the same way (what the tests' entry points bind). *)
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
  let env_cache = ref [] in
  let real env =  (* rebuilt once per environment seen *)
    match List.assq_opt env !env_cache with
    | Some e -> e
    | None -> let e = (try !real_env env with _ -> env) in env_cache := (env, e) :: !env_cache; e in
  let normalized env p = try Env.normalize_module_path None (real env) p with _ -> p in
  let value p = match lib p with Some n when not (Hashtbl.mem l.values n) -> deny n | _ -> () in
  (* Identities: the values of the library units the structure names, by their declaration. *)
  let identities : string Types.Uid.Tbl.t = Types.Uid.Tbl.create 256 in
  let walked = Hashtbl.create 8 in
  let rec walk env prefix mty =
    match signature_of env mty with
    | Some sg ->
      List.iter (function
          | Types.Sig_value (id, vd, _) -> Types.Uid.Tbl.replace identities vd.val_uid (prefix ^ "." ^ Ident.name id)
          | Types.Sig_module (id, _, md, _, _) ->
            (match md.md_type with Types.Mty_alias _ -> () | t -> walk env (prefix ^ "." ^ Ident.name id) t)
          | _ -> ()) sg
    | None -> () in
  let rec root = function Path.Pident id -> Some id | Pdot (q, _) -> root q | Papply (f, _) -> root f in
  let see_unit env p =
    match root (normalized env p) with
    | Some id when Ident.persistent id && not (Hashtbl.mem walked (Ident.name id)) ->
      Hashtbl.replace walked (Ident.name id) ();
      let env = real env in
      (try walk env (unit_path (Ident.name id)) (Env.find_module (Pident id) env).md_type with Not_found -> ())
    | _ -> () in
  let identity (vd : Types.value_description) =
    match Types.Uid.Tbl.find_opt identities vd.val_uid with
    | Some n when not (Hashtbl.mem l.values n) -> deny n
    | _ -> () in
  (* A module seen through a signature: each value there stands for the source's value of that name. *)
  let rec through env (source : Types.module_type) (target : Types.module_type) =
    match signature_of env source, signature_of env target with
    | Some src, Some tgt ->
      List.iter (function
          | Types.Sig_value (id, _, _) ->
            List.iter (function
                | Types.Sig_value (id', vd, _) when Ident.name id' = Ident.name id -> identity vd
                | _ -> ()) src
          | Types.Sig_module (id, _, md, _, _) ->
            List.iter (function
                | Types.Sig_module (id', _, md', _, _) when Ident.name id' = Ident.name id ->
                  through env md'.md_type md.md_type
                | _ -> ()) src
          | _ -> ()) tgt
    | _ -> () in
  let rec ident_of me = match me.mod_desc with
    | Tmod_ident (p, _) -> Some p
    | Tmod_constraint (me, _, _, _) -> ident_of me
    | _ -> None in
  (* A scoped alias of a library module: remembered (its uses are library paths). *)
  let alias id me = match id, ident_of me with
    | Some id, Some p -> (match lib p with Some n -> Hashtbl.replace aliases id n | None -> ())
    | _ -> () in
  let super = Tast_iterator.default_iterator in
  (* First pass: the library units the structure names, whose values' identities are then known. *)
  let collect = { super with
                  module_expr = (fun it me ->
                      (match me.mod_desc with Tmod_ident (p, _) -> see_unit me.mod_env p | _ -> ());
                      super.module_expr it me);
                  expr = (fun it e ->
                      (match e.exp_desc with Texp_ident (p, _, _) -> see_unit e.exp_env p | _ -> ());
                      super.expr it e) } in
  collect.structure collect str;
  let module_expr it me = match me.mod_desc with
    | Tmod_ident _ -> ()  (* an alias, an include, an open: what is used through it is judged there *)
    | Tmod_apply (f, arg, _) ->
      (match Option.map (normalized me.mod_env) (ident_of f) with
       | Some fp when lib fp <> None ->
         let n = Option.get (lib fp) in
         if not (Hashtbl.mem l.functors n) then deny n
         else if ident_of arg = None then it.Tast_iterator.module_expr it arg
       | _ ->
         (match f.mod_type with
          | Types.Mty_functor (Named (_, param), _) -> through (real me.mod_env) arg.mod_type param
          | _ -> ());
         super.module_expr it me)
    | Tmod_constraint (inner, _, Tmodtype_explicit _, _) ->
      (* the typer's own (implicit) constraints narrow nothing: an include keeps the whole
         signature, a pack is judged at its package type below *)
      through (real me.mod_env) inner.mod_type me.mod_type;
      super.module_expr it me
    | _ -> super.module_expr it me in
  let expr it e = match e.exp_desc with
    | Texp_ident (p, _, vd) -> value p; identity vd
    | Texp_new (p, _, _) -> (match lib p with Some n -> deny n | None -> ()); super.expr it e
    | Texp_letmodule (id, _, _, me, body) -> alias id me; it.module_expr it me; it.expr it body
    | Texp_pack me ->
      (match (Btype.repr e.exp_type).desc with
       | Tpackage (pt, _) ->
         let env = real e.exp_env in
         let rec packed me = match me.mod_desc with
           | Tmod_constraint (m, _, Tmodtype_implicit, _) -> packed m
           | _ -> me in
         (try through env (packed me).mod_type (Option.get (Env.find_modtype pt env).mtd_type) with _ -> ())
       | _ -> ());
      super.expr it e
    | _ -> super.expr it e in
  let structure_item it si = match si.str_desc with
    | Tstr_module mb -> alias mb.mb_id mb.mb_expr; super.structure_item it si
    | Tstr_primitive _ -> deny "external"
    | _ -> super.structure_item it si in
  let signature_item it si = match si.sig_desc with
    | Tsig_value { val_prim = _ :: _; _ } -> deny "external"
    | _ -> super.signature_item it si in
  let binding_op it (bop : binding_op) = value bop.bop_op_path; super.binding_op it bop in
  let class_expr it ce = (match ce.cl_desc with
      | Tcl_ident (p, _, _) -> (match lib p with Some n -> deny n | None -> ())
      | _ -> ()); super.class_expr it ce in
  let it = { super with module_expr; expr; structure_item; signature_item; binding_op; class_expr } in
  it.structure it str;
  (* what the structure exports at its top level: the entry points are bound from there *)
  List.iter (function Types.Sig_value (_, vd, _) -> identity vd | _ -> ()) str.str_type;
  denied_attributes str deny;
  List.rev !denied
