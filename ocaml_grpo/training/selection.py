"""Learnable-problem selection: keep the problems whose GRPO groups will have reward variance,
judged from a probe's statistics (`python evaluate.py --probe`, ocaml_grpo/commands/probe.py).

A problem is kept when its probe rewards differ (std >= GRPO_LEARNABLE_MIN_STD) and it is not
nearly always solved (share solving every test < GRPO_LEARNABLE_MAX_SOLVED): group_kinds.learnable,
the rule the online tracker applies to each problem's last group. A dropped problem gets the
reason its groups would waste (group_kinds.py's words): too_easy, too_hard, identical.
Problems the stats file does not cover are kept (the online tracker judges them). The choices go
to <output dir>/problem_selection.jsonl, one line per problem, like dataset_audit.jsonl.

Pure Python, no torch: train.py selects before any model loads.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ocaml_grpo.config import REWARD_SETTINGS, Config, recorded
from ocaml_grpo.reward.group_kinds import learnable

SELECTION_FILE = "problem_selection.jsonl"


@dataclass(frozen=True)
class ProblemStats:
    """One line of a probe's file: what k completions sampled as GRPO samples scored."""
    id: str
    k: int
    reward_mean: float
    reward_std: float
    solved: float                       # share passing every test
    passed_any: float                   # share passing at least one test
    kind: str                           # group_kinds kind of the k completions as one group
    sampling: dict                      # model, adapter, temperature, top_k, top_p, max_completion, reward settings


@dataclass(frozen=True)
class Choice:
    id: str
    ok: bool
    reason: str | None                  # too_easy / too_hard / identical / not_probed (kept) / None
    stats: ProblemStats | None


def read_stats(path: str | Path) -> list[ProblemStats]:
    """ValueError naming the file and the line when a line is not a probe record. Text after the
    last newline is a line a killed probe did not finish: skipped (the probe samples it again)."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n")[:-1], 1):
        if not line.strip():
            continue
        try:
            out.append(ProblemStats(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}: line {n} is not a probe record ({e}); write it with python evaluate.py --probe") from None
    return out


def judge(s: ProblemStats, min_std: float, max_solved: float) -> str | None:
    """The reason to drop a problem, or None to keep it."""
    verdict = learnable(s.reward_std, s.solved, s.passed_any, min_std, max_solved)
    return None if verdict == "mixed" else verdict


def select(problem_ids: Sequence[str], stats: Sequence[ProblemStats], min_std: float,
           max_solved: float) -> list[Choice]:
    by_id = {s.id: s for s in stats}
    out = []
    for pid in problem_ids:
        s = by_id.get(pid)
        reason = judge(s, min_std, max_solved) if s else None
        out.append(Choice(pid, reason is None, reason if s else "not_probed", s))
    return out


# Sampling settings recorded only when they are not at their default, so older probes still match.
OPTIONAL = ("prompt_examples", "repair")


def sampling_differences(stats: Sequence[ProblemStats], expected: Mapping[str, Any]) -> list[str]:
    """`name: file has X, this run has Y` for every sampling setting the probe ran with that
    differs from the run's (statistics from another model or temperature describe another policy)."""
    seen: dict[str, set] = {}
    for s in stats:
        for k, v in s.sampling.items():
            seen.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    out = []
    # A setting left at its default is absent from `expected` (OPTIONAL); the file may still have it.
    for k, v in {**{k: None for k in seen if k in OPTIONAL}, **expected}.items():
        have = seen.get(k, {json.dumps(None)})
        want = json.dumps(v, sort_keys=True)
        if have != {want}:
            out.append(f"{k}: the file has {' / '.join(sorted(have))}, this run has {want}")
    return out


def summary(choices: Sequence[Choice]) -> str:
    dropped = Counter(c.reason for c in choices if not c.ok)
    probed = sum(c.stats is not None for c in choices)
    return (f"{sum(c.ok for c in choices)} of {len(choices)} problems kept ({probed} probed); dropped "
            + (", ".join(f"{n} {r}" for r, n in dropped.most_common()) or "none"))


def write_choices(out_dir: Path, choices: Sequence[Choice]) -> Path:
    path = out_dir / SELECTION_FILE
    path.write_text("".join(json.dumps({"id": c.id, "ok": c.ok, "reason": c.reason,
                                        **({k: v for k, v in asdict(c.stats).items() if k not in ("id", "sampling")}
                                           if c.stats else {})}) + "\n" for c in choices), encoding="utf-8")
    return path


# The settings that decide what a completion looks like and what it scores: a probe records them
# (by variable name), and train.py warns when its own differ. REWARD_WORKERS changes no score.
# top_k 0 / top_p 1 are how TRL's GRPO samples (GRPOConfig defaults).
REWARD_KEYS = [s for s in REWARD_SETTINGS if s.name != "REWARD_WORKERS"]


def _where(name: str) -> str | None:
    """A local model directory by its absolute path (a relative one names the same model from anywhere)."""
    return str(Path(name).resolve()) if name and Path(name).exists() else (name or None)


def sampling_settings(cfg: Config) -> dict:
    """How train.py's config (or the probe's) samples and scores."""
    return {"model": _where(cfg.train.base_model), "adapter": _where(cfg.train.init_adapter),
            "temperature": cfg.train.temperature, "top_k": 0, "top_p": 1.0,
            "max_completion": cfg.train.max_completion, "reward": recorded(cfg, REWARD_KEYS),
            "stop_at_end": cfg.train.stop_at_end,
            # the prompt's worked examples change every sample (OPTIONAL)
            **({"prompt_examples": cfg.train.prompt_examples} if cfg.train.prompt_examples != 3 else {}),
            # repair turns change what a problem's group scores (OPTIONAL)
            **({"repair": {"turns": cfg.train.repair_turns, "discount": cfg.train.repair_discount}}
               if cfg.train.repair_turns else {})}


def apply_selection(problems: list, cfg: Config) -> tuple[list, list[Choice]]:
    """train.py's step: the problems to train on under GRPO_PROBLEM_STATS (all of them without
    it) and the choices (train.py writes them once the output directory is prepared), counted on
    stdout. ValueError naming the file when it is not a probe's, or when it would leave nothing
    to train on."""
    path = cfg.train.selection.stats_file
    if not path:
        return problems, []
    stats = read_stats(path)
    for diff in sampling_differences(stats, sampling_settings(cfg)):
        print(f"warning: GRPO_PROBLEM_STATS={path} was probed with other settings than this run's ({diff}); "
              "its statistics describe another policy: probe again with this run's settings")
    choices = select([p.id for p in problems], stats, cfg.train.selection.min_std,
                     cfg.train.selection.max_solved)
    print(f"selection (GRPO_PROBLEM_STATS={path}): {summary(choices)}")
    keep = {c.id for c in choices if c.ok}
    if not keep:
        raise ValueError(f"GRPO_PROBLEM_STATS={path} leaves no problem to train on ({summary(choices)}); "
                         "lower GRPO_LEARNABLE_MIN_STD or raise GRPO_LEARNABLE_MAX_SOLVED")
    return [p for p in problems if p.id in keep], choices
