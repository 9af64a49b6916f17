"""analyze.py's part on what the groups taught: which kind of zero variance a run had and the
remedy that matches it, the problem tracker's states over time, and the selection's choices.

A group with identical rewards teaches nothing, but the remedies differ with the reason:
    too_hard   no completion passed a test: train on problems the model can sometimes solve
               (probe + GRPO_PROBLEM_STATS), REWARD_CURRICULUM=1 (partial credit first), a stronger
               base model or an SFT warm start;
    too_easy   every completion passed: drop them (probe + GRPO_PROBLEM_STATS), the tracker draws them less;
    identical  the completions score alike otherwise: more diverse samples (GRPO_TEMPERATURE, more
               GRPO_NUM_GENERATIONS). Only this one looks like the seed's "mode collapse".
A remedy the run already has on is not offered again; with the kind unknown (no breakdown log), none is.

Reads, judges and renders in separate functions; no I/O beyond reading the run directory's files.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from ocaml_grpo.reward.breakdown import Breakdown
from ocaml_grpo.reward.group_kinds import KINDS, TITLES, STATES, TRACKING_FILE, ZERO_VARIANCE, group_kind, states_over_time
from ocaml_grpo.training.selection import SELECTION_FILE

# A kind's remedies: (what its groups show, [(what to do, the setting it turns on, or None)], a
# closing remark). A remedy whose setting the run already has on is left out of its advice (remedy()).
REMEDIES = {
    "too_hard": ("no completion passed any test in them.", [
        ("train on problems the model sometimes solves: probe them (`python evaluate.py --probe probe.jsonl`) "
         "and set GRPO_PROBLEM_STATS=probe.jsonl", "GRPO_PROBLEM_STATS"),
        ("reward partial credit first (REWARD_CURRICULUM=1)", "REWARD_CURRICULUM"),
        ("let the model read the compiler's diagnosis and answer again (GRPO_REPAIR_TURNS=1)", "GRPO_REPAIR_TURNS"),
        ("start from a stronger base model or an SFT warm start (`python train.py sft`)", None)],
        "More samples or a higher temperature rarely help here."),
    "too_easy": ("every completion passed every test in them.", [
        ("drop the mastered problems: probe them (`python evaluate.py --probe probe.jsonl`) and set "
         "GRPO_PROBLEM_STATS=probe.jsonl", "GRPO_PROBLEM_STATS"),
        ("let the problem tracker (GRPO_TRACK_PROBLEMS=1) draw them less", "GRPO_TRACK_PROBLEMS")], ""),
    "identical": ("the completions scored alike without all passing or all failing (e.g. the same wrong answer).", [
        ("sample more diversely (GRPO_TEMPERATURE) or more completions per group (GRPO_NUM_GENERATIONS)", None)], ""),
}


def remedy(kind: str, config: dict | None = None) -> str:
    """What a kind's groups show and what to do about them, less what `config` already has on."""
    shown, todo, remark = REMEDIES[kind]
    left = [text for text, setting in todo if not (setting and (config or {}).get(setting))]
    if not left:
        return f"{shown} {remark}".strip()
    said = left[0] if len(left) == 1 else "; ".join(left[:-1]) + "; or " + left[-1]
    return f"{shown} {said[0].upper()}{said[1:]}. {remark}".strip()


@dataclass
class GroupReport:
    kinds: dict[str, int]                          # groups of each kind, from the breakdown log
    states: list[tuple[int, dict[str, int]]]       # (step, problems in each state) from the tracking file
    selection: dict | None                         # {"kept", "problems", "dropped": {reason: n}} or None

    @property
    def zero_variance(self) -> int:
        return sum(self.kinds[k] for k in ZERO_VARIANCE)

    @property
    def dominant(self) -> str | None:
        """The most common kind of zero variance (None when there was none, or no breakdown log)."""
        z = {k: self.kinds[k] for k in ZERO_VARIANCE if self.kinds[k]}
        return max(z, key=z.get) if z else None


def count_kinds(recs: list[dict]) -> dict[str, int]:
    """Groups of each kind: the `group` field the trainer wrote, or, for logs older than it, the
    kind computed from the group's rewards and test counts."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in recs:
        groups[(r.get("step"), str(r.get("problem_id")))].append(r)
    out = Counter()
    for rs in groups.values():
        if rs[0].get("group") in KINDS:
            out[rs[0]["group"]] += 1
            continue
        scored = [Breakdown.from_record(r) for r in rs if r.get("reward") is not None]
        out[group_kind([float(b.reward) for b in scored], [b.solved for b in scored],
                       [b.passed_any for b in scored])] += 1
    return {k: out[k] for k in KINDS}


def read_group_report(run_dir: Path, recs: list[dict], read_jsonl, drop_superseded) -> GroupReport:
    """`read_jsonl` and `drop_superseded` are analyze.py's (torn lines skipped; steps redone after a resume once)."""
    events: list[dict] = []
    if (p := run_dir / "reward_logs" / TRACKING_FILE).is_file():
        events = drop_superseded(read_jsonl(p)[0], lambda e: e.get("step") or 0)
    selection, kept = None, []
    if (p := run_dir / SELECTION_FILE).is_file():
        choices = read_jsonl(p)[0]
        kept = [str(c.get("id")) for c in choices if c.get("ok")]
        selection = {"kept": len(kept), "problems": len(choices),
                     "dropped": dict(Counter(str(c.get("reason")) for c in choices if not c.get("ok")).most_common())}
    elif (p := run_dir / "dataset_audit.jsonl").is_file():  # no selection: the problems the audit kept
        kept = [str(c.get("id")) for c in read_jsonl(p)[0] if c.get("ok")]
    return GroupReport(count_kinds(recs), states_over_time(events, kept), selection)


def explain(g: GroupReport, config: dict | None = None) -> tuple[str, str]:
    """(title, detail) for the zero-variance finding; without a zero-variance group in the breakdown
    log the kind is unknown, and the detail says the figures cannot tell which remedy fits."""
    if not g.zero_variance:
        seen = (f"the breakdown log's {sum(g.kinds.values())} groups hold none with identical rewards"
                if sum(g.kinds.values()) else "there is no breakdown log (reward_logs/syntax_aware_breakdown.jsonl)")
        return TITLES[None], (f" Which kind these groups were (too hard, too easy or identical, each with its own "
                              f"remedy) the figures cannot tell: {seen}. No export is advised for it.")
    shares = ", ".join(f"{k} {g.kinds[k]}" for k in ZERO_VARIANCE if g.kinds[k])
    return TITLES[g.dominant], (f" In the breakdown log {g.zero_variance}/{sum(g.kinds.values())} groups had identical "
                                f"rewards ({shares}). Most are {g.dominant}: {remedy(g.dominant, config)}")


def render(g: GroupReport, config: dict | None = None) -> list[str]:
    """The report's markdown section (its remedies less those `config` already has on)."""
    total = sum(g.kinds.values())
    md = ["## What the Groups Taught", "",
          "| Group kind | Groups | Share |", "|---|---:|---:|"]
    md += [f"| {k} | {g.kinds[k]} | {g.kinds[k] / max(1, total):.0%} |" for k in KINDS]
    if g.dominant:
        md += ["", f"Most zero-variance groups are **{g.dominant}**: {remedy(g.dominant, config)}"]
    if g.selection:
        s = g.selection
        md += ["", f"Selection (GRPO_PROBLEM_STATS, `{SELECTION_FILE}`): {s['kept']} of {s['problems']} problems kept; "
               "dropped: " + (", ".join(f"{r} {n}" for r, n in s["dropped"].items()) or "none") + "."]
    if g.states:
        rows = g.states if len(g.states) <= 8 else [g.states[round(i * (len(g.states) - 1) / 7)] for i in range(8)]
        md += ["", f"Problem states over time (the tracker's `reward_logs/{TRACKING_FILE}`; a problem's state is "
               "the learnable rule's verdict on its last group, GRPO_LEARNABLE_*):", "", "| step | " + " | ".join(STATES) + " |",
               "|---:|" + "---:|" * len(STATES)]
        md += [f"| {step} | " + " | ".join(str(c[s]) for s in STATES) + " |" for step, c in rows]
    return md + [""]
