(* The grader's OCaml tool (ocaml_grpo/compile_server.py builds and drives it): `ocamlc` as a
   library (compiler-libs, the code `ocamlc` runs), so its outputs are ocamlc's (the same .cmo,
   executables, messages, exit status), plus facts ocamlc does not print: the stage that failed
   (from the compiler's own exception), the name an "unbound" error is about, where each
   top-level item starts, and the attributes and library values the solution uses that the
   allowlists deny (allowlist.ml, on the parse and typed trees in this process: nothing is dumped
   to a file).

   Three ways to run it:
     compile_server                  the server: requests on stdin, replies on stdout. Each request
                                     is answered by a child forked from a parent that never
                                     compiles, so every request meets the compiler exactly as a
                                     new `ocamlc` process would: no counters, flags, tables or
                                     descriptors carried over from an earlier request.
     compile_server --once REQUEST   one request (tab-separated fields as below), reply on stdout
     compile_server --check-cmt F    the allowlist check on a `-bin-annot` .cmt and its source (the
                                     ocamlc path)
     compile_server --values M [INCDIR...]   every value of library module M (the list's tests)

   Requests, fields separated by tabs:
     DIR  c  FLAGS  FILE.ml  [INCDIR...]   like `ocamlc -w -a -alert -all [-I INCDIR]... -c FILE.ml`
                                           in DIR. FLAGS: letters, `-` for none: a = check the
                                           parse tree's attributes and the typed tree against the
                                           allowlists, i = -i (type check
                                           only, signature discarded), p = -stop-after parsing,
                                           W = ocamlc's default warnings instead of -w -a ...
     DIR  o  OUT  FILE...                  like `ocamlc -w -a -alert -all -o OUT FILE...`
     DIR  k  FILE.ml  OUT  FILE...         what `c a FILE.ml`, then (if it compiled and the allowlist
                                           denies nothing) `o OUT FILE...` would reply, with the
                                           answer FILE.ml typed once: parsed alone (its attributes
                                           checked there), then typed and
                                           checked as the `Solution` module of the oracle program
                                           (FILE... holds it); checked alone, in a fresh child, only
                                           when the oracle program fails outside the answer
     DIR  P  FILE.ml...                    `c pW FILE.ml` for each file, one reply each
   Reply: "ready\n" once started, then per request (per step of `k`) "RC LEN\n" and LEN bytes: fact lines
   `key=value` (stage, unbound, items, denied, loc, message), an empty line, then what ocamlc would have written
   on stderr. The length prefix means nothing in a message can pass for a reply; the location and
   message facts come from the compiler's report, so no printed text can pass for them. *)

let proto = Unix.out_channel_of_descr (Unix.dup Unix.stdout)

(* ocamlc's stdout (the signature `-i` prints) is discarded, as the grader's scripts did. *)
let () =
  let null = Unix.openfile "/dev/null" [Unix.O_WRONLY] 0 in
  Unix.dup2 null Unix.stdout; Unix.close null

let max_reply = 16 lsl 20  (* the toolchain sandbox's file size limit: what a .out file could hold *)

let default_warnings = Warnings.backup ()

(* `-w -a -alert -all`, non-tty output, no OCAMLPARAM: ocamlc's settings in the grader. *)
let () =
  ignore (Warnings.parse_options false "-a");
  Warnings.parse_alert_option "-all";
  Clflags.color := Some Misc.Color.Never;
  Clflags.error_style := Some Misc.Error_style.Contextual

(* The standard library's listing and its Stdlib .cmi, read once by the parent (read-only data;
   each request still builds its own environment from them, as ocamlc does: keeping Stdlib opened
   in the parent, ~1 ms a compile, would change the stamps in the .cmo it writes). Only Stdlib's:
   every request opens it; the others are read by the children that use them (preloading them all
   measured no faster). *)
let std_dir = Load_path.Dir.create Config.standard_library
let cmi_cache : (string, Cmi_format.cmi_infos) Hashtbl.t = Hashtbl.create 8
let () =
  let path = Filename.concat Config.standard_library "stdlib.cmi" in
  (try Hashtbl.replace cmi_cache path (Cmi_format.read_cmi path) with _ -> ());
  let load_default = !Persistent_env.Persistent_signature.load in
  Persistent_env.Persistent_signature.load := fun ~unit_name ->
    match Load_path.find_uncap (unit_name ^ ".cmi") with
    | filename when Hashtbl.mem cmi_cache filename ->
      Some { Persistent_env.Persistent_signature.filename; cmi = Hashtbl.find cmi_cache filename }
    | _ | exception Not_found -> load_default ~unit_name

(* ocamlc's load path: "" first, then -I directories, then the standard library. *)
let init_path includes =
  if includes = [] then begin
    Load_path.reset ();
    Load_path.add (Load_path.Dir.create "");
    Load_path.add std_dir;
    Env.reset_cache ()
  end else begin
    Clflags.include_dirs := List.rev includes;
    Compmisc.init_path ()
  end

type facts = {
  mutable stage : string;  (* where a failure came from: lexer, parser, typer, linker *)
  mutable unbound : string;  (* the name an "unbound value/type/..." error is about *)
  mutable items : int list;  (* byte offsets where the parsed file's top-level items start *)
  mutable denied : string list;  (* attributes, then library values, the allowlists do not allow *)
  mutable loc : Lexing.position option;  (* where the error starts (replied "LINE,COLUMN,FILE", column in bytes) *)
  mutable message : string;  (* the error's own message, on one line *)
}

let facts = { stage = ""; unbound = ""; items = []; denied = []; loc = None; message = "" }

let reset_facts () =
  facts.stage <- ""; facts.unbound <- ""; facts.items <- []; facts.denied <- []; facts.loc <- None; facts.message <- ""

let flatten lid = try String.concat "." (Longident.flatten lid) with _ -> ""

(* The failure's stage, from the exception the compiler raised (never from its message). *)
let classify exn =
  (* Where and what, from the compiler's report, not from its printed output: a warning the
     solution enabled ([@@@ocaml.ppwarning "...\nError: ..."]) can print anything there. *)
  (match Location.error_of_exn exn with
   | Some (`Ok report) ->
     facts.loc <- Some report.Location.main.loc.loc_start;
     facts.message <- String.concat " " (List.filter (( <> ) "") (List.map String.trim
         (String.split_on_char '\n' (Format.asprintf "%t" report.main.txt))))
   | _ -> ());
  facts.stage <- (match exn with
      | Lexer.Error _ -> "lexer"
      | Syntaxerr.Error _ | Syntaxerr.Escape_error -> "parser"
      | Bytelink.Error _ | Symtable.Error _ -> "linker"
      | _ -> "typer");
  match exn with
  | Env.Error (Env.Lookup_error (_, _, e)) ->
    facts.unbound <- (match e with
        | Env.Unbound_value (l, _) | Env.Unbound_type l | Env.Unbound_constructor l
        | Env.Unbound_label l | Env.Unbound_module l -> flatten l
        | _ -> "")
  | _ -> ()

(* As ocamlc's main: status 0, or 2 with the error reported (an exception the compiler cannot
   describe is reported the way ocamlc's runtime would, as a fatal error). *)
let run (f : unit -> unit) : int * string =
  let buf = Buffer.create 512 in
  let ppf = Format.formatter_of_buffer buf in
  Location.formatter_for_warnings := ppf;
  let rc =
    match f () with
    | () -> 0
    | exception Compenv.Exit_with_status n -> n
    | exception x ->
      classify x;
      (try Location.report_exception ppf x
       with x -> Format.fprintf ppf "Fatal error: exception %s@." (Printexc.to_string x));
      2 in
  Format.pp_print_flush ppf ();
  rc, Buffer.contents buf

(* What the allowlist denies in the unit this process just compiled (its declarations are the
   solution's own), read after its bytecode is written: judging a use may read more of the
   library's interfaces, which must not change the .cmo's list of imports. *)
let unit_denied (str : Typedtree.structure) =
  Allowlist.reset_library (List.map fst (Env.imports ()));
  Allowlist.denied_paths ~unit_name:(Env.get_unit_name ()) str

(* ... in a oracle program's `Solution` module: the answer, inlined (its typed tree is what runs).
   No such module where the oracle program must hold one: denied. *)
let solution_denied (str : Typedtree.structure) =
  (* the typer constrains a structure to its signature when that hides items (`open struct`) *)
  let rec structure (me : Typedtree.module_expr) = match me.mod_desc with
    | Tmod_structure s -> Some s
    | Tmod_constraint (me, _, Tmodtype_implicit, _) -> structure me
    | _ -> None in
  match List.find_map (fun (item : Typedtree.structure_item) -> match item.str_desc with
      | Typedtree.Tstr_module { mb_id = Some id; mb_expr; _ } when Ident.name id = "Solution" -> structure mb_expr
      | _ -> None) str.str_items with
  | Some s -> unit_denied s
  | None -> ["Solution"]

(* Compile_common.implementation, step by step: parse (recording where items start, and with
   `check` or `attributes` the attributes the answer may not use), type, emit bytecode unless -i or
   -stop-after parsing, then check the typed tree (or a oracle program's Solution module) when asked. *)
let compile ?(check = false) ?(attributes = false) ?(check_solution = false) ?(includes = []) file () =
  let output_prefix = Filename.remove_extension file in
  let parse_only = Clflags.(should_stop_after Compiler_pass.Parsing) in
  if not parse_only then init_path includes;
  let module_name = Compenv.module_of_filename file output_prefix in
  Env.set_unit_name module_name;
  let env = if parse_only then Env.empty else Compmisc.initial_env () in
  let info = { Compile_common.source_file = file; module_name; output_prefix; env;
               ppf_dump = Format.err_formatter; tool_name = "ocamlc"; native = false } in
  let cmo = output_prefix ^ ".cmo" in
  try
    let parsed = Compile_common.parse_impl info in
    facts.items <- List.map (fun (i : Parsetree.structure_item) -> i.pstr_loc.loc_start.pos_cnum) parsed;
    if attributes then facts.denied <- Allowlist.denied_attributes parsed;
    if not parse_only then begin
      let typed = Compile_common.typecheck_impl info parsed in
      if not !Clflags.print_types then Compile.emit_bytecode info (Compile.to_bytecode info typed);
      if check then facts.denied <- Allowlist.denied_attributes parsed @ unit_denied typed.structure;
      if check_solution then facts.denied <- facts.denied @ solution_denied typed.structure
    end;
    Warnings.check_fatal ()
  with x -> Misc.remove_file cmo; raise x

let set_flags flags =
  String.iter (function
    | 'i' -> Clflags.print_types := true
    | 'p' -> Clflags.stop_after := Some Clflags.Compiler_pass.Parsing
    | 'W' -> Warnings.restore default_warnings
    | _ -> ()) flags

(* The answer parsed alone, recording its items and the attributes it may not use. *)
let parse_alone file () =
  Clflags.stop_after := Some Clflags.Compiler_pass.Parsing;
  Fun.protect ~finally:(fun () -> Clflags.stop_after := None) (compile ~attributes:true file)

(* `ocamlc -c FILE.mli`, as ocamlc compiles an interface given on a link's command line. *)
let compile_interface file () =
  init_path [];
  let output_prefix = Filename.remove_extension file in
  let module_name = Compenv.module_of_filename file output_prefix in
  Env.set_unit_name module_name;
  Compile_common.interface { Compile_common.source_file = file; module_name; output_prefix;
                             env = Compmisc.initial_env (); ppf_dump = Format.err_formatter; tool_name = "ocamlc";
                             native = false }

(* `ocamlc -o OUT FILE...` in two steps: compile the .mli and .ml files in order, then link. *)
let compile_sources ?(check_solution = false) files () =
  List.iter (fun f ->
      if Filename.check_suffix f ".ml" then compile ~check_solution f ()
      else if Filename.check_suffix f ".mli" then compile_interface f ()) files

let bytelink out files () =
  init_path [];
  Bytelink.link (List.filter_map (fun f ->
      if Filename.check_suffix f ".ml" then Some (Filename.remove_extension f ^ ".cmo")
      else if Filename.check_suffix f ".mli" then None else Some f) files) out;
  Warnings.check_fatal ()

let link out files () = compile_sources files (); bytelink out files ()

let reply (rc, out) =
  let out = if String.length out > max_reply then String.sub out 0 max_reply else out in
  let payload = Printf.sprintf "stage=%s\nunbound=%s\nitems=%s\ndenied=%s\nloc=%s\nmessage=%s\n\n%s" facts.stage
      facts.unbound (String.concat "," (List.map string_of_int facts.items)) (String.concat " " facts.denied)
      (match facts.loc with
       | Some p -> Printf.sprintf "%d,%d,%s" p.pos_lnum (p.pos_cnum - p.pos_bol) p.pos_fname
       | None -> "") facts.message out in
  Printf.sprintf "%d %d\n%s" rc (String.length payload) payload

(* Whether the error just reported lies in FILE (the answer: the oracle program holds it under a
   `# 1 "FILE"` line directive). *)
let error_in file = match facts.loc with Some p -> p.pos_fname = file | None -> false

(* The whole reply to one request (one `RC LEN` reply, or two for `k` when it linked), with status
   0; or, for a `k` whose oracle program did not compile, status 4 and that failure's reply: then a
   fresh child checks the answer alone (`check_alone`, from serve_forked), since after a failed
   compile this one's compiler is no longer what a new ocamlc would be. *)
let handle line =
  match String.split_on_char '\t' line with
  | dir :: op :: args ->
    Sys.chdir dir;
    (match op, args with
     | "c", flags :: file :: includes ->
       set_flags flags;
       0, reply (run (compile ~check:(String.contains flags 'a') ~includes file))
     | "o", out :: files -> 0, reply (run (link out files))
     | "k", file :: out :: objs ->
       (* The answer is typed once, as the oracle program's `Solution` module: the typed tree that
          runs is the one the allowlist checks. Only an answer that parses on its own gets there
          (text that closed `struct ... end` early would parse in the oracle program, not alone).
          Its reply is the check's: the answer's own items, what the allowlist denies; the
          program is linked only if it denies nothing. The program holds nothing before the
          answer, so an error inside the answer is the one the answer makes alone; any other
          failure sends the answer to be checked alone (status 4). *)
       let (prc, _) as parsed = run (parse_alone file) in
       if prc <> 0 then 0, reply parsed
       else begin
         let items = facts.items and attributes = facts.denied in
         reset_facts ();
         let (trc, _) as built = run (compile_sources ~check_solution:true objs) in
         if trc <> 0 && error_in file then begin
           (* inside the answer, typed in the same environment as alone: the answer's own error *)
           facts.items <- items;
           0, reply built
         end
         else if trc <> 0 then 4, reply built
         else begin
           facts.items <- items;
           facts.denied <- attributes @ facts.denied;
           let first = reply (0, "") in
           if facts.denied <> [] then 0, first
           else begin
             reset_facts ();
             0, first ^ reply (run (bytelink out objs))
           end
         end
       end
     | "P", files ->
       (* Parse each file on its own, as `ocamlc -stop-after parsing -c F` (ocamlc's default
          warnings) would: the parser keeps no state from one file to the next (Parse.wrap
          resets the lexer), so one process serves them all. *)
       0, String.concat "" (List.map (fun file ->
           reset_facts ();
           set_flags "pW";
           reply (run (compile file))) files)
     | _ -> 0, reply (2, "bad request\n"))
  | _ -> 0, reply (2, "bad request\n")

(* A `k` whose oracle program did not compile: the answer alone, as `c a`; if it compiles and the
   allowlist denies nothing, the oracle program's failure follows as the link's reply. *)
let check_alone line tests_failure =
  match String.split_on_char '\t' line with
  | dir :: "k" :: file :: _ ->
    Sys.chdir dir;
    let (rc, _) as checked = run (compile ~check:true file) in
    let first = reply checked in
    if rc <> 0 || facts.denied <> [] then first else first ^ tests_failure
  | _ -> reply (2, "bad request\n")

let rec write_all fd s off =
  if off < String.length s then
    match Unix.write_substring fd s off (String.length s - off) with
    | n -> write_all fd s (off + n)
    | exception Unix.Unix_error (Unix.EINTR, _, _) -> write_all fd s off

let read_all fd =
  let b = Buffer.create 4096 and chunk = Bytes.create 65536 in
  let rec go () = match Unix.read fd chunk 0 65536 with
    | 0 -> Buffer.contents b
    | n -> Buffer.add_subbytes b chunk 0 n; go ()
    | exception Unix.Unix_error (Unix.EINTR, _, _) -> go () in
  go ()

(* The garbage collector of a forked child. The child shares the parent's memory copy-on-write:
   each page it writes is copied first. A major GC cycle writes the header of every live block
   (to mark it, then to sweep it), so a child that ran one would copy the parent's whole heap;
   and the minor heap is written all through on every minor cycle. So the server runs with a
   small minor heap (inherited: 512 KB of pages to copy instead of 2 MB), the parent keeps free
   heap in reserve (promoted data goes there, to pages nobody wrote, instead of new chunks), and a
   child starts with its major GC's marking slowed fivefold (a space overhead of 1000 instead of
   120: a request's slices mark a part of the inherited heap instead of all of it, often twice).
   A child still running after CHILD_GC_HOLD_S of CPU gets the parent's settings back, so a long
   compile's memory stays bounded as in ocamlc. The GC decides nothing a compile outputs (the
   .cmo/.cmi bytes are ocamlc's: tests/test_compile_server.py). bench/BENCHMARKS.md has the
   figures (a check-and-link request: ~17 ms -> ~13 ms of CPU). *)
let server_minor_heap_words = 64 * 1024
let server_heap_reserve_mb = 32
let child_space_overhead = 1000
let child_gc_hold_s = 0.1

let prepare_parent_gc () =
  (* max_overhead: the reserve is free space a compaction would give back *)
  Gc.set { (Gc.get ()) with Gc.minor_heap_size = server_minor_heap_words; max_overhead = 1_000_000 };
  (try ignore (Sys.opaque_identity (Bytes.create (server_heap_reserve_mb lsl 20))) with Out_of_memory -> ());
  Gc.full_major ()

let hold_major_gc () =
  let normal = Gc.get () in
  Sys.set_signal Sys.sigprof (Sys.Signal_handle (fun _ -> Gc.set normal));
  ignore (Unix.setitimer Unix.ITIMER_PROF { Unix.it_interval = 0.; it_value = child_gc_hold_s });
  Gc.set { normal with Gc.space_overhead = child_space_overhead }

let stop_gc_timer () =
  ignore (Unix.setitimer Unix.ITIMER_PROF { Unix.it_interval = 0.; it_value = 0. })

(* One step of a request in a child of this pristine process: the child's status and what it
   wrote. A child that dies without a whole reply (killed, crashed) takes the server down with it:
   the client restarts it and re-runs the request. *)
let in_child (f : unit -> int * string) : int * string =
  let r, w = Unix.pipe ~cloexec:true () in
  match Unix.fork () with
  | 0 ->
    Unix.close r;
    hold_major_gc ();
    let status, data = f () in
    stop_gc_timer ();
    write_all w data 0;
    Unix._exit status
  | pid ->
    Unix.close w;
    let data = read_all r in
    Unix.close r;
    let rec wait () = try snd (Unix.waitpid [] pid) with Unix.Unix_error (Unix.EINTR, _, _) -> wait () in
    (match wait () with
     | Unix.WEXITED status when data <> "" -> status, data
     | _ -> exit 3)

let serve_forked line =
  let data = match in_child (fun () -> handle line) with
    | 0, data -> data
    | 4, tests_failure -> (match in_child (fun () -> 0, check_alone line tests_failure) with
        | 0, data -> data
        | _ -> exit 3)
    | _ -> exit 3 in
  output_string proto data; flush proto

(* Every value of a library module, its submodules' too, by canonical path (functors as `F()`):
   what tests/test_allowlist.py compares the list with. *)
let print_values path includes =
  init_path includes;
  let env = Compmisc.initial_env () in
  let rec walk env prefix mty =
    match mty with
    | Types.Mty_alias p -> walk env prefix (Env.find_module p env).md_type
    | Types.Mty_ident _ -> (match Mtype.scrape env mty with Types.Mty_ident _ -> () | m -> walk env prefix m)
    | Types.Mty_functor _ -> output_string proto (prefix ^ "()\n")
    | Types.Mty_signature sg ->
      let env = Env.add_signature sg env in
      List.iter (function
          | Types.Sig_value (id, _, _) -> output_string proto (prefix ^ "." ^ Ident.name id ^ "\n")
          | Types.Sig_module (id, _, md, _, _) -> walk env (prefix ^ "." ^ Ident.name id) md.md_type
          | _ -> ()) sg in
  let lid = match Longident.unflatten (String.split_on_char '.' path) with Some l -> l | None -> exit 2 in
  let _, md = Env.lookup_module ~loc:Location.none lid env in
  walk env path md.md_type;
  flush proto

(* The allowlist's verdict on ocamlc's own `-bin-annot` .cmt (the ocamlc path): the same checks
   as the server's, on the same trees. A .cmt keeps each environment as a summary, rebuilt from the
   unit's load path when a check needs it; the attributes are read from the source's parse tree,
   parsed again (the .cmt keeps no parse tree). *)
let check_cmt file =
  let cmt = Cmt_format.read_cmt file in
  match cmt.cmt_annots, cmt.cmt_sourcefile with
  | Cmt_format.Implementation str, Some source ->
    Load_path.init cmt.cmt_loadpath;
    Envaux.reset_cache ();
    Allowlist.reset_library (List.map fst cmt.cmt_imports);
    let source = if Filename.is_relative source then Filename.concat cmt.cmt_builddir source else source in
    let attributes = Allowlist.denied_attributes (Pparse.parse_implementation ~tool_name:"ocamlc" source) in
    attributes @ Allowlist.denied_paths ~env_of:Envaux.env_of_only_summary ~unit_name:cmt.cmt_modname str
  | _ -> prerr_endline "not a complete implementation"; exit 2

let () =
  match Array.to_list Sys.argv with
  | _ :: "--values" :: path :: includes -> print_values path includes
  | [_; "--once"; request] ->
    (* `k` needs a second fresh process when its oracle program fails: the server's, not this mode *)
    output_string proto (match handle request with 0, data -> data | _ -> reply (2, "k: use the server\n"));
    flush proto
  | [_; "--check-cmt"; file] -> output_string proto (String.concat " " (check_cmt file) ^ "\n"); flush proto
  | [_] ->
    ignore (Lazy.force Allowlist.list);  (* parsed once, by the parent: ~5 ms a child would pay *)
    prepare_parent_gc ();
    output_string proto "ready\n"; flush proto;  (* the client's start-up probe *)
    (try while true do serve_forked (input_line stdin) done with End_of_file -> ())
  | _ -> prerr_endline "usage: compile_server [--once REQUEST | --check-cmt FILE.cmt | --values MODULE [INCDIR...]]"; exit 2
