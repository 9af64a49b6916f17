"""The layout's promises, read from the source: no import cycle between the project's modules, no
project import hidden inside a function (the way a cycle is usually dodged); and the user's door:
the README and the --help texts point only at what a clone has."""
import ast
import os
import platform
import shutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGES = ("ocaml_grpo", "bench")


def project_modules() -> dict[str, ast.Module]:
    files = sorted(ROOT.glob("*.py")) + [f for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))]
    return {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): ast.parse(f.read_text())
            for f in files}


def imported(node: ast.AST, modules: set[str]) -> set[str]:
    """Project modules an import statement names (`from pkg import mod` names pkg.mod)."""
    if isinstance(node, ast.Import):
        names = {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
        names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    else:
        return set()
    return names & modules


def top_level_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """Imports run when the module is imported: at module level, in if/try blocks included."""
    out, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        out |= imported(node, modules)
        todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
    return out


def test_no_import_cycle():
    trees = project_modules()
    graph = {m: top_level_imports(t, set(trees)) - {m} for m, t in trees.items()}
    assert graph["rewards"] and graph["analyze"]  # the walk sees imports at all

    def cycle_from(start):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return path + [start]
                if nxt not in path:
                    stack.append((nxt, path + [nxt]))
        return None

    assert [c for m in graph if (c := cycle_from(m))] == []


def test_no_project_import_inside_a_function():
    """Except in a command that no module imports: no cycle can run through it, and train.py
    loads the modules built on torch only once its checks have passed."""
    trees = project_modules()
    graph = {m: top_level_imports(t, set(trees)) - {m} for m, t in trees.items()}
    imported_somewhere = set().union(*graph.values())
    lazy = []
    for name, tree in trees.items():
        if room(name) is None and name not in imported_somewhere:
            continue
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy += [f"{name}.{fn.name}: {m}" for node in ast.walk(fn) for m in imported(node, set(trees))]
    assert lazy == []


# The package's rooms, bottom to top: a module imports only from its own room and the rooms below
# it. The package root holds what every room reads (problems, prompts, completion text, JSONL).
ROOMS = ("", "reward", "config", "grading", "scoring", "models", "training", "report", "commands")


def room(module: str) -> int | None:
    """The room's rank of a package module (a room's __init__ is in the room); None for a file
    outside the package (a command)."""
    parts = module.split(".")
    if parts[0] != "ocaml_grpo":
        return None
    return ROOMS.index(parts[1]) if len(parts) > 1 and parts[1] in ROOMS else 0


def test_rooms_hold():
    """Every package module lives in a room (`grading/`, `training/`, ...) and imports nothing from
    a room above it, nor any file outside the package: no back link, by name or otherwise. The
    package root keeps a handful of modules."""
    trees = project_modules()
    graph = {m: top_level_imports(t, set(trees)) - {m} for m, t in trees.items()}
    package = [m for m in graph if m.startswith("ocaml_grpo")]
    assert {m.split(".")[1] for m in package if m.count(".") >= 2} == set(ROOMS[1:])
    up = {m: sorted(n for n in graph[m] if room(n) is None or room(n) > room(m)) for m in package}
    assert {m: v for m, v in up.items() if v} == {}
    assert len([m for m in package if m.count(".") == 1 and room(m) == 0]) <= 5
    # the top-level sandbox file is the sandbox's public door, not a layer of its own
    assert graph["ocaml_sandbox"] <= {m for m in package if room(m) in (2, 3)}


def test_no_two_modules_differ_only_by_a_suffix():
    """`evaluate`/`evaluation`, `compile_server`/`compiler_output`, `train`/`train_config`: names a
    newcomer cannot tell apart. No two modules of the package and its commands share their first six
    letters (the rooms themselves aside: `reward/` holds the parts `rewards.py` scores)."""
    trees = project_modules()
    rooms = {f"ocaml_grpo.{r}" for r in ROOMS if r} | {"ocaml_grpo"}
    leaves = sorted(m for m in trees if not m.startswith("bench") and m not in rooms)
    stems: dict[str, list[str]] = {}
    for m in leaves:
        stems.setdefault(m.rsplit(".", 1)[-1][:6], []).append(m)
    assert {s: ms for s, ms in stems.items() if len(ms) > 1} == {}


def test_every_setting_is_a_field_of_the_config_defined_once():
    """One way to write a setting: a field of a config record carrying its `Setting` (name,
    default, parser, meaning); every table is read from the records, and no name is defined twice."""
    from ocaml_grpo.config import EVERY_SETTING, SETTINGS, SFT_SETTINGS, VARIABLES
    from ocaml_grpo.config.settings import Setting
    assert [s for s in EVERY_SETTING if not isinstance(s, Setting)] == []
    assert len(VARIABLES) == len(set(VARIABLES)) == len(EVERY_SETTING) > 60
    assert set(SETTINGS + SFT_SETTINGS) <= set(EVERY_SETTING)


def test_analyze_help_loads_no_grader_nor_torch():
    """analyze.py reads the settings' defaults from ocaml_grpo.config: importing it must not load
    the grader (or torch), so a report costs no toolchain."""
    res = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "analyze.py"), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    loaded = [line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")]
    assert res.returncode == 0 and "ocaml_grpo.config" in loaded, res.stderr[-2000:]
    assert [m for m in loaded if m.startswith(("ocaml_grpo.grading", "torch"))] == []


def in_commands(module: str) -> bool:
    """The commands' bodies in the package (ocaml_grpo/commands/): what the root scripts run."""
    return module.startswith("ocaml_grpo.commands")


def test_no_module_below_the_commands_reads_the_environment():
    """Settings are resolved once, at a command's edge, and passed down as typed configs: nothing
    below the commands names os.environ or os.getenv (the sandbox, the grader, the audit cache,
    the reward's configuration, the models' helpers all receive what they need)."""
    trees = project_modules()
    below = [m for m in trees if m == "ocaml_sandbox" or (m.startswith("ocaml_grpo") and not in_commands(m))]
    readers = sorted(m for m in below for node in ast.walk(trees[m])
                     if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                     and isinstance(node.value, ast.Name) and node.value.id == "os")
    assert "ocaml_grpo.config.settings" in below and readers == []


HELP_COMMANDS = [["train.py", "--help"], ["train.py", "sft", "--help"], ["rewards.py", "--help"],
                 ["rewards.py", "score", "--help"], ["rewards.py", "feedback", "--help"], ["rewards.py", "audit", "--help"],
                 ["evaluate.py", "--help"], ["evaluate.py", "--probe", "stats.jsonl", "--help"], ["analyze.py", "--help"]]
# What a user's clone does not have, and words only this project's own history explains.
NOT_A_USERS = ("../shared", "the seed", "issue #", "epoch 0.28")


def test_help_texts_point_only_at_what_a_clone_has():
    """Every command's --help: no example reads a file outside the clone, no internal word."""
    for cmd in HELP_COMMANDS:
        res = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (cmd, res.stderr[-1000:])
        text = res.stdout.lower()
        assert [w for w in NOT_A_USERS if w in text] == [], cmd
        assert "rlef" not in text or "gehring" in text, cmd  # a name a user can look up


def test_the_readme_names_both_test_tiers_and_ci_runs_them():
    """`make test` is the fast tier, `make test-slow` the slow one; the README names both and CI
    runs both, so nothing marked slow goes untested."""
    readme, ci, make = ((ROOT / f).read_text() for f in ("README.md", ".ci/run", "Makefile"))
    assert "make test " in readme and "make test-slow" in readme
    ran = [line.split("#")[0].split() for line in ci.splitlines() if line.startswith("make ")]
    assert ["make", "test"] in ran and ["make", "test-slow"] in ran
    target = lambda name: make.split(f"\n{name}:", 1)[1].split("\n\n", 1)[0]  # noqa: E731
    assert '-m "not slow"' in target("test") and "-m slow" in target("test-slow")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_readme_is_a_door():
    """Short enough to read (the long explanations live in docs/), the CPU torch warning next to
    the two commands, no internal word, and every link it holds leads somewhere."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 320
    first = text.split("\n## ")[1]  # the two commands' section
    assert first.startswith("Two commands") and "download.pytorch.org/whl/cpu" in first
    lowered = text.lower()
    assert [w for w in NOT_A_USERS if w in lowered] == [] and not re.search(r"\B#\d+\b", text)
    assert "rlef" not in lowered or "gehring" in lowered
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith("http"):
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (ROOT / path).exists(), target
        elif anchor:
            assert anchor in anchors, target


def test_make_setup_installs_the_cpu_torch_where_there_is_no_gpu(tmp_path):
    """On Linux, PyPI's torch is the CUDA build: `make setup` installs the pinned CPU wheel from
    PyTorch's index first where `nvidia-smi` finds no GPU, and leaves the CUDA path as it was where
    it finds one; TORCH_VARIANT overrides the guess."""
    if platform.system() != "Linux" or shutil.which("make") is None:
        pytest.skip("the decision is Linux's (PyPI's torch is CUDA there); needs make")
    fake = tmp_path / "gpu"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3"\n')
    (fake / "nvidia-smi").chmod(0o755)
    no_gpu = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists())

    def plan(path: str, **env) -> str:  # what `make setup` would run for the virtualenv, not running it
        res = subprocess.run(["make", "-n", "-W", "requirements.txt", ".venv/.installed"], cwd=ROOT, text=True,
                             capture_output=True, env={**os.environ, "PATH": path, **env}, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout

    pin = next(l for l in (ROOT / "requirements.txt").read_text().splitlines() if l.startswith("torch=="))
    cpu = "--index-url https://download.pytorch.org/whl/cpu " + pin
    assert cpu in plan(no_gpu) and cpu in plan(os.pathsep.join([str(fake), no_gpu]), TORCH_VARIANT="cpu")
    for gpu in (plan(os.pathsep.join([str(fake), no_gpu])), plan(no_gpu, TORCH_VARIANT="cuda")):
        assert "download.pytorch.org" not in gpu and "-r requirements.txt" in gpu
    assert "pip install torch" not in (ROOT / "README.md").read_text()  # no step by hand before `make demo`


def test_benchmarks_open_with_todays_figures_and_each_results_file_exists():
    """bench/BENCHMARKS.md is today's answers, one section per subject (the history has its own
    file): it opens with the table of figures, and every results file that table names is there."""
    text = (ROOT / "bench" / "BENCHMARKS.md").read_text()
    assert len(text.splitlines()) < 700 and (ROOT / "bench" / "HISTORY.md").is_file() and "(HISTORY.md)" in text
    first = text.split("\n## ", 2)[1]
    assert first.startswith("Today's figures") and "| subject | command | today's figure | results file | date |" in first
    named = re.findall(r"`([\w./-]+\.json|cuda-[\w-]+/)`", first)
    assert named and [n for n in named if not (ROOT / "bench" / "results" / n).exists()] == []
    anchors = set(re.findall(r"\]\(#([\w-]+)\)", first))
    headings = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in re.findall(r"^## (.+)$", text, re.M)}
    assert anchors and anchors <= headings, anchors - headings


def test_no_benchmark_imports_another():
    """What benchmarks share lives in bench/'s modules (the package, corpus.py, toy.py), never in
    another benchmark: a script is one measurement, read and run on its own."""
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text()}
    assert {"bench_rewards", "bench_selection", "bench_real", "compare_compilers"} <= scripts
    for p in (ROOT / "bench").glob("*.py"):
        tree = ast.parse(p.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in imported if m.startswith("bench.") and m.split(".")[1] in scripts}, p.name


def all_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """Every project module a file imports, inside functions too (a command's lazy imports)."""
    return set().union(set(), *(imported(node, modules) for node in ast.walk(tree)))


def test_training_holds_the_trainer_and_what_it_runs_on():
    """A module in training/ is the trainer, its callbacks, something they run on, or something the
    package beyond the commands reads: what only a command uses lives in commands/."""
    trees = project_modules()
    graph = {m: all_imports(t, set(trees)) - {m} for m, t in trees.items()}
    reach, todo = set(), ["ocaml_grpo.training.trainer", "ocaml_grpo.training.callbacks"]
    while todo:
        m = todo.pop()
        if m not in reach:
            reach.add(m)
            todo += [n for n in graph[m] if n.startswith("ocaml_grpo.training")]
    shared = {n for m, ns in graph.items() if m.startswith("ocaml_grpo") and not in_commands(m)
              and not m.startswith("ocaml_grpo.training") for n in ns}
    training = {m for m in trees if m.startswith("ocaml_grpo.training.")}
    assert len(reach) > 8
    assert sorted(training - reach - shared) == []


def test_root_scripts_are_doors():
    """The commands a user runs are doors over the package, as TRL's scripts are: a docstring with
    the commands, the arguments, then named phases."""
    long = {p.name: n for p in ROOT.glob("*.py") if (n := len(p.read_text().splitlines())) > 150}
    assert long == {} and {"train.py", "bundle.py"} <= {p.name for p in ROOT.glob("*.py")}
