"""The plots of the training-health report (analyze.py): the story of a run at a glance.

Every x axis says what it counts: the optimizer step where metrics.jsonl gives it (the reward panel
shows the epoch on top), else the epoch of a bare learning.log. Tick labels read as the values do
(no offset). The reward's parts are stacked as their shares of the reward, so they sum to it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ocaml_grpo.reward.parts import PART_NAMES
from ocaml_grpo.training.health import THRESHOLDS, Thresholds, expected_reward
from ocaml_grpo.training.learning_log import series
from ocaml_grpo.training.metrics import StepRecord


def plot_epochs(lines: list[StepRecord]) -> list[float]:
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


def _extended(xp: list[float], fp: list[float]) -> Callable:
    """x -> y through the points (xp, fp), straight on past both ends: a secondary axis maps the
    axis' margins too, which lie outside the data."""
    import numpy as np

    def f(x):
        x = np.asarray(x, dtype=float)
        y = np.interp(x, xp, fp)
        y = np.where(x < xp[0], fp[0] + (x - xp[0]) * (fp[1] - fp[0]) / (xp[1] - xp[0]), y)
        return np.where(x > xp[-1], fp[-1] + (x - xp[-1]) * (fp[-1] - fp[-2]) / (xp[-1] - xp[-2]), y)
    return f


def _flat_range(ax, ys: list[float]) -> None:
    """A flat series (a constant learning rate) gets a range from 0, not matplotlib's ±5% zoom on
    nothing, whose ticks (0.00190 - 0.00210) read like a change."""
    top = max(ys, key=abs) if ys else 0.0
    if top and max(ys) - min(ys) <= 1e-6 * abs(top):
        ax.set_ylim(sorted((0.0, 2 * top)))


def make_plots(lines: list[StepRecord], per_step: dict[int, dict[str, float]], lr_schedule: str, title: str,
               out_dir: Path, th: Thresholds = THRESHOLDS, steps: list[int] | None = None) -> list[Path]:
    """training_curves.png from the log lines (x: their optimizer `steps` when known, metrics.jsonl's,
    else their epochs), reward_components.png from the breakdown log's per-step means of the reward
    and of each part's share of it (empty: not drawn)."""
    # matplotlib takes about a second to import: only when a report is written, never for analyze().
    import matplotlib
    matplotlib.use("Agg")               # headless: training boxes have no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if lines:
        fig, axes = plt.subplots(3, 2, figsize=(13, 11))
        # x: what the data count. A tiny dataset makes every step an epoch (the demo: 20 steps, epochs
        # 1-20), so the step is the count a reader follows; the reward panel shows epochs on top.
        by_step = bool(steps) and len(steps) == len(lines)
        x = [float(s) for s in steps] if by_step else plot_epochs(lines)
        epochs = [l.epoch for l in lines]
        pick = lambda key: ([xi for xi, l in zip(x, lines) if getattr(l, key) is not None], series(lines, key))  # noqa: E731
        ax = axes[0, 0]
        e, m = pick("reward")
        s = [0.0 if l.reward_std is None else l.reward_std for l in lines if l.reward is not None]
        ax.plot(e, m, "o-", ms=3, label="reward mean")
        # The reward lies in [0, 1]: a band past either end would show rewards no completion can get.
        ax.fill_between(e, [max(0.0, a - b) for a, b in zip(m, s)], [min(1.0, a + b) for a, b in zip(m, s)],
                        alpha=0.25, label="± std (within [0, 1])")
        if by_step:
            ax.plot(x, [expected_reward(ep, th) for ep in epochs], "g--", label="expected (trajectory)")
            if len(x) > 1 and all(b > a for a, b in zip(epochs, epochs[1:])):
                ax.secondary_xaxis("top", functions=(_extended(x, epochs), _extended(epochs, x))).set_xlabel("epoch")
        else:
            grid = [min(x) + (max(x) - min(x)) * i / 50 for i in range(51)]
            ax.plot(grid, [expected_reward(g, th) for g in grid], "g--", label="expected (trajectory)")
        ax.set(title="Reward (mean ± std)", ylabel="reward")
        ax.legend(fontsize=8)
        panels = [(axes[0, 1], "frac_zero_std", "frac_zero_std (share of groups with identical rewards)",
                   [(th.zero_std_healthy, "g", "healthy <"), (th.zero_std_critical, "r", "critical ≥")]),
                  (axes[1, 0], "entropy", "Entropy", [(th.entropy_low, "g", "band"), (th.entropy_high, "g", None)]),
                  (axes[1, 1], "learning_rate", f"Learning rate ({lr_schedule})", []),
                  (axes[2, 0], "grad_norm", "Gradient norm", [(th.grad_low, "g", "band"), (th.grad_high, "g", None)]),
                  (axes[2, 1], "loss", "Loss", [(0.0, "k", None)])]
        for ax, key, panel_title, hlines in panels:
            ax.plot(*pick(key), "o-", ms=3)
            for y, col, lab in hlines:
                ax.axhline(y, color=col, ls="--", lw=1, label=lab)
            ax.set(title=panel_title, ylabel=key)
            ax.ticklabel_format(axis="y", style="plain", useOffset=False)  # ticks as the values read: no +2e-3
            if not hlines:  # a band's lines already give the axis its range
                _flat_range(ax, series(lines, key))
            if any(lab for _, _, lab in hlines):
                ax.legend(fontsize=8)
        for ax in axes.flat:
            ax.set_xlabel("optimizer step" if by_step else "epoch")
            if by_step:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # step 2, not 2.5
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
        steps_logged = list(per_step)
        xs = [s + 1 for s in steps_logged]
        # The parts stacked: each is its share of the reward paid (runaway penalty and repair
        # discount included), so the stack's top is the reward and no part rises above it.
        ax.stackplot(xs, *[[per_step[s][c] for s in steps_logged] for c in PART_NAMES], labels=PART_NAMES, alpha=0.7)
        ax.plot(xs, [per_step[s]["reward"] for s in steps_logged], "k-" if len(xs) >= 50 else "ko-", ms=3, lw=2,
                label="reward")
        ax.set(title="Reward per step, stacked by part (mean over scored completions)",
               xlabel="optimizer step (1 = the first, as in learning.log)",
               ylabel="share of the reward (weighted, penalties included)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        _save(fig, out_dir / "reward_components.png")
        plt.close(fig)
        written.append(out_dir / "reward_components.png")
    return written
