(* Which library code a solution reaches, and which language features it uses, decided by the
   compiler against allowlists: the library values of ocaml_grpo/ocaml/allowlist.txt (embedded at
   build time as Allowlist_data.text) and the attributes of `harmless_attributes` below. Deny by
   default; what is denied is named (the breakdown's `forbidden`).

   Library values are judged by what is reached, never by a module's name:
   - a value the solution uses (`Texp_ident`, a `let*` operator) is named by the compiler's own
     identity of it: its path when the path leads into a library, module aliases followed at any
     depth as the compiler follows them (`Env.normalize_module_path`: `N.S.unsafe_get` with
     `module N = struct module S = String end` is `Stdlib.String.unsafe_get`); otherwise (a value
     of the solution's own module that came from `include String`, of a functor's result, of a
     module seen through a signature) by its declaration, `Types.value_description.val_uid`, which
     `include`, `module type of` and strengthening keep: the library declaration it is
     (`Stdlib__String.67` is `Stdlib.String.unsafe_get`), found by walking the library's
     interfaces (`library` below);
   - a module that crosses a signature (a functor's argument, the library's listed functors'
     too, `(M : S)`, `module rec`, a packed first-class module, the solution's own top-level
     signature, which the oracle program sees) is judged by every value, submodule and functor that
     signature makes reachable, each by the same identity;
   - a module alias, `include`, `open` or `let module` reaches nothing by itself: only what is
     then used through it is judged (above);
   - a library functor may be applied only when listed (`Make()`); a library module may be packed
     at a listed package type (`S!`) without further check; a library class: never.
   `external` declarations are denied wherever they are (a structure or a signature). The
   solution's own names never matter: a local module `Obj` or a value `unsafe_total` is its own.

   A declaration shared by several library values (Base declares many through one module type)
   names them all: it is allowed only if every one of them is listed. A declaration of a library
   module type that no library value has (`Set.OrderedType.compare`, `Set.S.add`) is an interface:
   what stands behind it was judged where it crossed that signature (or is a listed functor's
   result). A declaration from no library interface and not the solution's own (the harness's,
   say) is denied. *)

open Typedtree

type allowlist = {
  values : (string, unit) Hashtbl.t;  (* "Stdlib.List.map" *)
  functors : (string, unit) Hashtbl.t;  (* "Stdlib.Set.Make" *)
  packages : (string, unit) Hashtbl.t;  (* module types a library module may be packed at *)
}

let words s = List.filter (( <> ) "") (String.split_on_char ' ' (String.concat " " (String.split_on_char '\t' s)))

(* Lines `Module: name name ...`; `F()` is a functor, `S!` a module type (or a type abbreviating
   one) a library module may be packed at; `#` starts a comment line. *)
let parse text =
  let t = { values = Hashtbl.create 2048; functors = Hashtbl.create 16; packages = Hashtbl.create 16 } in
  List.iter (fun line ->
      match String.index_opt line ':' with
      | _ when String.length line > 0 && line.[0] = '#' -> ()
      | None -> ()
      | Some i ->
        let head = words (String.sub line 0 i) in
        let names = words (String.sub line (i + 1) (String.length line - i - 1)) in
        let m = match head with [m] -> m | _ -> failwith ("allowlist: bad module header: " ^ line) in
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

(* ------------------------------------------------------------------------------------------ *)
(* Attributes: deny by default. These only steer warnings, documentation and optimisation (the
   compiler may inline or specialise, never change what a program means) or how the parser reads
   a constructor's arguments (which the type checker then checks). Every other attribute is
   denied, named `attribute:NAME` (`ocaml.` dropped): among them the ones that change a value's
   representation or make the type checker trust a claim, `unboxed` (OCaml 4.13 stops looking
   through [@@unboxed] wrappers after 100 of them, so a float wrapped 101 deep is read from a flat
   float array as a pointer), `untagged`, `noalloc`, `immediate`, `immediate64`; and any a ppx
   would read (`deriving`), which does nothing here. *)
let harmless_attributes = [
  "doc"; "text";  (* doc comments *)
  "warning"; "warnerror"; "ppwarning"; "alert"; "deprecated"; "deprecated_mutable";
  "warn_on_literal_pattern";  (* diagnostics only *)
  "inline"; "inlined"; "specialise"; "specialised"; "unrolled"; "tailcall"; "local";  (* optimisation hints *)
  "tail_mod_cons";  (* OCaml 4.14's tail recursion modulo cons: the same values, in constant stack (4.13 ignores it) *)
  "explicit_arity";  (* how the parser reads `C (a, b)` *)
]

let attribute_name (a : Parsetree.attribute) =
  let n = a.attr_name.txt in
  if String.length n > 6 && String.sub n 0 6 = "ocaml." then String.sub n 6 (String.length n - 6) else n

(* Every attribute of the answer's parse tree (the typed tree does not keep them all) that is not
   harmless, in source order. Payloads are data to the compiler: an attribute inside one does
   nothing, and is not looked at. *)
let denied_attributes (ast : Parsetree.structure) : string list =
  let denied = ref [] in
  let attribute _ a =
    let n = "attribute:" ^ attribute_name a in
    if not (List.mem (attribute_name a) harmless_attributes || List.mem n !denied) then denied := n :: !denied in
  let it = { Ast_iterator.default_iterator with attribute } in
  it.structure it ast;
  List.rev !denied

(* ------------------------------------------------------------------------------------------ *)
(* The library's declarations, by identity. *)

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

(* The compilation unit a declaration belongs to: `Types.Uid.t` is abstract in 4.13, and printed
   `Unit.N` (an item), `Unit` (a unit), `<internal>` or `<predef:...>` (the typer's own: no unit). *)
let uid_unit uid =
  let s = Format.asprintf "%a" Types.Uid.print uid in
  if s = "" || s.[0] = '<' then None
  else match String.rindex_opt s '.' with
    | Some i when i + 1 < String.length s && String.for_all (fun c -> c >= '0' && c <= '9')
                                                (String.sub s (i + 1) (String.length s - i - 1)) ->
      Some (String.sub s 0 i)
    | _ -> Some s

type origin =
  | Value of string  (* a library value, by canonical path *)
  | Module of string  (* a library module or functor, by canonical path *)
  | Declared  (* a declaration in a library module type, functor parameter or functor result *)

(* Every declaration of the library units the compilation read (`units`: their names), walked in
   the order of unit names. A value the solution reaches is declared in a unit it read, so these
   are all it can reach; units read from the job's own directory (the harness) are no library.
   A module typed by a module type is walked through its expansion; an alias is not walked (its
   target is a unit of its own, or walked under its own name). Built only when a use is not
   settled by its path. (Within the standard library no declaration is both a listed value and
   another value off the list, or both a module type's and a value off the list: which of its
   units were read changes no verdict, so the server, which types the answer inside the test
   program, and the ocamlc path, which types it alone, agree.) *)
let library : (Types.Uid.t, origin) Hashtbl.t Lazy.t ref = ref (lazy (Hashtbl.create 1))

let build_library units =
  let t = Hashtbl.create 8192 in
  let add uid o = Hashtbl.add t uid o in
  let expand env mty = try Mtype.scrape (Lazy.force env) mty with Not_found -> mty in
  let rec walk env ~real prefix sg =
    let env = lazy (Env.add_signature sg (Lazy.force env)) in
    List.iter (function
        | Types.Sig_value (id, vd, _) ->
          add vd.val_uid (if real then Value (prefix ^ "." ^ Ident.name id) else Declared)
        | Types.Sig_module (id, _, md, _, _) ->
          let name = prefix ^ "." ^ Ident.name id in
          add md.md_uid (if real then Module name else Declared);
          walk_mty env ~real name md.md_type
        | Types.Sig_modtype (id, { mtd_type = Some mty; _ }, _) ->
          walk_mty env ~real:false (prefix ^ "." ^ Ident.name id) mty
        | _ -> ()) sg
  and walk_mty env ~real prefix mty = match mty with
    | Types.Mty_alias _ -> ()
    | Mty_signature sg -> walk env ~real prefix sg
    | Mty_ident _ -> (match expand env mty with
        | Mty_ident _ | Mty_alias _ -> ()
        | m -> walk_mty env ~real prefix m)
    | Mty_functor (param, result) ->
      (match param with Named (_, p) -> walk_mty env ~real:false prefix p | Unit -> ());
      walk_mty env ~real:false prefix result in
  let in_library unit_name =
    match Load_path.find_uncap (unit_name ^ ".cmi") with
    | file -> not (List.mem (Filename.dirname file) [""; "."])
    | exception Not_found -> false in
  let units = List.filter in_library (List.sort_uniq compare units) in
  List.iter (fun unit_name ->
      match !Persistent_env.Persistent_signature.load ~unit_name with
      | Some { cmi; _ } ->
        (* a unit whose interface cannot be walked adds nothing: its declarations stay unknown, denied *)
        (try walk (lazy Env.empty) ~real:true (unit_path unit_name) cmi.cmi_sign with _ -> ())
      | None | exception _ -> ()) units;
  t

let reset_library units = library := lazy (build_library units)

(* ------------------------------------------------------------------------------------------ *)

(* Every library path the structure reaches that the list does not allow, in tree order, then
   the values its own signature (what the oracle program sees) holds that are off the list.
   `unit_name`: the unit being compiled (its declarations are the solution's own); `env_of`: a
   typed tree's environment made whole (a .cmt keeps only a summary of each). *)
let denied_paths ?(env_of = fun env -> env) ~unit_name (str : structure) : string list =
  let l = Lazy.force list in
  let denied = ref [] in
  let deny what = if not (List.mem what !denied) then denied := what :: !denied in
  (* Whole environments, made on demand (in a .cmt each is rebuilt from its summary). *)
  let whole env = lazy (env_of env) in
  (* A path into a library, written canonically: `Stdlib.List.map` for `List.map`,
     `Stdlib__List.map` and `Stdlib.List.map` alike. *)
  let rec lib (p : Path.t) = match p with
    | Pident id when Ident.persistent id -> Some (unit_path (Ident.name id))
    | Pident _ -> None
    | Pdot (q, s) -> Option.map (fun m -> m ^ "." ^ s) (lib q)
    | Papply (f, _) -> Option.map (fun _ -> Path.name p) (lib f) in
  (* The same, after following module aliases as the compiler does (`N.S` is `Stdlib__String`). *)
  let normalize env (p : Path.t) =
    let m q = try Env.normalize_module_path None (Lazy.force env) q with _ -> q in
    match p with Pdot (q, s) -> Path.Pdot (m q, s) | Pident _ -> p | Papply _ -> m p in
  let lib_path env p = match lib p with Some n -> Some n | None -> lib (normalize env p) in
  let own uid = match uid_unit uid with None -> true | Some u -> u = unit_name in
  (* Which library declaration `uid` is; `what` names it when no library has it. *)
  let judge_uid ~what ~allowed uid =
    if not (own uid) then
      match Hashtbl.find_all (Lazy.force !library) uid with
      | [] -> deny what
      | origins ->
        let names = List.rev (List.filter_map (function Value n | Module n -> Some n | Declared -> None) origins) in
        (match List.find_opt (fun n -> not (allowed n)) names with Some n -> deny n | None -> ()) in
  let value_allowed n = Hashtbl.mem l.values n in
  let functor_allowed n = Hashtbl.mem l.functors n in
  let value env p (vd : Types.value_description) =
    match lib_path env p with
    | Some n -> if not (value_allowed n) then deny n
    | None -> judge_uid ~what:(Path.name p) ~allowed:value_allowed vd.val_uid in
  (* A functor being applied or crossing a signature: a library one must be listed. *)
  let functor_ env p =
    match lib_path env p with
    | Some n -> if not (functor_allowed n) then deny n
    | None ->
      (match Env.find_module p (Lazy.force env) with
       | md -> judge_uid ~what:(Path.name p) ~allowed:functor_allowed md.md_uid
       | exception _ -> deny (Path.name p)) in
  let rec expand env (mty : Types.module_type) = match mty with
    | Mty_ident p -> (match Env.find_modtype_expansion p env with m -> expand env m | exception Not_found -> mty)
    | Mty_alias p -> (match Env.find_module p env with md -> expand env md.md_type | exception Not_found -> mty)
    | _ -> mty in
  let last f sg = List.fold_left (fun acc item -> match f item with Some x -> Some x | None -> acc) None sg in
  (* A module crossing the signature `target`: every value, submodule and functor that `target`
     makes reachable is judged, through the module's library path when it has one (`src_path`),
     else through the declarations of its own signature `src`. Environments are whole here. *)
  let rec crossing tenv (target : Types.module_type) senv (src_path : Path.t option) (src : Types.module_type) =
    let src_lib = Option.bind src_path (lib_path (Lazy.from_val senv)) in
    let src_sig = lazy (match expand senv src with Mty_signature sg -> sg | _ -> []) in
    let find f = last f (Lazy.force src_sig) in
    match expand tenv target with
    | Mty_functor _ -> (match src_path with Some p -> functor_ (Lazy.from_val senv) p | None -> ())
    | Mty_signature sg ->
      let tenv = Env.add_signature sg tenv in
      let senv_inside = lazy (Env.add_signature (Lazy.force src_sig) senv) in
      List.iter (function
          | Types.Sig_value (id, _, _) ->
            let name = Ident.name id in
            (match src_lib with
             | Some m -> if not (value_allowed (m ^ "." ^ name)) then deny (m ^ "." ^ name)
             | None ->
               (match find (function Types.Sig_value (i, vd, _) when Ident.name i = name -> Some vd | _ -> None) with
                | Some vd -> judge_uid ~what:name ~allowed:value_allowed vd.val_uid
                | None -> ()))
          | Types.Sig_module (id, _, md, _, _) ->
            let name = Ident.name id in
            (match src_lib, src_path with
             | Some _, Some p -> crossing tenv md.md_type senv (Some (Path.Pdot (p, name))) (Types.Mty_signature [])
             | _ ->
               (match find (function Types.Sig_module (i, _, smd, _, _) when Ident.name i = name -> Some (i, smd)
                                   | _ -> None) with
                | Some (i, smd) ->
                  let senv = Lazy.force senv_inside in
                  (match md.md_type, smd.md_type with
                   | _, Mty_alias p -> crossing tenv md.md_type senv (Some p) smd.md_type
                   | Mty_functor _, _ -> judge_uid ~what:name ~allowed:functor_allowed smd.md_uid
                   | _ -> crossing tenv md.md_type senv (Some (Path.Pident i)) smd.md_type)
                | None -> ()))
          | Types.Sig_class (id, _, _, _) ->
            let name = Ident.name id in
            (match src_lib with
             | Some m -> deny (m ^ "." ^ name)
             | None ->
               (match find (function Types.Sig_class (i, cd, _, _) when Ident.name i = name -> Some cd | _ -> None) with
                | Some cd -> judge_uid ~what:name ~allowed:(fun _ -> false) cd.cty_uid
                | None -> ()))
          | _ -> ()) sg
    | _ -> () in
  let rec ident_of me = match me.mod_desc with
    | Tmod_ident (p, _) -> Some p
    | Tmod_constraint (me, _, Tmodtype_implicit, _) -> ident_of me
    | _ -> None in
  let super = Tast_iterator.default_iterator in
  (* The module `me` seen at `target` (in `tenv`); the module itself is then checked like any
     other, unless it is only a path (a path reaches nothing by itself). *)
  let seen_at it tenv target me =
    (match env_of tenv, env_of me.mod_env with
     | tenv, senv -> crossing tenv target senv (ident_of me) me.mod_type
     | exception _ -> deny (match ident_of me with Some p -> Path.name p | None -> "module"));
    if ident_of me = None then it.Tast_iterator.module_expr it me in
  let module_expr it me = match me.mod_desc with
    | Tmod_ident _ -> ()  (* an alias, an include, an open: judged by what is used through it *)
    | Tmod_apply (f, arg, _) ->
      (* The functor: a library one must be listed. Its argument crosses the parameter's
         signature (a listed library functor's too: the library calls what it sees there). *)
      (match ident_of f with Some p -> functor_ (whole f.mod_env) p | None -> it.Tast_iterator.module_expr it f);
      (match expand (env_of f.mod_env) f.mod_type with
       | Mty_functor (Named (_, param), _) -> seen_at it f.mod_env param arg
       | _ | exception _ -> if ident_of arg = None then it.module_expr it arg)
    | Tmod_constraint (inner, target, Tmodtype_explicit _, _) -> seen_at it me.mod_env target inner
    | _ -> super.module_expr it me in
  let expr it e = match e.exp_desc with
    | Texp_ident (p, _, vd) -> value (whole e.exp_env) p vd
    | Texp_letop { let_; ands; _ } ->
      List.iter (fun bop -> value (whole e.exp_env) bop.bop_op_path bop.bop_op_val) (let_ :: ands);
      super.expr it e
    | Texp_new (p, _, cd) ->
      (match lib_path (whole e.exp_env) p with
       | Some n -> deny n
       | None -> judge_uid ~what:(Path.name p) ~allowed:(fun _ -> false) cd.cty_uid);
      super.expr it e
    | Texp_pack me ->
      (* The typer wraps the packed module in a constraint to the package's module type. *)
      let inner, target = match me.mod_desc with
        | Tmod_constraint (inner, target, Tmodtype_implicit, _) -> inner, Some target
        | _ -> me, None in
      let package = match target, (Btype.repr e.exp_type).desc with
        | Some (Types.Mty_ident pt), _ | _, Tpackage (pt, _) -> Some pt
        | _, Tconstr (pt, _, _) -> Some pt  (* a library's abbreviation for a package type *)
        | _ -> None in
      let listed = match package with
        | Some pt -> (match lib_path (whole e.exp_env) pt with Some n -> Hashtbl.mem l.packages n | None -> false)
        | None -> false in
      (match target, package with
       | _ when listed -> if ident_of inner = None then it.module_expr it inner
       | Some target, _ -> seen_at it me.mod_env target inner
       | None, Some pt -> seen_at it e.exp_env (Types.Mty_ident pt) inner
       | None, None -> deny "module")
    | _ -> super.expr it e in
  let structure_item it si = match si.str_desc with
    | Tstr_primitive _ -> deny "external"
    | _ -> super.structure_item it si in
  let signature_item it si = match si.sig_desc with
    | Tsig_value { val_prim = _ :: _; _ } -> deny "external"
    | _ -> super.signature_item it si in
  let class_expr it ce = (match ce.cl_desc with
      | Tcl_ident (p, _, _) ->
        (match lib_path (whole ce.cl_env) p with
         | Some n -> deny n
         | None ->
           (match Env.find_class p (env_of ce.cl_env) with
            | cd -> judge_uid ~what:(Path.name p) ~allowed:(fun _ -> false) cd.cty_uid
            | exception _ -> deny (Path.name p)))
      | _ -> ()); super.class_expr it ce in
  let it = { super with module_expr; expr; structure_item; signature_item; class_expr } in
  it.structure it str;
  (* What the oracle program can reach: the values of the answer's own signature. The typed tree's
     still holds what `open struct ... end` bound (hidden from the signature) and every value a
     later one of the same name shadows: those are left out, as the compiler leaves them out. *)
  let hidden = List.concat_map (fun si -> match si.str_desc with
      | Tstr_open { open_expr = { mod_desc = Tmod_structure _; _ }; open_bound_items; _ } ->
        List.filter_map (function Types.Sig_value (id, _, _) -> Some id | _ -> None) open_bound_items
      | _ -> []) str.str_items in
  let exported = List.fold_left (fun acc item -> match item with
      | Types.Sig_value (id, vd, _) when not (List.exists (Ident.same id) hidden) ->
        (Ident.name id, vd) :: List.remove_assoc (Ident.name id) acc
      | _ -> acc) [] str.str_type in
  List.iter (fun (name, (vd : Types.value_description)) -> judge_uid ~what:name ~allowed:value_allowed vd.val_uid)
    (List.rev exported);
  List.rev !denied
