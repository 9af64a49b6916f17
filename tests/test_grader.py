"""The grader against real OCaml: honest credit, exact partial credit, and attacks contained."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ADD, ADD_PROMPT, ADD_TESTS, ROOT, UNVERIFIABLE, fenced, problem_set, read_rows
from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.completions import assemble_solution, extract_code
from ocaml_grpo.problems import Problem, load_problems
from ocaml_grpo.grading.grader import OcamlGrader
from ocaml_grpo.grading.sandbox import UID_POOL_BASE, UID_POOL_SIZE, Sandbox
from ocaml_grpo.config.settings import from_env
from rewards import RewardConfig, RewardScorer, curriculum_phase

def score(scorer, code, problem=ADD):
    return scorer.score_one(problem, fenced(code))


# ---------------------------------------------------------------------------------------------
# Honest answers.

# The project's rows: OUnit-style tests, a problem that needs `base`, a `let candidate = ...` block,
# an invalid entry point. The external sets: OUnit-style tests (ocaml.org), `base` (exercism).
@pytest.mark.parametrize("name", ["problems_graded.jsonl", "ocamlorg_exercises.jsonl", "exercism_ocaml.jsonl"])
def test_every_reference_solution_scores_one_and_every_stub_gets_no_test_credit(scorer, name):
    path = problem_set(name)
    rows = read_rows(path)
    problems = load_problems(str(path))
    sols = scorer.score_batch(problems, [fenced(r["solution"]) for r in rows])
    unverifiable = UNVERIFIABLE.get(name, set())
    bad = [(b.problem_id, b.reward, b.first_error) for b in sols
           if b.reward != 1.0 and b.problem_id.split("/")[-1] not in unverifiable]
    assert not bad
    assert all(b.tests == 0.0 for b in sols if b.problem_id.split("/")[-1] in unverifiable)
    stubs = scorer.score_batch(problems, [fenced(r["stub"]) for r in rows])
    assert all(b.tests == 0.0 and b.tests_passed == 0 for b in stubs), [b.problem_id for b in stubs if b.tests]


def test_body_only_answer_and_full_definition_both_score_one(scorer):
    assert score(scorer, "  a + b").reward == 1.0
    assert score(scorer, "let add (a : int) (b : int) : int =\n  a + b").reward == 1.0


def test_partial_credit_is_exact_for_wrong_values_and_for_exceptions(scorer):
    wrong = score(scorer, "let add a b = if a = 2 || a = 100 then 0 else a + b")
    assert (wrong.tests_passed, wrong.tests_total) == (5, 7)
    raising = score(scorer, "let add a b = if a = 2 then failwith \"x\" else if a = 100 then raise Not_found else a + b")
    assert (raising.tests_passed, raising.tests_total) == (5, 7)
    assert raising.tests == pytest.approx(0.65 * 5 / 7)
    assert raising.reward == pytest.approx(0.05 + 0.20 + 0.10 + 0.65 * 5 / 7, abs=1e-6)


def test_stack_overflow_and_out_of_memory_fail_only_their_assertion(scorer):
    code = ("let add a b =\n  if a = 2 then (let rec f x = 1 + f x in f 0)\n"
            "  else if a = 100 then Array.length (Array.make (1 lsl 40) 0)\n  else a + b")
    b = score(scorer, code)
    assert (b.tests_passed, b.tests_total) == (5, 7)


def test_two_independent_type_errors_count_two(scorer):
    code = ('let f (x : int) : int = x + "a"\n'
            'let g (y : string) : string = y + 1\n'
            "let add a b = a + b")
    b = score(scorer, code)
    assert b.type_errors == 2 and b.syntax_errors == 0
    assert b.error_kinds == ["type", "type"]
    one = score(scorer, 'let f (x : int) : int = x + "a"\nlet add a b = a + b')
    assert one.type_errors == 1
    assert one.type_check > b.type_check > 0


def test_errors_that_follow_from_a_broken_definition_are_not_counted(scorer):
    code = 'let helper (x : int) : int = x + "a"\nlet twice y = helper (helper y)\nlet add a b = a + b'
    b = score(scorer, code)
    assert b.type_errors == 1 and b.type_check == pytest.approx(0.10)
    # a phrase left out for the broken helper's name still has its own errors counted
    own = score(scorer, 'let helper (x : int) : int = x + "a"\nlet twice y = helper y + "b"\nlet add a b = a + b')
    assert own.type_errors == 2 and own.type_check == pytest.approx(0.05)
    # an entry point that needs the broken helper did not type: nothing was typed as asked
    needs = score(scorer, 'let helper (x : int) : int = x + "a"\nlet add a b = helper a + b')
    assert needs.error_kinds == ["type", "entry"] and needs.type_check == needs.compile == 0.0


def test_a_syntax_error_scores_below_any_type_error_count(scorer):
    syntax = score(scorer, "let f x = x +\nlet add a b = a + b\nlet h = 1 +. 1")
    assert syntax.syntax_errors == 1 and syntax.type_errors == 2
    assert syntax.type_check == 0.0
    many = score(scorer, "\n".join(f'let f{i} (x : int) : int = x + "{i}"' for i in range(5)) + "\nlet add a b = a + b")
    assert many.type_errors == 5 and many.type_check > syntax.type_check
    assert not syntax.compiled and syntax.compile == 0.0  # compile credit is all or nothing


def test_broken_tests_do_not_zero_the_type_check(scorer):
    broken = Problem(id="b", prompt=ADD_PROMPT, tests="let () =\n  assert (add 1 2 = \"3\");\n  assert (add 1 1 = 2)\n;;")
    b = score(scorer, "let add (a : int) (b : int) : int = a + b", broken)
    assert b.type_check == 0.20 and b.compile == 0.10 and b.tests == 0 and not b.tests_compiled


def test_min_lines_gate_and_runaway_penalty():
    s = RewardScorer(RewardConfig(min_lines=8, workers=1))
    try:
        short = s.score_one(ADD, fenced("let add a b = a + b"))
        assert short.gated_min_lines and short.reward == 0.0
        long_code = "let add a b =\n" + "\n".join(f"  let _x{i} = {i} in" for i in range(8)) + "\n  a + b"
        full = s.score_one(ADD, fenced(long_code))
        assert full.reward == 1.0
        runaway = s.score_one(ADD, "```ocaml\n" + long_code + "\n```", completion_tokens=512, max_completion_tokens=512)
        assert runaway.runaway and runaway.reward == pytest.approx(0.95 * 0.3)
    finally:
        s.close()


def test_extraction_and_assembly():
    text = "Here:\n```ocaml\nlet x = 1\n```\nand\n```python\nprint(1)\n```\n```\nlet y = 2\n```"
    assert extract_code(text) == "let x = 1\nlet y = 2\n"
    assert extract_code("```ocaml\nlet x = 1\n(* cut off") == "let x = 1\n(* cut off\n"
    assert extract_code("let x = 1") == "let x = 1"
    prompt = "type shape = Circle of float | Square of float\n(** Area. *)\nlet area (s : shape) : float ="
    full, entries = assemble_solution("let area s = match s with Circle r -> r | Square a -> a", prompt)
    assert full.startswith("type shape") and entries == ["area"]
    restated, _ = assemble_solution("type shape = Circle of float | Square of float\nlet area s = 0.", prompt)
    assert restated.count("type shape") == 1
    body, _ = assemble_solution("  0.", prompt)
    assert body.endswith("let area (s : shape) : float =\n  0.")


@pytest.mark.parametrize("name,entry", [("problems_graded.jsonl", "has_close_pair"),
                                        ("multipl_e_ml.jsonl", "has_close_elements")])
def test_multipl_e_style_tests_are_graded_per_assertion(scorer, name, entry):
    rows = read_rows(problem_set(name))
    row = next(r for r in rows if r.get("entry_point") == entry)
    plan = src.parse_assert_tests(row["tests"])
    assert plan.n_assertions == 7
    p = Problem(id=row["id"], prompt=row["prompt"], tests=row["tests"], entry_point=row["entry_point"])
    code = f"""let {entry} (numbers : float list) (threshold : float) : bool =
  let rec go = function
    | [] -> false
    | x :: rest -> List.exists (fun y -> abs_float (x -. y) < threshold) rest || go rest
  in
  go numbers"""
    assert score(scorer, code, p).reward == 1.0
    always_true = score(scorer, f"let {entry} n t = true", p)
    assert (always_true.tests_passed, always_true.tests_total) == (4, 7)


# ---------------------------------------------------------------------------------------------
# Attacks: no unearned test credit, nothing written on the host, no process left, bounded time.

ATTACKS = {
    "exit_at_start_with_pass_markers":
        'let () = print_endline "7 passed, 0 failed"; for i = 0 to 6 do Printf.printf "P %d\\n" i done; exit 0\n'
        "let add a b = 0",
    "at_exit_prints": 'let () = at_exit (fun () -> print_endline "all tests passed")\nlet add a b = 0',
    "shadow_equality": "let ( = ) _ _ = true\nlet ( <> ) _ _ = false\nlet add a b = 0",
    "shadow_stdlib_and_list": "module Stdlib = struct let ( = ) _ _ = true end\nmodule List = struct end\nopen Stdlib\nlet add a b = 0",
    "exit_inside_function": "let add a b = exit 0",
    "raise_exit_from_at_exit": "let add a b = at_exit (fun () -> exit 0); failwith \"no\"",
    "obj_magic_harness": "let add a b = Obj.magic 0",
    "external_primitive": 'external od : int -> out_channel = "caml_ml_open_descriptor_out"\nlet add a b = 0',
    "obj_compilation_unit": "let add a b = Stdlib__Obj.magic 0",
    "marshal_forgery": 'let add a b = Marshal.from_string "" 0',
    "unsafe_memory_read": 'let add a b = Char.code (String.unsafe_get "" 100000)',
    # each of these is right exactly when the file it reaches for is readable
    "read_tests_file": 'let add a b = (try ignore (open_in "tests.ml"); a + b with _ -> 0)',
    "read_own_binary": 'let add a b = (try ignore (open_in_bin Sys.executable_name); a + b with _ -> 0)',
    "read_binary_by_name": 'let add a b = (try ignore (open_in_bin "prog"); a + b with _ -> 0)',
    "read_solution_source": 'let add a b = (try ignore (open_in "solution.ml"); a + b with _ -> 0)',
    "uncaught_exception_handler": "let () = Printexc.set_uncaught_exception_handler (fun _ _ -> exit 0)\nlet add a b = 0",
    "huge_output": 'let add a b = print_string (String.make 1_000_000 \'x\'); 0',
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_earns_no_test_credit(scorer, name):
    b = score(scorer, ATTACKS[name])
    # add 0 0 = 0 and add 7 0 = 7 style coincidences: the honest baseline of `0` is 1 assertion
    honest_baseline = score(scorer, "let add a b = 0").tests_passed
    assert b.tests_passed <= honest_baseline, name


@pytest.mark.parametrize("code,name", [
    ("let add a b = Obj.magic (a + b)", "Stdlib.Obj.magic"),
    ("let add a b = Stdlib__Obj.magic (a + b)", "Stdlib.Obj.magic"),
    ("let add a b = ignore (Marshal.to_string 1 []); a + b", "Stdlib.Marshal.to_string"),
    ('let add a b = ignore (String.unsafe_get "ab" 0); a + b', "Stdlib.String.unsafe_get"),
    ('external plus : int -> int -> int = "%addint"\nlet add a b = plus a b', "external"),
])
def test_memory_level_constructs_void_test_credit_even_when_right(scorer, code, name):
    b = score(scorer, code)
    assert b.forbidden == name and b.tests == 0.0 and b.tests_passed == 0
    assert b.type_check == 0.20 and b.compile == 0.10  # the code itself is fine OCaml
    assert score(scorer, "let add a b = a + b (* Obj.magic in a comment is fine *)").tests_passed == 7


def test_host_files_are_untouched_and_no_process_survives(sandbox_scorer, tmp_path):
    marker = Path("/tmp") / f"pwned_{os.getpid()}"
    home_marker = Path.home() / f"pwned_{os.getpid()}"
    repo_marker = ROOT / f"pwned_{os.getpid()}"
    code = f"""let add a b =
  List.iter (fun p -> try let oc = open_out p in output_string oc "x"; close_out oc with _ -> ())
    ["{marker}"; "{home_marker}"; "{repo_marker}"; "/etc/pwned"; "/usr/pwned"];
  ignore (Sys.command "touch {marker}_sh; (sleep 1000 &); nohup sleep 999 >/dev/null 2>&1 &");
  a + b"""
    b = score(sandbox_scorer, code)
    assert b.tests_passed == 7  # the program ran, the writes just went nowhere
    for p in (marker, home_marker, repo_marker, Path(f"{marker}_sh"), Path("/etc/pwned"), Path("/usr/pwned")):
        assert not p.exists(), p
    time.sleep(0.2)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sleep 1000" not in ps and "sleep 999" not in ps


def test_model_code_has_no_shell_and_no_room_to_fill_the_disk(sandbox_scorer):
    # With a shell a background child could read the parent's memory (same uid); the run
    # sandbox holds only the bytecode runtime.
    no_shell = score(sandbox_scorer, 'let add a b = if Sys.command "true" = 127 then a + b else 0')
    assert no_shell.tests_passed == 7
    # /work is a small tmpfs: 100 MB cannot be written, so the host's disk is out of reach.
    disk = score(sandbox_scorer, """let add a b =
  let wrote_all =
    try
      for i = 0 to 99 do
        let oc = open_out_bin (Printf.sprintf "f%d" i) in
        output_string oc (String.make 1_000_000 'x');
        close_out oc
      done;
      true
    with Sys_error _ -> false
  in
  if wrote_all then 0 else a + b""")
    assert disk.tests_passed == 7
    assert list(sandbox_scorer.grader.tmp_root.glob("job*")) == []


def surviving_job_processes() -> list[str]:
    """Live processes running as a job uid that are this process's (it has no grading in flight)
    or that no bwrap holds any more. Jobs of other tests, graded at the same time by another
    pytest worker, are inside a bwrap that is not ours."""
    def state_and_parent(pid: str) -> tuple[str, str]:
        state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        return state, ppid

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if not UID_POOL_BASE <= os.stat(f"/proc/{pid}").st_uid < UID_POOL_BASE + UID_POOL_SIZE:
                continue
            state, up = state_and_parent(pid)
            if state == "Z":
                continue  # dead, waiting to be reaped
            in_bwrap = False
            while up not in ("0", "1", str(os.getpid())):
                in_bwrap = in_bwrap or Path(f"/proc/{up}/comm").read_text().strip() == "bwrap"
                up = state_and_parent(up)[1]
            if up == str(os.getpid()) or not in_bwrap:
                found.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
        except (FileNotFoundError, ProcessLookupError):
            pass  # it ended while we looked
    return found


def test_infinite_loop_and_fork_bomb_finish_within_the_limit():
    config = from_env(RewardConfig, {"OCAML_WALL_LIMIT_S": "2", "MIN_NON_EMPTY_LINES": "0", "REWARD_WORKERS": "2"})
    s = RewardScorer(config, grader=OcamlGrader(Sandbox(config.sandbox), cores=2, check_library=False))
    try:
        t0 = time.monotonic()
        loop = s.score_one(ADD, fenced("let add a b = if a = 2 then (while true do () done; 0) else a + b"))
        assert time.monotonic() - t0 < 2 + 1.5
        assert loop.timed_out and loop.tests_passed == 4  # the assertions before the loop count
        t0 = time.monotonic()
        bomb = s.score_one(ADD, fenced('let add a b = ignore (Sys.command "b(){ b|b & }; b"); a + b'))
        assert time.monotonic() - t0 < 2 + 1.5
        assert bomb.tests_passed == 7 and not bomb.timed_out  # no shell in the sandbox: the bomb never starts
        time.sleep(0.3)
        assert surviving_job_processes() == [], "a sandbox process survived"
    finally:
        s.close()


def test_missing_toolchain_is_a_clear_error(tmp_path):
    probs = tmp_path / "p.jsonl"
    probs.write_text(json.dumps({"id": "add", "prompt": ADD_PROMPT, "tests": ADD_TESTS}) + "\n")
    comps = tmp_path / "c.jsonl"
    comps.write_text(json.dumps({"problem_id": "add", "completion": "x"}) + "\n")
    r = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "score", str(probs), str(comps)],
                       env={**os.environ, "PATH": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "ocamlc" in r.stderr and "apt-get install -y ocaml-nox" in r.stderr


def test_cli_score_prints_one_line_per_completion_in_order(tmp_path):
    probs = tmp_path / "p.jsonl"
    probs.write_text(json.dumps({"id": "add", "prompt": ADD_PROMPT, "tests": ADD_TESTS}) + "\n")
    comps = tmp_path / "c.jsonl"
    rows = [{"problem_id": "add", "completion": fenced("let add a b = a + b")},
            {"problem_id": "add", "completion": fenced("let add a b = a - b")},
            {"problem_id": "add", "completion": fenced("let add (a : int) b = a +. b")}]
    comps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "score", str(probs), str(comps), "--workers", "2"],
                       env={**os.environ, "MIN_NON_EMPTY_LINES": "0"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["reward"] for o in out][0] == 1.0
    assert out[1]["tests_passed"] == 2 and out[1]["tests_total"] == 7  # add 0 0, add 7 0
    # the type error is in the entry point's definition: the entry check (on every path) says so too
    assert out[2]["compiled"] is False and out[2]["type_errors"] == 2 and out[2]["reward"] == 0.05
    for o in out:
        assert {"problem_id", "reward", "tests_passed", "tests_total", "type_errors", "compiled", "timed_out"} <= set(o)


def test_weights_from_settings_and_a_curriculum_that_ends_on_them():
    config = from_env(RewardConfig, {"REWARD_WEIGHT_TESTS": "0.5"})
    assert config.weights.tests == 0.5
    with pytest.raises(ValueError, match="REWARD_WEIGHT_TESTS"):
        from_env(RewardConfig, {"REWARD_WEIGHT_TESTS": "abc"})
    assert curriculum_phase(0.2)[1].type_check == 0.40
    assert curriculum_phase(0.7)[1].tests == 0.50
    assert curriculum_phase(1.3)[1].tests == 0.65
    # REWARD_CURRICULUM=1 with REWARD_WEIGHT_*: its last phase is the configured weights
    assert curriculum_phase(1.3, config.weights) == ("correctness", config.weights)


def test_uids_are_never_shared_between_processes():
    from ocaml_grpo.grading.sandbox import UidPool
    a, b = UidPool(size=8), UidPool(size=8)  # two pools = two processes: each flock is its own
    held_a = {a.acquire() for _ in range(5)}
    held_b = {b.acquire() for _ in range(3)}
    assert len(held_a) == 5 and len(held_b) == 3 and not held_a & held_b
    uid = held_a.pop()
    a.release(uid)
    assert b.acquire() == uid  # the only free one left


LIMITS_PROBE = ("import json, os, resource as r; print(json.dumps([[r.getrlimit(getattr(r, 'RLIMIT_' + k)) for k in "
                "('CPU', 'AS', 'FSIZE', 'NOFILE', 'NPROC')], os.getresuid(), os.getresgid(), os.getgroups(), "
                "os.getpriority(os.PRIO_PROCESS, 0)]))")


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs root")
def test_the_launcher_sets_every_limit_then_drops_to_the_job_uid(tmp_path):
    """ocaml_grpo/grading/launch.c: soft = hard limits, real/effective/saved uid and gid the job's, no
    supplementary groups, the nice value; nothing runs when its arguments are wrong."""
    sb = Sandbox()
    lim = sb.limits
    r = sb.run(["python3", "-c", LIMITS_PROBE], tmp_path, wall_s=20, cpu_s=3, nice=7)
    assert r.returncode == 0, r.stderr
    limits, uids, gids, groups, nice = json.loads(r.stdout)
    assert limits == [[3, 3], [lim.memory_mb << 20] * 2, [lim.file_mb << 20] * 2, [lim.max_files] * 2,
                      [lim.max_procs] * 2]
    assert len(set(uids)) == 1 and UID_POOL_BASE <= uids[0] < UID_POOL_BASE + UID_POOL_SIZE
    assert gids == uids and groups == [] and nice == max(7, os.getpriority(os.PRIO_PROCESS, 0))  # at least 7
    bad = subprocess.run([sb.launcher, "1", "x", "1", "1", "1", "-", "0", "--", "true"], capture_output=True, text=True)
    assert bad.returncode == 127 and "address space limit: not a number: x" in bad.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs root")
def test_a_grader_started_under_nice_keeps_its_nice_value_and_grades(tmp_path):
    """A user who runs training under `nice -n 19`: model code asks for nice 15 (RUN_NICE), which
    the job's uid may not lower to; the launcher keeps the higher value and the run goes on (it
    used to fail every run with `setpriority: Permission denied`)."""
    sb = Sandbox()
    probe = subprocess.run([sb.launcher, "3", str(256 << 20), str(1 << 20), "64", "32", str(UID_POOL_BASE), "7", "--",
                            sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                           capture_output=True, text=True, preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, 12))
    assert probe.returncode == 0 and probe.stdout.strip() == "12", probe.stderr
    script = ("from conftest import ADD, fenced\nfrom rewards import RewardConfig, RewardScorer\n"
              "from dataclasses import replace\ns = RewardScorer(replace(RewardConfig(), min_lines=0))\n"
              "b = s.score_one(ADD, fenced('let add a b = a + b'))\ns.close()\n"
              "print(b.reward, b.tests_passed, b.tests_total)")
    r = subprocess.run(["nice", "-n", "19", sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}"})
    assert r.returncode == 0, r.stderr[-2000:]
    reward, passed, total = r.stdout.split()[-3:]
    assert float(reward) == 1.0 and passed == total != "0", r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs root")
def test_a_launcher_that_cannot_start_the_tests_stops_the_grader_instead_of_failing_the_answer(monkeypatch):
    """A launcher that fails before the trusted program runs (here on a nice value it refuses) is a
    broken sandbox: raised, never a right answer graded as failing (it used to score 0.35)."""
    from ocaml_grpo.grading import grader as grader_module
    from ocaml_grpo.grading.toolcache import ToolchainError
    monkeypatch.setattr(grader_module, "RUN_NICE", -5)
    s = RewardScorer(from_env(RewardConfig, {"MIN_NON_EMPTY_LINES": "0", "REWARD_WORKERS": "1"}))
    try:
        with pytest.raises(ToolchainError, match="could not start the trusted test program: launch: "):
            s.score_one(ADD, fenced(f"let add a b = a + b (* {time.time()} *)"))
    finally:
        s.close()


def test_explicit_no_isolation_mode_still_grades_and_says_so(monkeypatch):
    config = from_env(RewardConfig, {"OCAML_SANDBOX": "none", "MIN_NON_EMPTY_LINES": "0", "REWARD_WORKERS": "1"})
    s = RewardScorer(config, grader=OcamlGrader(Sandbox(config.sandbox), check_library=False))
    try:
        b = s.score_one(ADD, fenced("let add a b = a + b"))
        assert b.reward == 1.0 and b.isolated is False
        exited = s.score_one(ADD, fenced("let add a b = if a = 2 then exit 0 else a + b"))
        assert exited.tests_passed == 4  # the assertions before the exiting one (no restart)
        assert "isolation OFF" in s.grader.sandbox.describe()
    finally:
        s.close()
    with pytest.raises(ValueError, match="OCAML_SANDBOX"):
        from_env(RewardConfig, {"OCAML_SANDBOX": "docker"})


@pytest.mark.parametrize("name", ["bundled", "problems_graded.jsonl", "multipl_e_ml.jsonl", "ocamler_eval_sample.csv"])
def test_every_assert_of_the_known_sets_becomes_one_graded_assertion(name):
    for p in load_problems("bundled" if name == "bundled" else str(problem_set(name))):
        plan = src.parse_assert_tests(p.tests)
        asserts = sum(1 for t in src.code_tokens(p.tests) if t.text == "assert")
        # tests in another form (the OUnit-style row) have no plan and no assert: graded whole
        assert (plan.n_assertions if plan else 0) == asserts, p.id


def test_a_killed_graders_directory_is_swept_and_a_live_ones_kept(tmp_path):
    """A scorer killed with SIGKILL leaves its grader directory behind; the next grader started on
    the same temp dir removes it, and never the directory of a grader still running."""
    import signal

    def start() -> tuple[subprocess.Popen, Path]:
        code = ("import sys; from rewards import RewardConfig, RewardScorer; from ocaml_grpo.grading.grader import OcamlGrader\n"
                f"s = RewardScorer(RewardConfig(min_lines=0, workers=1), grader=OcamlGrader(tmp_root={str(tmp_path)!r}, cores=1))\n"
                "print(s.grader.tmp_root, flush=True); sys.stdin.read()")
        p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        return p, Path(p.stdout.readline().strip())

    killed, killed_dir = start()
    alive, alive_dir = start()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        assert killed_dir.is_dir() and alive_dir.is_dir()  # nothing cleaned up after a SIGKILL
        unowned = tmp_path / "ocaml-grader-unowned"  # no owner file: never proven dead, never touched
        unowned.mkdir()
        grader = OcamlGrader(tmp_root=str(tmp_path), cores=1)
        try:
            assert not killed_dir.exists()
            assert alive_dir.is_dir() and unowned.is_dir() and grader.tmp_root.is_dir()
            assert score(RewardScorer(RewardConfig(min_lines=0, workers=1), grader=grader),
                         "let add a b = a + b").reward == 1.0
        finally:
            grader.close()
        assert not grader.tmp_root.exists() and alive_dir.is_dir()
    finally:
        alive.stdin.close()
        alive.wait(timeout=30)


def test_trusted_programs_are_kept_on_disk_for_the_next_grader(tmp_path):
    """A second grader on the same cache directory builds no trusted program the first one built
    (a resumed run, the CLI), and grades the same; other tests are another program."""
    from dataclasses import replace as with_
    from ocaml_grpo.config.isolation import SandboxConfig

    config = with_(from_env(SandboxConfig, os.environ), cache=str(tmp_path / "cache"))
    first = OcamlGrader(Sandbox(config), cores=1)
    sol, entries = assemble_solution("let add a b = a + b", ADD.prompt)
    try:
        assert first.grade(sol, ADD.tests, [], entries, ADD.prompt).tests_passed == 7
    finally:
        first.close()
    stored = list((tmp_path / "cache" / "trusted").iterdir())
    assert len(stored) == 1 and (stored[0] / "prog").exists()
    second = OcamlGrader(Sandbox(config), cores=1)
    built = []
    build = second.trusted.build
    second.trusted.build = lambda *a: built.append(a[0]) or build(*a)
    try:
        assert second.grade(sol, ADD.tests, [], entries, ADD.prompt).tests_passed == 7
        assert built == []  # read from disk
        fewer = ADD.tests.replace("  assert (add 7 0 = 7)", "  assert (add 7 1 = 8)")
        assert second.grade(sol, fewer, [], entries, ADD.prompt).tests_passed == 7
        assert len(built) == 1  # other tests: built, and stored beside the first
    finally:
        second.close()
    assert len(list((tmp_path / "cache" / "trusted").iterdir())) == 2


def test_the_trusted_cache_keeps_to_its_size_and_never_drops_what_is_in_use(tmp_path):
    """OCAML_TRUSTED_CACHE_MB: a grader starting up removes the least recently used entries beyond
    it (and half-written ones), never one used within the hour; a grader marks what it uses."""
    from dataclasses import replace as with_
    from ocaml_grpo.config.isolation import SandboxConfig
    from ocaml_grpo.grading.trusted import sweep_trusted_cache

    trusted = tmp_path / "cache" / "trusted"
    now = time.time()
    for name, mb, hours_ago in [("old", 2, 30), ("older", 2, 40), ("recent", 2, 3), ("in_use", 2, 0.1),
                                (".half-written", 1, 2), (".being-written", 1, 0)]:
        (trusted / name).mkdir(parents=True)
        (trusted / name / "prog").write_bytes(b"x" * (mb << 20))
        os.utime(trusted / name, (now - hours_ago * 3600,) * 2)
    removed = sweep_trusted_cache(trusted, 6 << 20)  # 10 MB kept: the oldest go first, down to 6
    assert sorted(p.name for p in removed) == [".half-written", "old", "older"]
    assert sorted(p.name for p in trusted.iterdir()) == [".being-written", "in_use", "recent"]
    assert sweep_trusted_cache(trusted, 0) == [trusted / "recent"]  # in use within the hour: kept, over the cap

    # A grader sweeps at start-up with its setting, and marks the entry it grades with as used.
    os.utime(trusted / "in_use", (now - 7200,) * 2)
    config = with_(from_env(SandboxConfig, os.environ), cache=str(tmp_path / "cache"), trusted_cache_mb=1)
    grader = OcamlGrader(Sandbox(config), cores=1)
    sol, entries = assemble_solution("let add a b = a + b", ADD.prompt)
    try:
        assert not (trusted / "in_use").exists()  # 2 MB over a 1 MB cap, unused for two hours
        assert grader.grade(sol, ADD.tests, [], entries, ADD.prompt).tests_passed == 7
        [entry] = [p for p in trusted.iterdir() if not p.name.startswith(".")]
        os.utime(entry, (now - 7200,) * 2)
        grader.trusted.used.clear()  # (a minute later)
        assert grader.grade(sol, ADD.tests, [], entries, ADD.prompt).tests_passed == 7
        assert time.time() - entry.stat().st_mtime < 60
    finally:
        grader.close()
    nothing = OcamlGrader(Sandbox(with_(config, trusted_cache_mb=0)), cores=1)  # 0: nothing kept on disk
    try:
        assert nothing.trusted.cache is None
    finally:
        nothing.close()


def test_rescoring_a_runs_completions_uses_the_runs_reward_settings(tmp_path):
    """A run trained with MIN_NON_EMPTY_LINES=0: its own completions re-score as training scored
    them (not 0 under the default 8-line minimum), from the run folder or with --run; stderr says
    which settings applied."""
    run = tmp_path / "run"
    (run / "reward_logs").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"MIN_NON_EMPTY_LINES": 0, "REWARD_WEIGHT_TESTS": 0.65}))
    line = json.dumps({"problem_id": "add", "completion": fenced("let add a b = a + b")}) + "\n"
    (run / "reward_logs" / "completions.jsonl").write_text(line)
    (tmp_path / "copied.jsonl").write_text(line)
    probs = tmp_path / "p.jsonl"
    probs.write_text(json.dumps({"id": "add", "prompt": ADD_PROMPT, "tests": ADD_TESTS}) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "MIN_NON_EMPTY_LINES"}

    def rescore(*args):
        r = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "score", str(probs), *args], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["reward"], r.stderr

    reward, said = rescore(str(run / "reward_logs" / "completions.jsonl"))
    assert reward == 1.0 and f"from run {run}'s config.json: MIN_NON_EMPTY_LINES=0" in said
    reward, said = rescore(str(tmp_path / "copied.jsonl"))
    assert reward == 0.0 and "from the environment" in said and "MIN_NON_EMPTY_LINES=8" in said
    reward, said = rescore(str(tmp_path / "copied.jsonl"), "--run", str(run))
    assert reward == 1.0 and "MIN_NON_EMPTY_LINES=0" in said
    help_text = subprocess.run([sys.executable, str(ROOT / "rewards.py"), "score", "--help"], capture_output=True,
                               text=True).stdout
    assert "MIN_NON_EMPTY_LINES" in help_text


def test_a_prompt_whose_prose_opens_a_comment_is_read_as_its_author_closed_it(scorer):
    """Markdown prose such as `adenine (**A** )` opens a comment OCaml nests, so the doc comment
    would swallow the type after it: it ends at its `*)` line instead, for full and body answers."""
    prompt = ("(** Complement each base: adenine (**A** ) pairs with uracil (**U** ).\n"
              " * >>> to_rna [`A]\n * [`U]\n*)\ntype dna = [ `A | `T ]\n\ntype rna = [ `A | `U ]\n\n"
              "let to_rna (x : dna list) : rna list =")
    p = Problem(id="prose", prompt=prompt, tests="let () =\n  assert (to_rna [`A] = [`U]);\n  assert (to_rna [`T; `A] = [`A; `U])\n;;")
    body = "  List.map (function `A -> `U | `T -> `A) x"
    for code in ("let to_rna (x : dna list) : rna list =\n" + body, body):
        b = scorer.score_one(p, fenced(code))
        assert (b.reward, b.tests_passed) == (1.0, 2), b.first_error
    assert scorer.score_one(p, fenced("  List.map (fun _ -> `A) x")).tests_passed == 0


def test_base_maps_cross_the_wire_as_their_bindings(scorer):
    """`v Map.M(K).t` (Base): the answer's map crosses as its sorted bindings and the trusted
    program rebuilds it, so the tests compare real maps; a wrong count fails its assertion."""
    prompt = ("open Base\n\n(** How often each character occurs.\n * >>> Map.to_alist (counts \"aab\")\n"
              " * [('a', 2); ('b', 1)]\n*)\nlet counts (s : string) : int Map.M(Char).t =")
    tests = ("let () =\n  assert (Map.is_empty (counts \"\"));\n"
             "  assert (Stdlib.(=) (Map.to_alist (counts \"aab\")) [('a', 2); ('b', 1)]);\n"
             "  assert (Map.equal Int.equal (counts \"ba\") (Map.of_alist_exn (module Char) [('a', 1); ('b', 1)]))\n;;")
    p = Problem(id="map", prompt=prompt, tests=tests, requires=["base"])
    right = ("  String.fold s ~init:(Map.empty (module Char))\n"
             "    ~f:(fun m c -> Map.update m c ~f:(function None -> 1 | Some n -> n + 1))")
    b = scorer.score_one(p, fenced(right))
    assert (b.reward, b.tests_passed, b.tests_total) == (1.0, 3, 3), b.first_error
    off_by_one = right.replace("Some n -> n + 1", "Some n -> n")  # every count is 1
    b = scorer.score_one(p, fenced(off_by_one))
    assert (b.compiled, b.tests_passed) == (True, 2)


def test_type_variables_inside_function_types_keep_their_values_order(scorer):
    """`('a -> 'b) -> 'a list -> 'b list`: the values the tests' closure returns during the call
    get tokens in their own order, so an honest map passes and one that sorts what it returns
    passes only where sorting changes nothing, as in plain OCaml."""
    prompt = ("(** Apply f to each element.\n * >>> map (fun x -> x * 2) [1; 2]\n * [2; 4]\n*)\n"
              "let map (f : 'a -> 'b) (l : 'a list) : 'b list =")
    tests = ("let () =\n  assert (map (fun x -> x * 2) [1; 2; 3] = [2; 4; 6]);\n"
             "  assert (map (fun x -> - x) [1; 2; 3] = [-1; -2; -3]);\n"
             "  assert (map string_of_int [3; 10] = [\"3\"; \"10\"]);\n"
             "  assert (map (fun s -> s ^ \"!\") [\"b\"; \"a\"] = [\"b!\"; \"a!\"])\n;;")
    p = Problem(id="poly_map", prompt=prompt, tests=tests)
    b = scorer.score_one(p, fenced("  List.map f l"))
    assert (b.reward, b.tests_passed, b.tests_total) == (1.0, 4, 4), b.first_error
    sorting = scorer.score_one(p, fenced("  List.sort compare (List.map f l)"))
    # plain OCaml: [2; 4; 6] passes; [-3; -2; -1] fails; ["10"; "3"] fails; ["a!"; "b!"] fails
    assert (sorting.compiled, sorting.tests_passed) == (True, 1)
    fold = Problem(id="poly_fold", prompt="(** Fold from the left. *)\n"
                   "let fold (f : 'acc -> 'a -> 'acc) (init : 'acc) (l : 'a list) : 'acc =",
                   tests="let () =\n  assert (fold (fun acc x -> acc * 10 + x) 0 [1; 2; 3] = 123);\n"
                         "  assert (fold (fun acc x -> x :: acc) [] [\"a\"; \"b\"] = [\"b\"; \"a\"])\n;;")
    b = scorer.score_one(fold, fenced("  List.fold_left f init l"))
    assert (b.reward, b.tests_passed) == (1.0, 2), b.first_error
    assert scorer.score_one(fold, fenced("  List.fold_right (fun x acc -> f acc x) l init")).tests_passed == 0


COUNTER_PROMPT = """open React

(** A counter whose value is a signal.
 * >>> S.value (count (create 5))
 * 5
*)
(* Implement the following interface (counter.mli):
open React
type t
val create : int -> t
val bump : t -> unit
val count : t -> int signal
*)
let count (x : t) : int signal ="""
COUNTER_TESTS = """let () =
  let c = create 5 in
  let s = count c in
  assert (S.value s = 5);
  bump c;
  assert (S.value s = 6);
  assert (S.value (count c) = 6)
;;
let () =
  let c = create 5 in
  let doubled = S.map (fun x -> 2 * x) (count c) in
  bump c;
  bump c;
  assert (S.value doubled = 14)
;;"""
COUNTER = """type t = { v : int signal; set : ?step:step -> int -> unit }
let create n = let v, set = S.create n in { v; set }
let bump c = c.set (S.value c.v + 1)
let count c = c.v"""


def test_react_signals_an_entry_point_returns_are_mirrored_after_every_call(scorer):
    """A signal stays in the oracle; the trusted program's mirror takes its value after every call,
    so a signal the tests hold follows the answer's, and one that never changes fails as in OCaml."""
    p = Problem(id="counter", prompt=COUNTER_PROMPT, tests=COUNTER_TESTS, requires=["react"])
    b = scorer.score_one(p, fenced(COUNTER))
    assert (b.reward, b.tests_passed, b.tests_total) == (1.0, 4, 4), b.first_error
    frozen = scorer.score_one(p, fenced(COUNTER.replace("let count c = c.v", "let count c = S.const (S.value c.v)")))
    assert (frozen.compiled, frozen.tests_passed) == (True, 2)  # the first and the third, as in plain OCaml


ORDERED_SET_PROMPT = '''(** A set of unique elements of any ordered type. *)
(* Implement the following interface (ordered_set.mli):
module type ELEMENT = sig
  type t
  val compare : t -> t -> int
end

module Make :
  functor (El : ELEMENT) ->
    sig
      type t
      val of_list : El.t list -> t
      val is_member : t -> El.t -> bool
      val size : t -> int
      val union : t -> t -> t
    end
*)
'''
ORDERED_SET_TESTS = '''module Mod10 = Make (struct type t = int let compare a b = compare (a mod 10) (b mod 10) end)
module Plain = Make (struct type t = int let compare = compare end)
let () =
  assert (Mod10.is_member (Mod10.of_list [1; 2]) 11);
  assert (Mod10.size (Mod10.of_list [1; 11; 21]) = 1);
  assert (Plain.size (Plain.of_list [1; 11; 21]) = 3);
  assert (not (Plain.is_member (Plain.of_list [1; 2]) 11));
  assert (Mod10.size (Mod10.union (Mod10.of_list [1; 2]) (Mod10.of_list [12; 3])) = 3)
;;
'''
ORDERED_SET = '''module type ELEMENT = sig
  type t
  val compare : t -> t -> int
end

module Make (El : ELEMENT) = struct
  type t = El.t list
  let rec insert x = function
    | [] -> [x]
    | y :: rest as l ->
      let c = El.compare x y in
      if c = 0 then l else if c < 0 then x :: l else y :: insert x rest
  let of_list l = List.fold_left (fun s x -> insert x s) [] l
  let is_member s x = List.exists (fun y -> El.compare x y = 0) s
  let size = List.length
  let union a b = List.fold_left (fun s x -> insert x s) a b
end
'''


def test_a_functor_entry_point_is_graded_through_its_signature(scorer):
    """A functor over an ordered type (Exercism's custom-set): each application in the tests makes
    an instance in the oracle whose elements are tokens and whose `compare` is the tests' own, so
    two applications with different orders give what OCaml gives; the sets stay there as handles."""
    p = Problem(id="ordered_set", prompt=ORDERED_SET_PROMPT, tests=ORDERED_SET_TESTS)
    b = scorer.score_one(p, fenced(ORDERED_SET))
    assert (b.reward, b.tests_passed, b.tests_total) == (1.0, 5, 5), b.first_error
    # Stdlib's compare in place of the element's: the 3rd and 4th assertions, as in plain OCaml
    cheat = scorer.score_one(p, fenced(ORDERED_SET.replace("El.compare", "compare")))
    assert (cheat.compiled, cheat.tests_passed) == (True, 2)
    # a value at another type than the signature's: the answer's error, no type-check credit
    wrong = scorer.score_one(p, fenced(ORDERED_SET.replace("let size = List.length", "let size s = s = []")))
    assert wrong.error_kinds == ["entry"] and wrong.type_check == wrong.compile == wrong.tests == 0.0
    # no functor, and an unrelated type error beside it: nothing typed as asked
    flat = scorer.score_one(p, fenced('let size (s : int list) = List.length s\nlet x : int = "a"'))
    assert "entry" in flat.error_kinds and flat.type_check == flat.compile == 0.0


def test_an_entry_point_must_be_as_polymorphic_as_the_prompt_declares(scorer):
    """Each type variable of an entry point has an abstract token type of its own in the oracle: an
    identity for `'a * 'b -> 'b * 'a` would otherwise pass the assertions whose two values share a
    representation (1 and true). A weakly typed entry point is bound exactly when the tests appended
    to it compile: one that keeps an earlier call's values in a global `ref`, called at four types,
    is not."""
    prompt = "(** Swap the two components of a pair. *)\nlet swap (p : 'a * 'b) : 'b * 'a ="
    tests = ("let () =\n  assert (swap (1, true) = (true, 1));\n  assert (swap ('a', 98) = (98, 'a'));\n"
             "  assert (swap (0, false) = (false, 0));\n  assert (swap (\"x\", 2) = (2, \"x\"))\n;;")
    p = Problem(id="swap", prompt=prompt, tests=tests)
    assert scorer.score_one(p, fenced("let swap (a, b) = (b, a)")).reward == 1.0
    same = scorer.score_one(p, fenced("let swap (a, b) = (a, b)"))
    assert same.error_kinds == ["entry"] and same.tests_passed == 0 and same.type_check == same.compile == 0.0
    assert "Tok" not in same.first_error  # feedback speaks of the prompt's types only
    stash = ("let prev = ref None\nlet swap (a, b) =\n  let r = match !prev with Some (pa, pb) -> (pb, pa) | None -> (b, a) in\n"
             "  prev := Some (a, b);\n  r")
    b = scorer.score_one(p, fenced(stash))
    # its global `ref` makes it weak, and the tests call it at four types: appended to it, they do
    # not compile, so it is not an entry point of the prompt's type (round 6, #47)
    assert b.error_kinds == ["entry"] and b.tests_passed == 0 and b.type_check == b.compile == 0.0


def test_a_token_is_read_back_only_as_the_variable_it_was_sent_for(sandbox_scorer):
    """The oracle names values of type variables by key; the trusted program accepts, for variable
    i of a call, only keys of values it sent (or its closures returned) for i in that call. An
    oracle that breaks OCaml's types (here `Obj.magic`, with the allowlist off, as a type-checker
    bug would) returning the first component as the second gets nothing: read as `'b`, the string
    list would have passed the first assertion."""
    prompt = "(** The second component of a pair. *)\nlet second (p : 'a * 'b) : 'b ="
    tests = ('let () =\n  assert (List.length (second (["p"; "q"; "r"], [1; 2; 3])) = 3);\n'
             '  assert (List.length (second ([1], [2; 3])) = 2)\n;;')
    p = Problem(id="second", prompt=prompt, tests=tests)
    assert sandbox_scorer.score_one(p, fenced("let second (_, b) = b")).tests_passed == 2
    assert sandbox_scorer.score_one(p, fenced("let second (a, _) = Obj.magic a")).tests_passed == 0


@pytest.mark.parametrize("name,body,stub", [
    ("right", "a + b", False),
    ("wrong but returns", "a - b", False),
    ("returns for one input only", "if a = 1 then 3 else failwith \"todo\"", False),
    ("failwith", "failwith \"todo\"", True),
    ("assert false", "assert false", True),
    ("raise Exit", "raise Exit", True),
    ("loops", "let rec go () = go () in go ()", True),
    ("raises its own", "let exception Todo in raise Todo", True),
])
def test_an_answer_whose_calls_never_return_a_value_is_a_stub(scorer, name, body, stub):
    """Decided by what happened, not by the text: the trusted program notes a value coming back
    from any call of the answer's. The weights are the seed's (a stub keeps its type-check, compile
    and END credit); the share of stubs is logged per step (`ocaml/stub`) for the health report."""
    b = scorer.score_one(ADD, fenced(f"let add (a : int) (b : int) : int = {body}"))
    assert b.compiled and b.tests_compiled and b.stub is stub, (name, b)
    if stub:
        assert b.tests == 0.0 and b.reward == pytest.approx(0.35)  # type check + compile + END, by the weights
    # an answer that does not compile, or whose tests never ran, is not counted a stub
    assert scorer.score_one(ADD, fenced(f"let add (a : int) (b : int) : string = {body}")).stub is False


_P = lambda pid, prompt, tests: Problem(id=pid, prompt=prompt, tests=tests)  # noqa: E731
POWER = _P("power_c", "(** base to the exp. *)\nlet power (base : int) (exp : int) : int =",
           "let () =\n  assert (power 2 10 = 1024);\n  assert (power 3 2 = 9);\n  assert (power 5 0 = 1)\n;;")
RANGE = _P("range_c", "(** 0 to n-1. *)\nlet range (n : int) : int list =",
           "let () =\n  assert (range 3 = [0; 1; 2]);\n  assert (range 0 = []);\n  assert (range 2 = [0; 1])\n;;")
UPPER = _P("upper_c", "(** Upper case. *)\nlet up (s : string) : string =",
           'let () =\n  assert (up "ab" = "AB");\n  assert (up "x" = "X");\n  assert (up "" = "")\n;;')
SORT = _P("sort_c", "(** Sort in place. *)\nlet sort_in_place (a : int array) : unit =",
          "let () =\n  let a = [| 3; 1 |] in sort_in_place a; assert (a = [| 1; 3 |]);\n"
          "  let b = [| 2; 1; 0 |] in sort_in_place b; assert (b = [| 0; 1; 2 |]);\n"
          "  let c = [| 5 |] in sort_in_place c; assert (c = [| 4 |])\n;;")
TRANSPOSE = _P("transpose_c", "(** Transpose. *)\nlet transpose (m : int array array) : int array array =",
               "let () =\n  assert (transpose [| [| 1; 2 |] |] = [| [| 1 |]; [| 2 |] |]);\n"
               "  assert (transpose [| [| 7 |] |] = [| [| 7 |] |])\n;;")
APPLY = _P("apply_c", "(** f applied to x. *)\nlet apply (f : int -> int) (x : int) : int =",
           "let () =\n  assert (apply succ 1 = 2);\n  assert (apply (fun x -> x * 3) 1 = 2)\n;;")
SAME_ARGS = _P("same_args_c", "(** Upper case. *)\nlet up (s : string) : string =",
               'let () =\n  assert (up "ab" = "AB");\n  assert (up "ab" = "AB");\n  assert (up "ab" = "x")\n;;')


@pytest.mark.parametrize("problem,code,constant", [
    (POWER, "let power (base : int) (exp : int) : int = 1024", True),  # attempt 6's answer, staged calls
    (POWER, "let rec power b e = if e = 0 then 1 else b * power b (e - 1)", False),
    (POWER, "let power b e = if e = 0 then 1 else b * e", False),  # wrong, but its values vary
    (RANGE, "let range (n : int) : int list = [0; 1; 2]", True),
    (RANGE, "let range n = List.init n (fun i -> i + 1)", False),
    (UPPER, 'let up (s : string) : string = "AB"', True),
    (UPPER, "let up s = String.uppercase_ascii s", False),  # right: all pass, never counted
    (SAME_ARGS, 'let up (s : string) : string = "AB"', False),  # one value for one argument is no constant
    (UPPER, 'let up s = if s = "" then failwith "todo" else "AB"', True),  # the calls that returned agree
    (SORT, "let sort_in_place a = ()", True),  # changes nothing, gives back ()
    (SORT, "let sort_in_place a = Array.sort compare a", False),  # its changes differ
    (TRANSPOSE, "let transpose m = [| [| 1 |]; [| 2 |] |]", True),  # a fresh array each call, the same value
    (APPLY, "let apply f x = 2", False),  # a closure among the arguments: never counted
])
def test_an_answer_that_gives_back_one_value_for_different_arguments_is_counted_constant(scorer, problem, code,
                                                                                      constant):
    """Decided by what the calls did: the trusted program compares each entry point's calls (the
    arguments, marshalled; the result, with the arguments after the call where it changed them).
    A constant answer earns no test credit for the assertions it passes (the rest as the weights
    say); any other keeps the credit its assertions earn."""
    b = scorer.score_one(problem, fenced(code))
    assert b.tests_compiled and b.constant is constant, (code, b)
    if constant:
        assert b.tests_passed < b.tests_total and (b.tests_passed == 1 or problem is not POWER), b  # 1024 passes one
        assert b.tests == 0.0 and b.reward == pytest.approx(0.35), b  # type check + compile + END
    else:
        assert b.tests == pytest.approx(0.65 * b.tests_passed / b.tests_total), b
