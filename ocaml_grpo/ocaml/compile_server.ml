(* A persistent `ocamlc` for the grader (ocaml_grpo/compile_server.py builds and drives it).

   One `ocamlc` process costs ~12 ms of start-up before it reads a line; this process pays it
   once and then compiles request after request with the compiler's own library
   (compiler-libs, the same code `ocamlc` runs), so its outputs are ocamlc's: the same .cmo,
   .cmi, dumps, executables and messages. It runs inside the toolchain sandbox like `ocamlc`
   did, under a CPU/memory rlimit; the client stops a request that overruns its compile budget
   by killing the process, and restarts it every N requests.

   Requests on stdin, one per line, fields separated by tabs (file names are the grader's own):
     DIR  c  FLAGS  FILE.ml        like `ocamlc -w -a -alert -all [opts] -c FILE.ml`, in DIR;
                                   FLAGS: letters, `-` for none: d = -dparsetree -dtypedtree
                                   -dump-into-file, i = -i (type check only, signature
                                   discarded), p = -stop-after parsing, W = ocamlc's default
                                   warnings instead of -w -a -alert -all
     DIR  o  OUT  FILE...          like `ocamlc -w -a -alert -all -o OUT FILE...` (.ml files are
                                   compiled first, then everything is linked with the stdlib)
   Reply on the original stdout: "ready" once started, then per request: "RC LEN\n" and LEN bytes: what ocamlc would have
   written on stderr (warnings a solution re-enabled, then the error). The length prefix means
   nothing in a message (solution text is quoted in it) can pass for a reply. *)

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

let warnings0 = Warnings.backup ()
(* The first call snapshots every registered Local_store reference (the type checker's state:
   identifiers, levels, the loaded .cmi); every request then starts from that snapshot. *)
let _ = Local_store.fresh ()
let ccobjs0, ccopts0, dllibs0 = !Clflags.ccobjs, !Clflags.all_ccopts, !Clflags.dllibs

(* Global state outside Local_store, reset before each request. *)
let reset () =
  Warnings.restore warnings0;
  Clflags.dump_parsetree := false; Clflags.dump_typedtree := false; Clflags.dump_into_file := false;
  Clflags.print_types := false; Clflags.stop_after := None; Clflags.output_name := None;
  Location.input_name := "_none_"; Location.input_lexbuf := None; Location.input_phrase_buffer := None;
  Typecore.reset_delayed_checks (); Typetexp.reset_type_variables ();
  Translmod.reset (); Translobj.reset (); Bytegen.reset (); Emitcode.reset ();
  Symtable.reset (); Bytelink.reset (); Dll.reset ();
  Clflags.ccobjs := ccobjs0; Clflags.all_ccopts := ccopts0; Clflags.dllibs := dllibs0

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
      (try Location.report_exception ppf x
       with x -> Format.fprintf ppf "Fatal error: exception %s@." (Printexc.to_string x));
      2 in
  Format.pp_print_flush ppf ();
  rc, Buffer.contents buf

(* What every request re-read from disk and never changes: the standard library directory's
   listing and its .cmi files (read-only data; each request still builds its own environment
   from them, as the toplevel does across phrases). Measured: -1.3 ms of the ~2.5 ms a request
   for an empty file cost. *)
let std_dir = Load_path.Dir.create Config.standard_library
let cmi_cache : (string, Cmi_format.cmi_infos) Hashtbl.t = Hashtbl.create 64
let () =
  let load_default = !Persistent_env.Persistent_signature.load in
  Persistent_env.Persistent_signature.load := fun ~unit_name ->
    match Load_path.find_uncap (unit_name ^ ".cmi") with
    | filename when Filename.dirname filename = Config.standard_library ->
      let cmi = match Hashtbl.find_opt cmi_cache filename with
        | Some c -> c
        | None -> let c = Cmi_format.read_cmi filename in Hashtbl.add cmi_cache filename c; c in
      Some { Persistent_env.Persistent_signature.filename; cmi }
    | _ | exception Not_found -> load_default ~unit_name

(* Compmisc.init_path for ocamlc's load path here ("" then the standard library, nothing else:
   no -I, no OCAMLPARAM), with the standard library's listing kept. `add` keeps the first
   directory's files first, as `init` does. *)
let init_path () =
  Load_path.reset ();
  Load_path.add (Load_path.Dir.create "");
  Load_path.add std_dir;
  Env.reset_cache ()

(* Compile.implementation ~start_from:Parsing, with init_path above (Compile_common.with_info). *)
let compile file () =
  let output_prefix = Filename.remove_extension file in
  (* Parsing alone reads no environment: skip building one (the grader parses every phrase of a
     completion with a syntax error on its own). *)
  let parse_only = Clflags.(should_stop_after Compiler_pass.Parsing) in
  if not parse_only then init_path ();
  let module_name = Compenv.module_of_filename file output_prefix in
  Env.set_unit_name module_name;
  let env = if parse_only then Env.empty else Compmisc.initial_env () in
  Compmisc.with_ppf_dump ~file_prefix:(output_prefix ^ ".cmo") @@ fun ppf_dump ->
  let info = { Compile_common.source_file = file; module_name; output_prefix; env; ppf_dump;
               tool_name = "ocamlc"; native = false } in
  Compile_common.implementation info
    ~backend:(fun info typed -> Compile.emit_bytecode info (Compile.to_bytecode info typed))

let set_flags flags =
  String.iter (function
    | 'd' -> Clflags.(dump_parsetree := true; dump_typedtree := true; dump_into_file := true)
    | 'i' -> Clflags.print_types := true
    | 'p' -> Clflags.stop_after := Some Clflags.Compiler_pass.Parsing
    | 'W' -> Warnings.restore default_warnings
    | _ -> ()) flags

let link out files () =
  let objs = List.map (fun f ->
    if Filename.check_suffix f ".ml" then (compile f (); Filename.remove_extension f ^ ".cmo") else f) files in
  init_path ();
  Bytelink.link objs out;
  Warnings.check_fatal ()

let handle line =
  match String.split_on_char '\t' line with
  | dir :: op :: args ->
    Sys.chdir dir;
    (match op, args with
     | "c", [flags; file] -> set_flags flags; run (compile file)
     | "o", out :: files -> run (link out files)
     | _ -> 2, "bad request\n")
  | _ -> 2, "bad request\n"

let () =
  output_string proto "ready\n"; flush proto;  (* the client's start-up probe *)
  try while true do
    let line = input_line stdin in
    let rc, out = Local_store.with_store (Local_store.fresh ()) (fun () -> reset (); handle line) in
    let out = if String.length out > max_reply then String.sub out 0 max_reply else out in
    Printf.fprintf proto "%d %d\n%s%!" rc (String.length out) out
  done with End_of_file -> ()
