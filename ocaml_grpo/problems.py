"""OCaml problem sets: reading rows from local files or the Hugging Face hub into `Problem`s.

Shared by train.py, evaluate.py and the rewards CLI. Local files load with the standard
library (parquet through pyarrow); `datasets` is imported only for hub ids.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "ocaml_problems.jsonl"
LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


class DatasetError(ValueError):
    """A problem set that cannot be used; the message names the file/dataset and columns."""


# The columns of a row that hold OCaml text. The dataset's `tests` column (a problem's tests) is
# spelled in this file only: the reward's parts (reward/parts.py) have a `tests` part too.
TEXT_COLUMNS = ("prompt", "problem", "tests", "solution")


@dataclass
class Problem:
    id: str
    prompt: str  # doc comment + signature line `let f (x : t) : r =`
    tests: str
    requires: list[str] = field(default_factory=list)  # findlib packages, e.g. ["base"]
    difficulty: str = ""
    solution: str = ""
    entry_point: str = ""
    stub: str = ""  # a placeholder with the expected signature(s), when the source has one

    def to_row(self) -> dict:
        """The training dataset's columns (what the reward function receives, one list per column)."""
        return {"id": self.id, "problem": self.prompt, "tests": self.tests, "requires": list(self.requires),
                "difficulty": self.difficulty, "entry_point": self.entry_point}

    @classmethod
    def from_row(cls, row: dict) -> "Problem":
        """The inverse of to_row. `id`, `problem` and `tests` are required: a ValueError names a
        missing one (a reward computed without the problem's tests would be meaningless)."""
        missing = [c for c in ("id", "problem", "tests") if row.get(c) in (None, "")]
        if missing:
            raise ValueError(f"reward function: the dataset has no {', '.join(missing)} column(s) "
                             f"(expected Problem.to_row's: {', '.join(cls('', '', '').to_row())})")
        return cls(id=str(row["id"]), prompt=str(row["problem"]), tests=str(row["tests"]),
                   requires=_parse_requires(row.get("requires")), difficulty=str(row.get("difficulty") or ""),
                   entry_point=str(row.get("entry_point") or ""))


def _parse_requires(value) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            value = json.loads(value)
        else:
            value = value.replace(";", ",").split(",")
    return [str(v).strip() for v in value if str(v).strip()]


def rows_to_problems(rows: list[dict], source: str) -> list[Problem]:
    if not rows:
        raise DatasetError(f"{source}: no rows (expected columns id, prompt or problem, tests)")
    cols = set(rows[0])
    missing = [c for c in ("id", "tests") if c not in cols]
    if "prompt" not in cols and "problem" not in cols:
        missing.append("prompt (or problem)")
    if missing:
        raise DatasetError(f"{source}: missing column(s) {', '.join(missing)}; found {sorted(cols)}")
    problems = []
    for n, r in enumerate(rows, 1):
        prompt = r.get("prompt") if isinstance(r.get("prompt"), str) else r.get("problem")
        if not isinstance(prompt, str) or r.get("id") in (None, ""):
            raise DatasetError(f"{source}: row {n} has no id or no text prompt")
        problems.append(Problem(
            id=str(r["id"]), prompt=prompt, tests=str(r.get("tests") or ""),
            requires=_parse_requires(r.get("requires")), difficulty=str(r.get("difficulty") or ""),
            solution=str(r.get("solution") or ""), entry_point=str(r.get("entry_point") or ""),
            stub=str(r.get("stub") or "")))
    return problems


def read_rows(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file{nearest_file(path)}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise DatasetError(f"{path}: line {n} is not JSON ({e.msg})") from None
        return rows
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):  # {"train": [...]} or {"data": [...]}
            data = next((v for v in data.values() if isinstance(v, list)), [])
        return list(data)
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if suffix == ".parquet":
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    raise DatasetError(f"{path}: unsupported file type (use {', '.join(LOCAL_SUFFIXES)})")


def is_hub_id(spec: str) -> bool:
    """Whether load_problems reads `spec` from the Hugging Face hub."""
    return not (spec in ("bundled", "", None) or Path(spec).suffix.lower() in LOCAL_SUFFIXES or Path(spec).exists())


def nearest_file(path: Path) -> str:
    """What the user probably meant by a file that does not exist: the closest name of a dataset
    file in its folder (or the nearest folder that exists), and the bundled set."""
    import difflib
    folder = path.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    names = [p.name for p in folder.iterdir() if p.suffix.lower() in LOCAL_SUFFIXES] if folder.is_dir() else []
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return ((f"; did you mean {folder / close[0]}?" if close else "")
            + f" (or `bundled`: the project's own problems, {BUNDLED.relative_to(BUNDLED.parents[1])})")


def load_problems(spec: str | Path, split: str = "train") -> list[Problem]:
    """`spec`: a local file, `bundled`, or a hub dataset id."""
    if isinstance(spec, Path):
        spec = str(spec)
    if spec in ("bundled", "", None):
        return rows_to_problems(read_rows(BUNDLED), str(BUNDLED))
    import difflib
    if "/" not in spec and not Path(spec).exists() and difflib.SequenceMatcher(None, spec.lower(), "bundled").ratio() >= 0.75:
        raise DatasetError(f"{spec}: no such file or dataset; did you mean bundled (the project's own problems)?")
    if not is_hub_id(spec):
        return rows_to_problems(read_rows(spec), spec)
    return rows_to_problems(_load_hub_rows(spec, split), f"{spec} (hub, split {split})")


def _load_hub_rows(name: str, split: str) -> list[dict]:
    try:
        import datasets
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # offline, unknown id, no cache: all end the same way for the user
        from huggingface_hub import constants  # the hub library's own reading of HF_HUB_OFFLINE
        offline = constants.HF_HUB_OFFLINE
        raise DatasetError(
            f"could not load dataset {name!r} from the Hugging Face hub"
            f"{' (offline mode)' if offline else ''}: {type(e).__name__}: {str(e)[:300]}\n"
            f"Point TRAINING_DATASET at a local .jsonl/.json/.csv/.parquet file, or use the bundled "
            f"set: TRAINING_DATASET=bundled ({BUNDLED})") from None
    return [dict(r) for r in ds]
