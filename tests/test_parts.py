"""The reward's parts are listed once (ocaml_grpo/reward/parts.py, PARTS) and everything else derives
from that list: the breakdown's fields, the weights and their settings, the metrics, learning.log's
[Curriculum] line, analyze.py's tables and plots."""
import ast
import dataclasses

from conftest import ROOT
from ocaml_grpo.config import REWARD_SETTINGS, RewardConfig
from ocaml_grpo.reward.breakdown import Breakdown
from ocaml_grpo.reward.parts import CURRICULUM, PART_NAMES, PARTS, Weights
from ocaml_grpo.training.learning_log import curriculum_line

LIST = "ocaml_grpo/reward/parts.py"
# The dataset's columns (a problem's `tests`), which share a name with a part, are named there.
COLUMNS = "ocaml_grpo/problems.py"
# What the project calls a Problem where it reads its tests (`problem.tests`, `p.tests`).
PROBLEM_NAMES = {"problem", "p"}


def spelled_parts(tree: ast.AST, path: str) -> list[str]:
    """Where a module spells a reward part's name outside the one list. The rule:

    - a string constant equal to a part's name (`"type_check"`, a dict key, a column name),
      except the dataset's `tests` column in problems.py;
    - an attribute named after a part (`b.structural`, `weights.tests = ...`), read or written,
      except a method call (`steps.compile(...)` is the grader's compile step, not the part) and a
      problem's `tests` (the receiver is a Problem: `problem.tests`, `p.tests`, `self.tests` in
      class Problem).

    Consumers reach the parts by iterating PARTS (`getattr(b, part.name)`, `Breakdown.part`,
    `reward.parts.weight`) or through the names derived from it, so none of this is needed there."""
    found, problem_classes = [], {n for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "Problem"
                                  for n in ast.walk(c)}
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in PART_NAMES:
            if not (path == COLUMNS and node.value == "tests"):
                found.append(f"{path}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in PART_NAMES and id(node) not in calls:
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr == "tests" and (receiver in PROBLEM_NAMES or (receiver == "self" and node in problem_classes)):
                continue
            found.append(f"{path}:{node.lineno}: .{node.attr}")
    return found


def test_a_parts_name_is_spelled_only_in_the_list():
    files = sorted(ROOT.glob("*.py")) + sorted((ROOT / "ocaml_grpo").rglob("*.py"))
    found = []
    for f in files:
        path = f.relative_to(ROOT).as_posix()
        if path != LIST:
            found += spelled_parts(ast.parse(f.read_text(encoding="utf-8")), path)
    assert found == []
    # the list itself is seen (the scan is not blind)
    assert len(spelled_parts(ast.parse((ROOT / LIST).read_text()), LIST)) >= len(PARTS)


def test_the_rule_tells_parts_from_methods_and_a_problems_tests():
    caught = spelled_parts(ast.parse(
        "b.structural = 1\nx = w.type_check\nrecord['compile']\nb.tests += 1\nself.weights.compile\n"
        "steps.compile('a.ml')\nproblem.tests\np.tests\nclass Problem:\n    def f(self):\n        return self.tests\n"
        "def g(self):\n    return self.tests\n"), "x.py")
    assert set(caught) == {"x.py:1: .structural", "x.py:2: .type_check", "x.py:3: 'compile'", "x.py:4: .tests",
                           "x.py:5: .compile", "x.py:13: .tests"}  # not 6-8, 11


def test_everything_derives_from_the_list():
    names = [f.name for f in dataclasses.fields(Breakdown)]
    assert names[:2 + len(PARTS)] == ["problem_id", "reward", *PART_NAMES]  # the JSONL keys, in their order
    assert [f.name for f in dataclasses.fields(Weights)] == list(PART_NAMES)
    assert Weights() == RewardConfig().weights and [getattr(Weights(), p.name) for p in PARTS] == [p.weight for p in PARTS]
    assert [s.name for s in REWARD_SETTINGS if s.name.startswith("REWARD_WEIGHT_")] == [p.setting for p in PARTS]
    # the [Curriculum] line as learning.log has always written it
    assert curriculum_line("syntax", 0.0, CURRICULUM[0][2]) == \
        "[Curriculum] phase syntax from epoch 0.00: structural 0.10  type 0.40  compile 0.30  tests 0.20"
