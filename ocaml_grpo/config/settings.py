"""Settings read from the environment: each one defined once (name, default, parser, meaning), so
that validation, `python train.py --help`, config.json and the report's fallback all come from
the same definition.

A setting is a field of a typed config record (`setting(...)`): the record's default is its
parsed default, and `settings_of(Record)` lists what the record reads. Reading is two steps:
`read` parses a list of settings from an environment (values by variable name, and one message
per bad value), `build` makes a record from those values (a field whose variable was not read
keeps its default). ocaml_grpo/config/__init__.py's `resolve` does both for every record.

A parser takes the raw string and returns the typed value, or raises ValueError; its `accepts`
attribute says what it takes, for the error message and --help. Nothing here imports torch.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence, TypeVar

Parser = Callable[[str], Any]
Record = TypeVar("Record")


def cache_dir(environ: Mapping[str, str]) -> Path:
    """Where the project caches what it builds (demo models, the compile server):
    $XDG_CACHE_HOME/ocaml-grpo, by default ~/.cache/ocaml-grpo."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ocaml-grpo"


class Setting(NamedTuple):
    name: str  # the environment variable
    default: str  # as it would be exported
    parse: Parser
    meaning: str

    def value(self, raw: str, environ: Mapping[str, str]) -> Any:
        return self.parse(raw, environ) if getattr(self.parse, "reads_environ", False) else self.parse(raw)


def read(settings: Sequence[Setting], environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Typed values by name, and one message per invalid value (naming the variable). An unset
    or blank variable takes its default."""
    values, errors = {}, []
    for s in settings:
        raw = environ.get(s.name, "").strip() or s.default
        try:
            values[s.name] = s.value(raw, environ)
        except ValueError:
            errors.append(f"{s.name}={raw!r} is invalid: expected {s.parse.accepts} ({s.meaning})")
    return values, errors


# ----------------------------------------------------------------------------- records
# A config record is a dataclass whose fields say where their values come from (the metadata
# key): one variable (SETTING), a record of its own read from several (GROUP: the reward's
# weights), or another config record (SECTION: the sandbox's within the reward's).
SETTING, GROUP, SECTION = "setting", "group", "section"


def setting(name: str, default: str, parse: Parser, meaning: str) -> Any:
    """A record's field read from the variable `name`; without it, the field is `default` parsed."""
    s = Setting(name, default, parse, meaning)
    return field(default_factory=lambda: s.value(default, {}), metadata={SETTING: s})


def group(cls: type, settings: Mapping[str, Setting]) -> Any:
    """A field holding a `cls` whose fields (the keys) are read from these settings."""
    return field(default_factory=cls, metadata={GROUP: (cls, dict(settings))})


def section(cls: type) -> Any:
    """A field holding another config record."""
    return field(default_factory=cls, metadata={SECTION: cls})


def settings_of(cls: type, sections: bool = True) -> list[Setting]:
    """What a record reads, in field order (its sections' settings too, unless sections=False)."""
    out = []
    for f in fields(cls):
        if SETTING in f.metadata:
            out.append(f.metadata[SETTING])
        elif GROUP in f.metadata:
            out += f.metadata[GROUP][1].values()
        elif SECTION in f.metadata and sections:
            out += settings_of(f.metadata[SECTION])
    return out


def build(cls: type[Record], values: Mapping[str, Any]) -> Record:
    """A `cls` from values by variable name (`read`'s): a field whose variable is missing keeps its default."""
    kwargs = {}
    for f in fields(cls):
        if SETTING in f.metadata and f.metadata[SETTING].name in values:
            kwargs[f.name] = values[f.metadata[SETTING].name]
        elif GROUP in f.metadata:
            record, parts = f.metadata[GROUP]
            kwargs[f.name] = record(**{part: values[s.name] for part, s in parts.items() if s.name in values})
        elif SECTION in f.metadata:
            kwargs[f.name] = build(f.metadata[SECTION], values)
    return cls(**kwargs)


def by_name(record: Any) -> Iterator[tuple[str, Any]]:
    """(variable, value) for every setting a record holds, in field order."""
    for f in fields(record):
        v = getattr(record, f.name)
        if SETTING in f.metadata:
            yield f.metadata[SETTING].name, v
        elif GROUP in f.metadata:
            yield from ((s.name, getattr(v, part)) for part, s in f.metadata[GROUP][1].items())
        elif SECTION in f.metadata:
            yield from by_name(v)


def from_env(cls: type[Record], environ: Mapping[str, str]) -> Record:
    """One record alone, for the commands and tests that need only it (the reward's, the
    sandbox's); ValueError naming every bad variable."""
    values, errors = read(settings_of(cls), environ)
    if errors:
        raise ValueError("; ".join(errors))
    return build(cls, values)


# Variables named like the project's: one that is not a setting is a typo, not something to ignore.
PROJECT_PREFIXES = ("GRPO_", "LORA_", "REWARD_", "SFT_")


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of neighbours that turn a into b."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def near_miss(name: str, known: Sequence[str]) -> str | None:
    """The project variable `name` is a typo of, when it is one or two keystrokes from it. The
    environment holds many names that are not ours (PATH, HF_HOME, ...): a name must be at least
    8 characters long and its closest variable unique for it to count as a typo."""
    if len(name) < 8:
        return None
    scored = sorted((edit_distance(name, k), k) for k in known)
    best = [k for dist, k in scored if dist == scored[0][0]]
    return best[0] if scored and scored[0][0] <= 2 and len(best) == 1 else None


def unknown_variables(environ: Mapping[str, str], known: Sequence[str], retired: Mapping[str, str] = {},
                      prefixes: tuple[str, ...] = PROJECT_PREFIXES) -> list[str]:
    """One message per variable that looks like one of ours but is not (named with a project
    prefix, or a near miss of any variable: TRAINING_DATASE, OCAML_CPU_LIMT_S): a misspelt name
    would otherwise be ignored and the run would silently use the default."""
    errors = []
    for name in sorted(n for n in environ if n not in known):
        if name in retired:
            errors.append(f"{name} is no longer read: {retired[name]}")
            continue
        close = near_miss(name, known)
        if close is None and not name.startswith(prefixes):
            continue
        close = close or next(iter(difflib.get_close_matches(name, known, n=1)), None)
        errors.append(f"{name} is not a variable of this project" + (f": did you mean {close}?" if close else ""))
    return errors


def defaults(settings: Sequence[Setting]) -> dict[str, Any]:
    values, errors = read(settings, {})
    assert not errors, errors  # a default its own parser rejects is a bug in the table
    return values


def describe(settings: Sequence[Setting]) -> str:
    """The --help text: `NAME=default`, then the meaning and what is accepted."""
    return "\n".join(f"  {name}={default}\n      {meaning}; {parse.accepts}" for name, default, parse, meaning in settings)


def default_workers(environ: Mapping[str, str]) -> int:
    """Cores per training process: N processes on one machine (accelerate launch sets
    LOCAL_WORLD_SIZE) share the cores instead of each taking all of them."""
    return max(1, (os.cpu_count() or 1) // max(1, int(environ.get("LOCAL_WORLD_SIZE") or 1)))


def default_torch_threads(environ: Mapping[str, str]) -> int:
    """torch's threads per training process: OMP_NUM_THREADS when exported, else half of the
    process's cores (at least 1). torch's default, a thread per core, spin-waits for its slowest
    thread at every operation: a neighbour on one core (an evaluation, the grader's compiles)
    then stalls all of them (bench/bench_load.py)."""
    if (environ.get("OMP_NUM_THREADS") or "").strip().isdigit() and int(environ["OMP_NUM_THREADS"]) > 0:
        return int(environ["OMP_NUM_THREADS"])
    return max(1, default_workers(environ) // 2)


# ----------------------------------------------------------------------------- parsers

def Int(lo: int, hi: int | None = None) -> Parser:
    def p(s: str) -> int:
        v = int(s)
        if v < lo or (hi is not None and v > hi):
            raise ValueError
        return v
    p.accepts = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
    return p


def Float(lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False) -> Parser:
    def p(s: str) -> float:
        v = float(s)
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
            raise ValueError
        return v
    p.accepts = f"a number in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open or hi == math.inf else ']'}"
    return p


def Choice(*options: str) -> Parser:
    def p(s: str) -> str:
        if s not in options:
            raise ValueError
        return s
    p.accepts = "one of " + ", ".join(options)
    return p


def Flag(s: str) -> bool:
    if s not in ("0", "1"):
        raise ValueError
    return s == "1"
Flag.accepts = "0 or 1"


def Text(s: str) -> str:
    if not s.strip():
        raise ValueError
    return s.strip()
Text.accepts = "a non-empty string"


def Resume(s: str) -> str:
    if s in ("auto", "never"):
        return s
    if not Path(s).is_dir():
        raise ValueError
    return s
Resume.accepts = "auto, never, or an existing checkpoint directory"


def AdapterDir(s: str) -> str:
    if s and not (Path(s) / "adapter_config.json").is_file():
        raise ValueError
    return s
AdapterDir.accepts = "empty, or a directory holding adapter_config.json (e.g. sft_runs/final_adapter)"


def ModuleList(s: str) -> str:
    mods = [m.strip() for m in s.split(",") if m.strip()]
    if not mods or any(not re.fullmatch(r"[\w.]+", m) for m in mods):
        raise ValueError
    return ",".join(mods)
ModuleList.accepts = "comma-separated module names, e.g. q_proj,v_proj"


def Auto(parse: Parser, auto: Callable[[Mapping[str, str]], Any], when: str) -> Parser:
    """`auto` (the default) computes the value at start-up, from the environment being resolved;
    anything else goes to `parse`."""
    def p(s: str, environ: Mapping[str, str]) -> Any:
        return auto(environ) if s == "auto" else parse(s)
    p.accepts = f"auto ({when}) or {parse.accepts}"
    p.reads_environ = True
    return p


def Holdout(s: str):
    """A fraction in [0, 1), a count, or comma-separated problem ids."""
    s = s.strip()
    try:
        v = float(s)
    except ValueError:
        ids = [i.strip() for i in s.split(",") if i.strip()]
        if not ids:
            raise ValueError from None
        return ids
    if not math.isfinite(v) or v < 0 or (v >= 1 and v != int(v)):
        raise ValueError
    return v if v < 1 else int(v)
Holdout.accepts = "a fraction in [0, 1), a number of problems, or comma-separated problem ids"
