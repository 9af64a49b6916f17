"""The offline bundle is whole (`make bundle`, install-offline.sh; docs/offline.md).

Installed into a temporary prefix for a Python that has this virtualenv's packages but those the
project needs that a GPU machine lacks (what trl, datasets and python-dotenv need beyond PyTorch,
transformers, peft, accelerate, pyarrow and pandas: requirements-offline.txt), inside a mount and network
namespace where the system's OCaml (/usr/lib/ocaml, /usr/bin/ocaml*), findlib's configuration,
bubblewrap and C compiler are hidden and there is no network, it grades the bundled reference
solutions (all 1.0; Base's too, through the compile server and through ocamlc) and runs a 2-step
plumbing training. `make test-slow` builds the archive first (dist/, rebuilt when its inputs change).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import BUNDLED, GRADED, ROOT, read_jsonl, read_rows, run_env
from ocaml_grpo.config import SANDBOX_SETTINGS, resolve
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.grading.toolcache import ToolchainError

ARCHIVE = ROOT / "dist" / "ocaml-grpo-offline.tar.xz"
# What a GPU machine has, with what these need (requirements-offline.txt: why pyarrow and pandas).
ON_THE_MACHINE = ("torch", "transformers", "peft", "accelerate", "pyarrow", "pandas")
DROPPED = ("trl", "datasets", "python-dotenv")  # what it lacks, with what they need beyond ON_THE_MACHINE
# Run as root inside `unshare --mount --net`: what the grader could otherwise fall back on is
# covered, a directory by an empty tmpfs, a file by /dev/null (neither found on PATH nor executable).
HIDE = r"""
set -e
for d in /usr/lib/ocaml /usr/local/lib/ocaml; do [ -d "$d" ] && mount -t tmpfs -o size=64k,mode=755 hidden "$d"; done
for f in /usr/bin/ocaml* /usr/bin/bwrap /usr/bin/cc /usr/bin/gcc /usr/bin/x86_64-linux-gnu-gcc* \
         /etc/ocamlfind.conf /etc/findlib.conf; do
  [ -e "$f" ] && mount --bind /dev/null "$f"
done
exec "$@"
"""


def hidden(argv: list, env: dict | None = None, cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    """argv in a fresh mount and network namespace without the system's toolchain."""
    return subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", "bash", "-c", HIDE, "hide",
                           *map(str, argv)], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def needs(names: tuple[str, ...]) -> set[str]:
    """The packages and everything they require, as installed here (extras left out)."""
    seen, todo = set(), [norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [norm(r.name) for r in map(Requirement, metadata.requires(name) or [])
                     if r.marker is None or r.marker.evaluate({"extra": ""})]
    return seen


def bundled_distributions(archive: Path) -> set[str]:
    """The packages the archive carries wheels of."""
    with tarfile.open(archive) as tar:
        return {norm(Path(n).name.split("-")[0]) for n in tar.getnames() if n.endswith(".whl")}


def baseline_python(dest: Path, drop: set[str]) -> Path:
    """A virtualenv holding this one's packages but `drop` (and their files): a machine with
    PyTorch & co. that lacks what the bundle brings. Its packages are links, not copies."""
    site = Path(sysconfig.get_paths()["purelib"])
    owned = set()
    for dist in metadata.distributions(path=[str(site)]):
        if norm(dist.metadata["Name"]) in drop:
            owned |= {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    venv.create(dest, symlinks=True, with_pip=False)
    target = dest / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    for entry in site.iterdir():
        if entry.name not in owned:
            (target / entry.name).symlink_to(entry)
    return dest / "bin" / "python"


def answers_file(path: Path, rows: list[dict]) -> Path:
    """Each row's reference solution as a completion (`rewards.py score`'s input)."""
    path.write_text("".join(json.dumps({"problem_id": r["id"], "completion": f"```ocaml\n{r['solution']}\n```\n(* END *)"})
                            + "\n" for r in rows))
    return path


def scores(out: str) -> dict[str, float]:
    return {r["problem_id"]: r["reward"] for r in map(json.loads, out.splitlines())}


@pytest.fixture(scope="module")
def archive() -> Path:
    if not ARCHIVE.is_file():
        pytest.skip(f"no bundle at {ARCHIVE}: `make bundle` writes it (`make test-slow` does it first)")
    return ARCHIVE


@pytest.mark.slow
def test_a_bundle_made_from_other_sources_stops_start_up_naming_make_bundle(archive, tmp_path):
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    toolchain = tmp_path / "ocaml-grpo-offline" / "ocaml"
    cfg, errors = resolve({"OCAML_TOOLCHAIN_DIR": str(toolchain)}, SANDBOX_SETTINGS)
    assert errors == [] and cfg.reward.sandbox.toolchain == str(toolchain)
    # Its launcher and compile server as another checkout's sources would name them.
    for exe in (toolchain / "libexec").iterdir():
        exe.rename(exe.with_name(exe.name.split("-")[0] + "-0123456789abcdef"))
    with pytest.raises(ToolchainError, match="another version of the project. Run `make bundle`"):
        Sandbox(cfg.reward.sandbox)


def skip_without_namespaces() -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("hiding the system's toolchain takes root and unshare (a mount namespace of its own)")


def without_toolchain_settings(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in ("PYTHONPATH", "OCAML_TOOLCHAIN_DIR")}


@pytest.mark.slow
def test_the_bundle_installs_grades_and_trains_without_the_system_toolchain_or_network(archive, tmp_path, cache_home):
    skip_without_namespaces()
    env = without_toolchain_settings(os.environ)
    # Nothing to fall back on: no OCaml, findlib, bwrap or cc, no network.
    res = hidden(["sh", "-c", "command -v ocamlc ocamlfind ocamlrun bwrap cc; ls -A /usr/lib/ocaml; "
                  f"{sys.executable} -c 'import socket; socket.create_connection((\"1.1.1.1\", 443), timeout=3)'"], env)
    assert res.returncode != 0 and res.stdout == "" and "unreachable" in res.stderr, res

    drop = needs(DROPPED) - needs(ON_THE_MACHINE)
    assert {"trl", "datasets", "python-dotenv", "dill", "multiprocess"} <= drop
    assert drop <= bundled_distributions(archive)
    python = baseline_python(tmp_path / "machine", drop)
    assert subprocess.run([python, "-c", "import trl"], capture_output=True).returncode != 0
    prefix = tmp_path / "prefix"
    res = hidden(["bash", ROOT / "install-offline.sh", archive, prefix], {**env, "PYTHON": str(python)})
    assert res.returncode == 0, res.stdout + res.stderr
    next_command = res.stdout.strip().splitlines()[-1]
    assert next_command == f"  cd {ROOT} && GRPO_PLUMBING=1 {prefix}/bin/python train.py"
    installed = {norm(p.name.split("-")[0]) for p in (prefix / "site").glob("*.dist-info")}
    assert installed == drop  # this machine lacked every one of them

    # The bundled reference solutions, graded by the bundled toolchain: all 1.0.
    grade_env = {**env, "MIN_NON_EMPTY_LINES": "0", "OCAML_WALL_LIMIT_S": "30", "XDG_CACHE_HOME": str(cache_home)}
    answers = answers_file(tmp_path / "answers.jsonl", read_rows(BUNDLED))
    res = hidden([prefix / "bin" / "python", "rewards.py", "score", BUNDLED, answers, "--workers", "2"], grade_env)
    assert res.returncode == 0, res.stderr
    got = scores(res.stdout)
    assert len(got) == len(read_rows(BUNDLED)) >= 120 and {k: v for k, v in got.items() if v != 1.0} == {}
    # The project's graded rows (an OUnit-style one, one that `require`s Base), by both compile paths.
    assert any(r.get("requires") == ["base"] for r in read_rows(GRADED))
    graded = answers_file(tmp_path / "graded.jsonl", read_rows(GRADED))
    for compiler in ("server", "ocamlc"):
        res = hidden([prefix / "bin" / "python", "rewards.py", "score", GRADED, graded],
                     {**grade_env, "OCAML_COMPILER": compiler})
        assert res.returncode == 0, res.stderr
        assert scores(res.stdout) == {r["id"]: 1.0 for r in read_rows(GRADED)}, compiler

    # Two training steps of the plumbing run, the printed command's way.
    run = tmp_path / "plumbing"
    run.mkdir()
    train_env = without_toolchain_settings(run_env(run, cache_home, GRPO_MAX_STEPS="2"))
    res = hidden([prefix / "bin" / "python", ROOT / "train.py"], train_env, cwd=run)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads((run / "run" / "config.json").read_text())["OCAML_TOOLCHAIN_DIR"] == f"{prefix}/ocaml"
    assert json.loads((run / "run" / "finished.json").read_text())["step"] == 2
    assert len(read_jsonl(run / "run" / "reward_logs" / "completions.jsonl")) == 2 * 2 * 2  # steps x prompts x completions


@pytest.mark.slow
def test_the_cuda_figures_script_measures_through_the_bundle(archive, tmp_path, cache_home):
    """bench/cuda_figures.sh, what a lent GPU machine runs in one call (the compiled engine against
    the default one), here on CPU (the tiny model) with the system's toolchain hidden: every stage
    leaves its figures in OUT."""
    skip_without_namespaces()
    python = baseline_python(tmp_path / "machine", needs(DROPPED) - needs(ON_THE_MACHINE))
    out = tmp_path / "out"
    env = {**without_toolchain_settings(run_env(tmp_path, cache_home)), "PYTHON": str(python)}
    res = hidden(["bash", ROOT / "bench" / "cuda_figures.sh", archive, out, "1"], env, timeout=600)
    assert res.returncode == 0 and "] done" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
    assert "torch" in (out / "machine.txt").read_text()
    data = json.loads((out / "train_default.json").read_text())
    assert [(r["engine"], r["steps"]) for r in data["results"]] == [("default", 1)] and data["failed"] == []
    # the compiled engine: inductor needs the C compiler hidden here, so the script's second try,
    # the cudagraphs backend (no compiler), is what measures
    compiled = [json.loads(p.read_text())["results"] for p in sorted(out.glob("train_compiled*.json"))]
    assert [(r["engine"], r["steps"]) for results in compiled for r in results] == [("compiled", 1)], res.stdout[-3000:]
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["compiled", "default"] and "(1.00x default)" in summary[1]
