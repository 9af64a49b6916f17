"""The prepared model-code sandbox (issue #36, speed): one bubblewrap started once, each run a fresh
child of it (launch.c's serve mode). What one run leaves must never reach the next; a run's
descriptors, limits, uid and time-outs are those of a sandbox of its own; nothing outlives the
grader. Real bubblewrap, real OCaml bytecode programs."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ocaml_grpo.grading.sandbox import UID_POOL_BASE, UID_POOL_SIZE, Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs are prepared sandboxes' children only as root")

# Run 1 leaves files in /work and /tmp and a child sleeping in the background, then reports its uid;
# run 2 reports what it finds of them.
LEAVE = """let () =
  List.iter (fun p -> let oc = open_out p in output_string oc "left"; close_out oc) ["/work/left"; "/tmp/left"];
  (match Unix.fork () with 0 -> Unix.sleep 60 | _ -> ());
  print_int (Unix.getuid ())"""
FIND = """let () =
  let seen = List.filter Sys.file_exists ["/work/left"; "/tmp/left"] in
  print_string (String.concat "," seen ^ "|" ^ String.concat "," (Array.to_list (Sys.readdir "/work")))"""
# Writes the descriptor named on its command line, then lists every descriptor it has open.
WRITE_FD = """let () =
  let fd : Unix.file_descr = Obj.magic (int_of_string Sys.argv.(1)) in
  ignore (Unix.write_substring fd "through" 0 7);
  prerr_string "err";
  let is_open i = try ignore (Unix.fstat (Obj.magic i : Unix.file_descr)); true with Unix.Unix_error _ -> false in
  print_string (String.concat "," (List.map string_of_int (List.filter is_open (List.init 1024 Fun.id))))"""
LOOP = "let () = while true do () done"


def bytecode(tmp_path: Path, name: str, code: str, compiler: str = "ocamlc") -> Path:
    (tmp_path / f"{name}.ml").write_text(code)
    subprocess.run(["ocamlfind", compiler, "-package", "unix", "-linkpkg", f"{name}.ml", "-o", name],
                   cwd=tmp_path, check=True, capture_output=True)
    return tmp_path / name


def run(sb: Sandbox, prog: Path, *args: str, **kw):
    return sb.run(["./prog", *args], prog.parent, wall_s=kw.pop("wall_s", 20), program=prog, **kw)


def uid_alive(uid: int) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]:
                return True
        except FileNotFoundError:
            pass
    return False


def test_nothing_a_run_leaves_reaches_the_next_in_the_same_sandbox(tmp_path):
    sb = Sandbox()
    try:
        leave, find = bytecode(tmp_path, "leave", LEAVE), bytecode(tmp_path, "find", FIND)
        first = run(sb, leave)
        assert first.returncode == 0, first.stderr
        uid = int(first.stdout)
        assert UID_POOL_BASE <= uid < UID_POOL_BASE + UID_POOL_SIZE
        assert not uid_alive(uid)  # its background child died with it (PID 1 of its namespace)
        [box] = sb._prepared
        second = run(sb, find)
        assert sb._prepared == [box]  # the same prepared sandbox started both
        assert second.stdout == "|prog"  # neither file: only its own program, in a fresh /work
    finally:
        sb.close()


# In a process of its own, so that the descriptors it passes are the lowest numbers, the ones the
# prepared sandbox's own descriptors also take: each must still land where the run is told it is.
DESCRIPTORS = """
import json, os, sys
from pathlib import Path
pipes = [os.pipe() for _ in range(2)]  # 3,4 and 5,6
from ocaml_grpo.grading.sandbox import Sandbox
sb = Sandbox()
prog = Path(sys.argv[1])
given = (pipes[1][1], pipes[0][1])
res = sb.run(["./prog", str(pipes[1][1])], prog.parent, wall_s=20, program=prog, pass_fds=given)
for fd in given:
    os.close(fd)
print(json.dumps([res.returncode, res.stdout, res.stderr, list(given),
                  os.read(pipes[1][0], 100).decode(), os.read(pipes[0][0], 100).decode()]))
"""


@pytest.mark.parametrize("compiler", ["ocamlc", "ocamlopt"])  # bytecode is copied in, native executed in place
def test_a_run_gets_exactly_its_descriptors_and_its_output(tmp_path, compiler):
    prog = bytecode(tmp_path, "write_fd", WRITE_FD, compiler)
    out = subprocess.run([sys.executable, "-c", DESCRIPTORS, str(prog)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=60)
    assert out.returncode == 0, out.stderr
    status, stdout, stderr, given, through, other = json.loads(out.stdout)
    assert (status, stderr, through, other) == (0, "err", "through", ""), stderr
    # stdin, its output, what it was given: nothing of the sandbox's
    assert stdout == ",".join(map(str, sorted([0, 1, 2, *given])))


def test_guards_stop_a_run_and_the_sandbox_serves_the_next(tmp_path):
    sb = Sandbox()
    try:
        loop, find = bytecode(tmp_path, "loop", LOOP), bytecode(tmp_path, "find", FIND)
        by_cpu = run(sb, loop, cpu_s=1)
        # stopped by the kernel at its CPU limit (the CPU it reports can fall short of the kernel's
        # count on shared cores: no lower bound), and by the wall-clock guard, whatever CPU it got
        assert not by_cpu.timed_out and by_cpu.returncode == -signal.SIGKILL and 0 < by_cpu.cpu_s < 1.5
        by_wall = run(sb, loop, wall_s=1, cpu_s=10)
        assert by_wall.timed_out and 0 < by_wall.cpu_s < 1.5
        assert run(sb, find).stdout == "|prog" and len(sb._prepared) == 1
    finally:
        sb.close()


def test_prepared_sandboxes_end_with_the_grader(tmp_path):
    """A grader killed with SIGKILL leaves no sandbox behind: its control socket closes."""
    prog = bytecode(tmp_path, "find", FIND)
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from ocaml_grpo.grading.sandbox import Sandbox
        sb = Sandbox()
        p = Path({str(prog)!r})
        assert sb.run(["./prog"], p.parent, wall_s=20, program=p).returncode == 0
        print(sb._prepared[0].proc.pid, flush=True)
        time.sleep(60)
        """)
    grader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        bwrap = int(grader.stdout.readline())
        tree = [bwrap] + [int(p) for p in subprocess.run(["pgrep", "-P", str(bwrap)], capture_output=True,
                                                          text=True).stdout.split()]
        assert all(Path(f"/proc/{p}").exists() for p in tree)
    finally:
        grader.kill()
        grader.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_running(p) for p in tree):
        time.sleep(0.05)
    assert not any(_running(p) for p in tree)


def _running(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except FileNotFoundError:
        return False
