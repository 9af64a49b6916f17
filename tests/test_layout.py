"""The layout's promises, read from the source: no import cycle between the project's modules,
and no project import hidden inside a function (the way a cycle is usually dodged)."""
import ast

from conftest import ROOT

PACKAGES = ("ocaml_grpo", "bench")


def project_modules() -> dict[str, ast.Module]:
    files = sorted(ROOT.glob("*.py")) + [f for pkg in PACKAGES for f in sorted((ROOT / pkg).glob("*.py"))]
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
    trees = project_modules()
    lazy = []
    for name, tree in trees.items():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy += [f"{name}.{fn.name}: {m}" for node in ast.walk(fn) for m in imported(node, set(trees))]
    assert lazy == []


COMMANDS = {"train", "analyze", "evaluate"}  # the files a user runs (rewards.py's CLI aside: it is the policy)


def test_layers_hold():
    """Commands on top; rewards.py (the reward policy) above the grader; ocaml_sandbox.py below it;
    nothing in ocaml_grpo/ imports rewards.py or a command (what they share lives in ocaml_grpo/,
    and what only a command may build, like the reward's scorer, is passed in)."""
    trees = project_modules()
    graph = {m: top_level_imports(t, set(trees)) - {m} for m, t in trees.items()}
    up = {m: sorted(graph[m] & (COMMANDS | {"rewards"})) for m in graph if m.startswith("ocaml_grpo")}
    assert {m: v for m, v in up.items() if v} == {}
    assert graph["rewards"] & COMMANDS == set()
    # below the grader: its settings and the tool cache (where its launcher is built) only
    assert graph["ocaml_sandbox"] <= {"ocaml_grpo", "ocaml_grpo.settings", "ocaml_grpo.toolcache"}


def test_every_settings_table_is_made_of_settings():
    """One way to write a setting: every table is `Setting(...)`s (names, defaults, parsers, meanings)."""
    from ocaml_grpo.settings import Setting
    from ocaml_grpo.train_config import CONFIG, SETTINGS, SFT_CONFIG
    assert [s for s in CONFIG + SETTINGS + SFT_CONFIG if not isinstance(s, Setting)] == []


# The commands that live in the package: what `train.py sft|demo` and `evaluate.py --probe` run.
COMMANDS_IN_PACKAGE = {"ocaml_grpo.sft", "ocaml_grpo.demo", "ocaml_grpo.probe"}


def test_no_module_below_the_commands_reads_the_environment():
    """Settings are resolved once, at a command's edge, and passed down as typed configs: nothing
    below the commands names os.environ or os.getenv (the sandbox, the grader, the audit cache,
    the reward's configuration, the models' helpers all receive what they need)."""
    trees = project_modules()
    below = [m for m in trees if m == "ocaml_sandbox" or (m.startswith("ocaml_grpo") and m not in COMMANDS_IN_PACKAGE)]
    readers = sorted(m for m in below for node in ast.walk(trees[m])
                     if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                     and isinstance(node.value, ast.Name) and node.value.id == "os")
    assert "ocaml_grpo.settings" in below and readers == []
