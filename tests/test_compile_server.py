"""The grader's compile server (issue #12): ocamlc's outputs, no state carried between requests,
stopped and restarted on a time-out or a crash, a clear error when it cannot be built, and the
same grades as the one-ocamlc-per-step path. Real compiler and sandbox throughout."""
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from conftest import ADD, GRADED, fenced, read_rows
from ocaml_grpo.grading import server as cs
from ocaml_grpo.grading.completions import assemble_solution
from ocaml_grpo.grading.grader import OcamlGrader
from ocaml_grpo.problems import load_problems
from ocaml_grpo.config.settings import cache_dir, from_env
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.grading.toolcache import ToolchainError
from rewards import RewardConfig, RewardScorer

WARN_OFF = ["-w", "-a", "-alert", "-all"]
# Exponential type printing: the error message for x30 takes far longer than any limit here.
BLOW_UP = ("let bad : int =\n  let x0 = 0 in\n"
           + "".join(f"  let x{i} = (x{i - 1}, x{i - 1}) in\n" for i in range(1, 31)) + "  x30\n")


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox()


@pytest.fixture()
def server(sandbox, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    os.chmod(root, 0o755)
    s = cs.CompileServer(sandbox, cs.build_server(cache_dir(os.environ)), root)
    yield s
    s.stop()


def job(server: cs.CompileServer, name: str, files: dict[str, str]) -> Path:
    d = server.root / name
    d.mkdir()
    for f, text in files.items():
        (d / f).write_text(text)
    return d


def ocamlc(args: list[str], cwd: Path) -> tuple[int, str]:
    r = subprocess.run(["ocamlc", *args], cwd=cwd, capture_output=True, text=True)
    return r.returncode, r.stderr


CASES = {
    "ok.ml": "type t = A | B of int\nlet f = function A -> 0 | B n -> n\nlet g = List.map f\n",
    "type_error.ml": "let x = 1 +. 2.0\nlet y = \"a\" ^ 1\n",
    "syntax_error.ml": "let f x = (x +\nlet y = 2\n",
    "weak.ml": "let g = List.map (fun x -> x)\n",
    "warnings_on.ml": "[@@@warning \"+a\"]\nlet f x = let y = 1 in x\nlet z : int = \"no\"\n",
    "warn_error.ml": "[@@@warning \"@a\"]\nlet f x = let y = 1 in x\n",
    # values judged by their declaration: the allowlist check reads the library's interfaces
    "by_identity.ml": "module H = struct include MoreLabels.Hashtbl end\nlet f = H.length\n"
                      "module S = Set.Make (String)\nlet e = S.empty\n",
}


@pytest.mark.parametrize("flags,args", [("a", ["-c"]), ("i", ["-i"]), ("-", ["-c"])])
def test_outputs_are_ocamlc_s(server, tmp_path, flags, args):
    ref = tmp_path / "ref"
    ref.mkdir()
    d = job(server, "j", CASES)
    for f, text in CASES.items():
        (ref / f).write_text(text)
        rc, err = ocamlc(WARN_OFF + args + [f], ref)
        rep = server.request(d, ["c", flags, f], 20)
        assert (rep.returncode == 0, rep.output) == (rc == 0, err), f
        for ext in (".cmo", ".cmi"):
            a, b = d / f.replace(".ml", ext), ref / f.replace(".ml", ext)
            assert a.exists() == b.exists() and (not a.exists() or a.read_bytes() == b.read_bytes()), f + ext


def test_parse_only_and_link_are_ocamlc_s(server, tmp_path):
    files = {"h.ml": "let hello () = print_string \"hi\"\n", "t.ml": "let () = H.hello ()\n",
             "bad.ml": "let f = (\n"}
    ref = tmp_path / "ref"
    ref.mkdir()
    d = job(server, "j", files)
    for f, text in files.items():
        (ref / f).write_text(text)
    assert ocamlc(WARN_OFF + ["-c", "h.ml"], ref)[0] == 0
    assert server.request(d, ["c", "-", "h.ml"], 20).returncode == 0
    assert ocamlc(WARN_OFF + ["-o", "prog", "h.cmo", "t.ml"], ref)[0] == 0
    assert server.request(d, ["o", "prog", "h.cmo", "t.ml"], 20).returncode == 0
    assert (d / "prog").read_bytes() == (ref / "prog").read_bytes()
    assert subprocess.run(["./prog"], cwd=d, capture_output=True, text=True).stdout == "hi"
    rc, err = ocamlc(["-stop-after", "parsing", "-c", "bad.ml"], ref)
    rep = server.request(d, ["c", "pW", "bad.ml"], 20)
    assert (rep.returncode, rep.output) == (rc, err) and rc != 0


def test_no_state_leaks_between_requests(server, tmp_path):
    """What one request defines, enables or numbers is gone at the next: its types, modules and
    exceptions are unbound, its warning settings off, and a unit compiles to the same bytes."""
    first = {"defs.ml": "[@@@warning \"@a\"]\ntype t = A\nmodule M = struct let v = 1 end\nexception E\n"
                        "let f x = x\n"}
    uses = {"uses.ml": "let a = A\nlet b = M.v\nlet c = raise E\n", "again.ml": "let f x = let y = 1 in x\n"}
    d1, d2 = job(server, "j1", first), job(server, "j2", uses)
    ref = tmp_path / "ref"
    ref.mkdir()
    for f, text in uses.items():
        (ref / f).write_text(text)
    assert server.request(d1, ["c", "-", "defs.ml"], 20).returncode == 0
    for f in uses:
        rc, err = ocamlc(WARN_OFF + ["-c", f], ref)
        rep = server.request(d2, ["c", "-", f], 20)
        assert (rep.returncode, rep.output) == (rc, err), f  # "Unbound constructor A"; no warning-error
    assert server.request(d2, ["c", "-", "again.ml"], 20).returncode == 0
    assert (d2 / "again.cmo").read_bytes() == (ref / "again.cmo").read_bytes()
    assert server.starts == 1


def test_a_time_out_stops_the_server_and_the_next_request_gets_a_fresh_one(server):
    d = job(server, "j", {"blow.ml": BLOW_UP, "ok.ml": "let x = 1\n"})
    t0 = time.monotonic()
    rep = server.request(d, ["c", "-", "blow.ml"], 1.0)
    assert rep.timed_out and time.monotonic() - t0 < 1.0 + 1.0
    assert server.request(d, ["c", "-", "ok.ml"], 20).returncode == 0
    assert server.starts == 2


def test_a_crashed_server_is_replaced_and_the_request_retried(server, sandbox):
    d = job(server, "j", {"ok.ml": "let x = 1\n"})
    assert server.request(d, ["c", "-", "ok.ml"], 20).returncode == 0
    proc = server._proc
    if proc.uid is not None:  # kill the server itself (its uid's only process), as a crash would
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                if os.stat(f"/proc/{pid}").st_uid == proc.uid:
                    os.kill(pid, 9)
            except (FileNotFoundError, ProcessLookupError):
                pass
    else:
        os.killpg(proc.proc.pid, 9)
    time.sleep(0.2)
    rep = server.request(d, ["c", "-", "ok.ml"], 20)
    assert rep.returncode == 0 and not rep.timed_out
    assert server.starts == 2


# Requests that leave state behind in a compiler that serves requests one after another: a
# warning turned into an error then a compile error (the error counter stayed set), a fatal
# warning alone, a typed tree larger than the file-size limit, deep nesting, flags of every kind.
HOSTILE = {
    "warn_error_then_error.ml": "[@@@warning \"@a\"]\nlet f x = let y = 1 in x\nlet z : int = \"no\"\n",
    "fatal_warning.ml": "[@@@warning \"@a\"]\nlet f x = let y = 1 in x\n",
    "big_table.ml": "let table = [|" + ";".join(f"({i}, \"{'x' * 20}{i}\")" for i in range(4000)) + "|]\n",
    "deep.ml": "let deep = " + "[" * 2000 + "]" * 2000 + "\n",
    "defines.ml": "type t = A\nexception E\nmodule M = struct let v = 1 end\n",
    "syntax.ml": "let f x = (x +\n",
}
HONEST = {
    "ok.ml": "let add a b = a + b\nlet xs = List.map (fun x -> x * 2) [1; 2]\n",
    "uses.ml": "let a = A\nlet b = M.v\n",
    "unused.ml": "let f x = let y = 1 in x\n",
    "type_error.ml": "let x = 1 +. 2.0\n",
}


def test_any_sequence_of_requests_gets_a_fresh_ocamlc_s_verdicts(server, tmp_path):
    """Differential: shuffled hostile and honest requests through one server, each answered as a
    new `ocamlc` answers it alone (exit status and message), whatever came before."""
    import random
    files = {**HOSTILE, **HONEST}
    d = job(server, "j", files)
    ref = {}
    for f, text in files.items():
        alone = tmp_path / f"ref_{f}"
        alone.mkdir()
        (alone / f).write_text(text)
        ref[f] = ocamlc(WARN_OFF + ["-c", f], alone)
    rng = random.Random(0)
    order = [f for f in files for _ in range(3)]
    rng.shuffle(order)
    for f in order:
        rep = server.request(d, ["c", "a", f], 30)
        assert (rep.returncode, rep.output) == ref[f], f
    assert server.starts == 1  # no request needed a restart


def test_an_honest_grade_does_not_depend_on_its_group_mates():
    """One completion cannot lower another's grade through the compile server (in GRPO that would
    raise its own advantage): the honest answer's Grade is the same alone and after each of the
    hostile requests on the same (single) server."""
    s = RewardScorer(RewardConfig(min_lines=0, workers=1))
    try:
        honest = fenced("let add a b = a + b")
        alone = asdict(s.grader.grade(*_graded(honest)))
        for code in HOSTILE.values():
            s.grader.grade(*_graded(fenced(code + "let add a b = a + b\n")))
            assert asdict(s.grader.grade(*_graded(honest))) == alone, code[:40]
        assert alone["tests_passed"] == alone["tests_total"] == 7
    finally:
        s.close()


def _graded(completion: str) -> tuple:
    solution, entries = assemble_solution(completion.split("```ocaml\n")[1].split("\n```")[0], ADD.prompt,
                                          ADD.entry_point)
    return solution, ADD.tests, [], entries, ADD.prompt


@pytest.mark.parametrize("code", [BLOW_UP.replace("let bad : int =", "let add a b = a + b\nlet bad : int ="),
                                  "let add a b = a + b\nlet deep = " + "[" * 3000 + "]" * 3000 + "\n"])
def test_a_pathological_completion_costs_at_most_one_compile_limit(monkeypatch, code):
    s = RewardScorer(from_env(RewardConfig, {"OCAML_COMPILE_LIMIT_S": "2", "MIN_NON_EMPTY_LINES": "0",
                                            "REWARD_WORKERS": "2"}))
    try:
        assert s.grader.compiler == "server"
        t0 = time.monotonic()
        b = s.score_one(ADD, fenced(code))
        assert time.monotonic() - t0 < 2 + 1.5
        assert b.tests == 0.0
        # and the next completion is graded normally, by a fresh server
        assert s.score_one(ADD, fenced("let add a b = a + b")).reward == 1.0
    finally:
        s.close()


def test_build_errors_name_what_to_install(tmp_path):
    no_findlib = {**os.environ, "PATH": str(tmp_path / "empty")}
    with pytest.raises(ToolchainError, match="ocaml-findlib"):
        cs.build_server(cache=tmp_path / "c1", environ=no_findlib)
    # A findlib search path holding every installed package but compiler-libs.
    site = tmp_path / "site"
    site.mkdir()
    for d in subprocess.run(["ocamlfind", "printconf", "path"], capture_output=True, text=True).stdout.split():
        for meta in Path(d).glob("*/META"):
            if meta.parent.name != "compiler-libs" and not (site / meta.parent.name).exists():
                (site / meta.parent.name).symlink_to(meta.parent)
    stdlib = subprocess.run(["ocamlfind", "printconf", "stdlib"], capture_output=True, text=True).stdout.strip()
    conf = tmp_path / "findlib.conf"
    conf.write_text(f'destdir="{site}"\npath="{site}"\nstdlib="{stdlib}"\nldconf="{stdlib}/ld.conf"\n')
    no_libs = {**os.environ, "OCAMLFIND_CONF": str(conf)}
    with pytest.raises(ToolchainError, match="compiler-libs.*ocaml-compiler-libs"):
        cs.build_server(cache=tmp_path / "c2", environ=no_libs)
    exe = cs.build_server(cache=tmp_path / "c3")
    assert exe.exists() and cs.build_server(cache=tmp_path / "c3") == exe  # built once, then cached


def test_both_compilers_give_the_same_grades():
    """The server path against one `ocamlc` per step, on the project's graded rows and on the
    bundled problems' answers, stubs, type errors and syntax errors."""
    sb = Sandbox()
    a, b = OcamlGrader(sb, compiler="server"), OcamlGrader(sb, compiler="ocamlc")
    try:
        jobs = []
        for p, r in zip(load_problems(str(GRADED)), read_rows(GRADED)):
            jobs += [(p, r["solution"]), (p, r["stub"])]
        for p in load_problems("bundled")[:12]:
            head = p.prompt.rstrip().splitlines()[-1]
            jobs += [(p, p.solution), (p, p.solution + "\nlet broken = (1 +\n"),
                     (p, f"{head}\n  let x = 1 +. 2.0 in\n  ignore x;\n  failwith \"no\"")]
        for p, code in jobs:
            sol, entries = assemble_solution(code, p.prompt, p.entry_point)
            ga, gb = a.grade(sol, p.tests, p.requires, entries, p.prompt), b.grade(sol, p.tests, p.requires, entries, p.prompt)
            assert asdict(ga) == asdict(gb), p.id
    finally:
        a.close()
        b.close()


def test_a_server_that_cannot_start_is_a_toolchain_error_not_a_compile_error(sandbox, tmp_path):
    broken = tmp_path / "compile_server"
    broken.write_text("not a program\n")
    broken.chmod(0o755)
    root = tmp_path / "root"
    root.mkdir()
    s = cs.CompileServer(sandbox, broken, root)
    d = root / "j"
    d.mkdir()
    with pytest.raises(ToolchainError, match="did not start"):
        s.request(d, ["c", "-", "x.ml"], 20)
