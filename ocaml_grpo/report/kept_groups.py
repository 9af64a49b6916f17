"""analyze.py's part on dynamic sampling (GRPO_DYNAMIC_SAMPLING=1): how many groups each step
generated and kept, how many steps reached the round cap (their trained batch held groups that
teach nothing), what was dropped and why, and what share of the generated tokens the loss saw.
Read from metrics.jsonl; a run without dynamic sampling has no such figures (None)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ocaml_grpo.jsonl import read_jsonl
from ocaml_grpo.training.metrics import METRICS_FILE, StepRecord


@dataclass(frozen=True)
class DynamicReport:
    steps: int                          # log steps with dynamic-sampling figures
    at_cap: int                         # of them, steps whose trained batch held groups without spread
    generated: float                    # means per log step over those steps
    kept: float
    rounds: float
    frac_zero_std_trained: float
    dropped: dict[str, float]           # too_hard / too_easy / identical / surplus -> mean per log step
    tokens_trained: float               # share of the generated completion tokens in the trained batches

    @property
    def tokens_per_kept(self) -> str:
        """What a kept group cost in generation, as a multiple of one group's generation."""
        return f"{self.generated / self.kept:.1f}" if self.kept else "n/a (no group kept)"


def read_dynamic_report(run_dir: Path) -> DynamicReport | None:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return None
    dyn = [r.dynamic for r in map(StepRecord.from_json, read_jsonl(path)[0]) if r.dynamic]
    if not dyn:
        return None
    mean = lambda k: sum(d.get(k) or 0.0 for d in dyn) / len(dyn)  # noqa: E731
    return DynamicReport(len(dyn), sum((d.get("frac_zero_std_trained") or 0.0) > 0 for d in dyn),
                         mean("groups_generated"), mean("groups_kept"), mean("generation_rounds"),
                         mean("frac_zero_std_trained"),
                         {k: mean(f"dropped_{k}") for k in ("too_hard", "too_easy", "identical", "surplus")},
                         mean("tokens_trained"))


def render(r: DynamicReport) -> list[str]:
    dropped = ", ".join(f"{k} {v:.1f}" for k, v in r.dropped.items())
    cap = (f"{r.at_cap} of {r.steps} log steps reached the round cap (GRPO_DYNAMIC_SAMPLING_ROUNDS) and trained "
           f"on groups that teach nothing too (frac_zero_std of the trained batch {r.frac_zero_std_trained:.2f} on "
           "average); where that is most steps, few problems teach, and the remedies for their kind of zero "
           "variance (above) cost less than more rounds." if r.at_cap else
           "No step reached the round cap: every trained batch held only groups that teach.")
    return ["## Dynamic Sampling", "",
            f"Per log step, over {r.steps}: {r.generated:.1f} groups generated in {r.rounds:.2f} rounds, {r.kept:.1f} "
            f"kept (they teach): each kept group cost {r.tokens_per_kept} groups' generation. Dropped per step: "
            f"{dropped}. {r.tokens_trained:.0%} of the generated completion tokens reached the loss. {cap}", ""]
