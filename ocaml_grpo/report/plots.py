"""The plots of the training-health report (analyze.py): the story of a run at a glance."""
from __future__ import annotations

import os
from pathlib import Path

from ocaml_grpo.reward.parts import PART_NAMES
from ocaml_grpo.training.health import THRESHOLDS, Thresholds, expected_reward
from ocaml_grpo.training.learning_log import LogLine, series


def plot_epochs(lines: list[LogLine]) -> list[float]:
    """x positions: the records' epochs. A bare learning.log rounds them to 0.01, so lines sharing a
    value are spread across that bin."""
    xs, i = [], 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].epoch == lines[i].epoch:
            j += 1
        xs += [lines[i].epoch + 0.01 * ((k - i + 0.5) / (j - i) - 0.5) for k in range(i, j)]
        i = j
    return xs


def _save(fig, path: Path) -> None:
    tmp = path.with_name(path.stem + ".tmp.png")     # atomic: a viewer never sees half a PNG
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def make_plots(lines: list[LogLine], per_step: dict[int, dict[str, float]], lr_schedule: str, title: str,
               out_dir: Path, th: Thresholds = THRESHOLDS) -> list[Path]:
    """training_curves.png from the log lines, reward_components.png from the breakdown log's
    per-step component means (empty: not drawn)."""
    # matplotlib takes about a second to import: only when a report is written, never for analyze().
    import matplotlib
    matplotlib.use("Agg")               # headless: training boxes have no display
    import matplotlib.pyplot as plt
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if lines:
        fig, axes = plt.subplots(3, 2, figsize=(13, 11))
        x = plot_epochs(lines)
        pick = lambda key: ([xi for xi, l in zip(x, lines) if key in l.values], series(lines, key))  # noqa: E731
        ax = axes[0, 0]
        e, m = pick("reward")
        s = [l.values.get("reward_std", 0.0) for l in lines if "reward" in l.values]
        ax.plot(e, m, "o-", ms=3, label="reward mean")
        # The reward lies in [0, 1]: a band past either end would show rewards no completion can get.
        ax.fill_between(e, [max(0.0, a - b) for a, b in zip(m, s)], [min(1.0, a + b) for a, b in zip(m, s)],
                        alpha=0.25, label="± std (within [0, 1])")
        grid = [min(x) + (max(x) - min(x)) * i / 50 for i in range(51)]
        ax.plot(grid, [expected_reward(g, th) for g in grid], "g--", label="expected (trajectory)")
        ax.set(title="Reward (mean ± std)", ylabel="reward")
        ax.legend(fontsize=8)
        panels = [(axes[0, 1], "frac_zero_std", "frac_zero_std (share of groups with identical rewards)",
                   [(th.zero_std_healthy, "g", "healthy <"), (th.zero_std_critical, "r", "critical ≥")]),
                  (axes[1, 0], "entropy", "Entropy", [(th.entropy_low, "g", "band"), (th.entropy_high, "g", None)]),
                  (axes[1, 1], "lr", f"Learning rate ({lr_schedule})", []),
                  (axes[2, 0], "grad", "Gradient norm", [(th.grad_low, "g", "band"), (th.grad_high, "g", None)]),
                  (axes[2, 1], "loss", "Loss", [(0.0, "k", None)])]
        for ax, key, panel_title, hlines in panels:
            ax.plot(*pick(key), "o-", ms=3)
            for y, col, lab in hlines:
                ax.axhline(y, color=col, ls="--", lw=1, label=lab)
            ax.set(title=panel_title, ylabel=key)
            if any(lab for _, _, lab in hlines):
                ax.legend(fontsize=8)
        for ax in axes.flat:
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
        fig.suptitle(title)
        fig.tight_layout()
        _save(fig, out_dir / "training_curves.png")
        plt.close(fig)
        written.append(out_dir / "training_curves.png")
    if per_step:
        fig, ax = plt.subplots(figsize=(10, 5))
        # A record's step is the trainer's count before the step that scored it (0 for the first);
        # learning.log numbers the same step 1, as its epoch does: plot it the log's way.
        steps = list(per_step)
        xs = [s + 1 for s in steps]
        for comp in ("reward", *PART_NAMES):
            ax.plot(xs, [per_step[s][comp] for s in steps], "o-" if len(steps) < 50 else "-",
                    ms=3, lw=2.5 if comp == "reward" else 1.2, label=comp)
        ax.set(title="Reward components per step (mean over scored completions)",
               xlabel="optimizer step (1 = the first, as in learning.log)",
               ylabel="weighted score")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        _save(fig, out_dir / "reward_components.png")
        plt.close(fig)
        written.append(out_dir / "reward_components.png")
    return written
