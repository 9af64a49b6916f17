"""Run the project's commands (`python train.py ...`, `python evaluate.py ...`) in processes that
start with torch, transformers, trl, peft, datasets and accelerate already imported.

Importing those libraries costs each command ~6.5 s of CPU, and the suite runs about twenty of
them: a third of its time on 2 cores. Here a multiprocessing forkserver imports them once per test
process, and every command is a fresh process forked from it, with its own pid, session,
environment, working directory, stdout/stderr files and exit status; the script runs as
`__main__` through runpy, as `python SCRIPT ARGS` runs it. Exit statuses follow the interpreter's:
`sys.exit(n)` gives n, `sys.exit("message")` prints it and gives 1, an uncaught exception prints
its traceback and gives 1.

What a forked command does not repeat is the start-up itself, so the tests whose subject is the
start-up (config errors and `--help` answered before torch is imported, `accelerate launch`, the
bench scripts) still start a new interpreter.

This module imports nothing from the project: the child imports it to find `_main`, and the
project's modules must first be imported by the command, under the command's environment.
"""
from __future__ import annotations

import io
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

LIBRARIES = ["torch", "transformers", "trl", "peft", "datasets", "accelerate", "trl.trainer.grpo_trainer",
             "trl.trainer.sft_trainer", "transformers.models.qwen2.modeling_qwen2",
             "transformers.models.llama.modeling_llama", "peft.tuners.lora"]
# Read by the libraries when they are imported, so the server must be started with them.
IMPORT_TIME_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "TOKENIZERS_PARALLELISM": "false"}

_context = None


def _forkserver():
    global _context
    if _context is None:
        os.environ.update(IMPORT_TIME_ENV)
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(LIBRARIES)
    return _context


def negate_rewards() -> None:
    """A `setup` for train.py: TRL optimises -reward (every advantage's sign flipped) while the
    reward logs keep the real reward; a trainer that learns must then get worse
    (tests/test_learning.py's control). Patched here, so train.py holds no test-only branch."""
    from ocaml_grpo.commands import grpo_run  # the command's own import then finds this module, patched

    make = grpo_run.make_reward_function

    def negated(*a, **kw):
        if sink := kw.get("on_turn_grades"):  # repair turns: the first answer's own advantage too
            kw["on_turn_grades"] = lambda grades: sink([[None if g is None else -g for g in gs] for gs in grades])
        graded = make(*a, **kw)

        async def syntax_aware_reward(*x, **k):
            return [None if r is None else -r for r in await graded(*x, **k)]
        return syntax_aware_reward
    grpo_run.make_reward_function = negated


SETUPS = {"negate_rewards": negate_rewards}


def _main(script: str, args: list[str], cwd: str, env: dict, stdout: str, stderr: str, setup: str | None) -> None:
    """The child: become `python SCRIPT ARGS` run in `cwd` under `env` (after SETUPS[setup])."""
    os.setsid()  # like start_new_session=True: killpg(pid) reaches the command's own children
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    if setup:
        SETUPS[setup]()
    runpy.run_path(script, run_name="__main__")


class Command:
    """A started command: `pid`, `poll()`, `wait(timeout)`, and its output once it has ended."""

    def __init__(self, script: Path, args: list, cwd: Path, env: dict, setup: str | None = None):
        self._dir = tempfile.TemporaryDirectory(prefix="preloaded-")
        self.stdout_path = Path(self._dir.name) / "stdout"
        self.stderr_path = Path(self._dir.name) / "stderr"
        self.args = [str(script), *map(str, args)]
        self._process = _forkserver().Process(target=_main, args=(
            str(script), self.args[1:], str(cwd), {k: str(v) for k, v in env.items()},
            str(self.stdout_path), str(self.stderr_path), setup))
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
            raise subprocess.TimeoutExpired(self.args, timeout, self.output("stdout"), self.output("stderr"))
        return self._process.exitcode

    def output(self, name: str) -> str:
        path = self.stdout_path if name == "stdout" else self.stderr_path
        return path.read_text(errors="replace") if path.exists() else ""

    def result(self, timeout: float | None = None) -> subprocess.CompletedProcess:
        code = self.wait(timeout)
        result = subprocess.CompletedProcess(self.args, code, self.output("stdout"), self.output("stderr"))
        self._dir.cleanup()
        return result


def run(script: Path, args: list = (), *, cwd: Path, env: dict, timeout: float,
        setup: str | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, script, *args], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)`, without the libraries' import; `setup` names a SETUPS patch run first."""
    return Command(script, list(args), cwd, env, setup).result(timeout)
