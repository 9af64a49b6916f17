"""tests/preloaded.py runs a script as a fresh interpreter would: the same exit status, output,
arguments, working directory and environment (the training tests trust its return codes)."""
import os
import subprocess
import sys

import pytest

import preloaded

SCRIPT = """
import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("PRELOADED_VAR"))
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "code":
    sys.exit(3)
if how == "message":
    sys.exit("stopped: a message")
if how == "raise":
    raise RuntimeError("boom")
"""


@pytest.mark.parametrize("how", ["ok", "code", "message", "raise"])
def test_a_forked_command_reports_what_a_fresh_interpreter_does(tmp_path, how):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PRELOADED_VAR": "x"}
    fresh = subprocess.run([sys.executable, str(script), how, "two words"], cwd=work, env=env, capture_output=True,
                           text=True, timeout=60)
    forked = preloaded.run(script, [how, "two words"], cwd=work, env=env, timeout=60)
    assert forked.returncode == fresh.returncode == {"ok": 0, "code": 3, "message": 1, "raise": 1}[how]
    assert forked.stdout == fresh.stdout == f"argv ['{how}', 'two words'] cwd {work} var x\n"
    assert forked.stderr.startswith("to stderr\n") and fresh.stderr.startswith("to stderr\n")
    last = fresh.stderr.strip().splitlines()[-1]
    assert forked.stderr.strip().splitlines()[-1] == last
    assert last == {"ok": "to stderr", "code": "to stderr", "message": "stopped: a message",
                    "raise": "RuntimeError: boom"}[how]
