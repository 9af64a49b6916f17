"""The trainer's callback: metrics.jsonl, learning.log and the live health monitor.

Every process sees the same logs at a log step (TRL averages its metrics, and the reward's
log_metric values, across processes before logging), so every process reaches the same health
verdict and the same stop decision without talking to the others; only rank 0 writes the files.
The rules are health.py's, the ones analyze.py reports with.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from transformers import TrainerCallback

from ocaml_grpo.jsonl import JsonlWriter, session_id
from ocaml_grpo.reward.parts import Weights, curriculum_phase
from ocaml_grpo.training import health
from ocaml_grpo.reward.group_kinds import TITLES, ZERO_VARIANCE
from ocaml_grpo.training.health import THRESHOLDS, Thresholds
from ocaml_grpo.training.learning_log import (curriculum_line, end_line, health_line, metric_lines,
                                              stop_line)
from ocaml_grpo.training.metrics import METRICS_FILE, StepRecord, process_memory


class LearningLog(TrainerCallback):
    """Writes the run's record of every log step (metrics.jsonl, metrics.py) and learning.log,
    rendered from the same records (the format of the hand-written training analysis this project
    grew out of), and applies the health rules on every log step: [Health] lines for findings, and
    at epoch >= stop_epoch the stop criteria, which save and stop the run (auto_stop) or only warn.
    What it writes after a step's metric lines is kept in that step's record too (its notes), so
    learning.log can be rebuilt from metrics.jsonl. With `echo`, every line also goes to the
    console, each metric line followed by a progress bar; they replace the trainer's metric dicts there."""
    REPEAT_EVERY = 10  # a persisting finding is written again every this many log steps, not every step

    def __init__(self, path: Path, header: list[str], resumed: bool, auto_stop: bool, curriculum: Weights | None,
                 th: Thresholds = THRESHOLDS, echo: bool = False, stop: GracefulStop | None = None):
        self.path, self.header, self.resumed, self.echo, self.stop = path, header, resumed, echo, stop
        self.auto_stop, self.curriculum, self.th = auto_stop, curriculum, th
        self.phase: str | None = None
        self.fd: int | None = None
        self.metrics: JsonlWriter | None = None
        self.session = session_id()
        self.history: list[StepRecord] = []
        self.passes: list[float] = []  # per log step: share of completions passing >= 1 test
        self.last_warned: dict[str, int] = {}
        self.n_logs = 0
        self.stopped_by_rule = False
        self.t0, self.first_step = time.monotonic(), 0
        self.zero_kinds: Counter = Counter()  # the zero-variance groups' kinds so far (shares summed over log steps)

    def write(self, line: str, echo: bool = True) -> None:
        if self.fd is not None:
            os.write(self.fd, (line + "\n").encode())  # one write per whole line: a kill never tears one
            if self.echo and echo:
                print(line, flush=True)

    def progress(self, state) -> str:
        """`[#####...............]  step 5/20  25%  1.9 s/step  ETA 0:28`, the rate measured over
        this session's steps (a resumed session did not train the earlier ones)."""
        done, total = state.global_step, max(1, state.max_steps)
        rate = (time.monotonic() - self.t0) / max(1, done - self.first_step)
        eta = int(rate * max(0, total - done))
        eta_text = f"{eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}" if eta >= 3600 else f"{eta // 60}:{eta % 60:02d}"
        bar = ("#" * round(20 * done / total)).ljust(20, ".")
        return f"  [{bar}]  step {done}/{total}  {done / total:.0%}  {rate:.1f} s/step  ETA {eta_text}"

    def on_train_begin(self, args, state, control, **kw):
        backfill = False
        if state.is_world_process_zero:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if self.resumed else os.O_TRUNC)
            self.fd = os.open(self.path, flags, 0o644)
            metrics = self.path.with_name(METRICS_FILE)
            if not self.resumed:
                metrics.unlink(missing_ok=True)
            # a run begun before metrics.jsonl existed gets its earlier steps from the checkpoint's
            # history, or analyze.py (which prefers the records) would see only this session's
            backfill = self.resumed and not metrics.exists()
            self.metrics = JsonlWriter(metrics)
            for h in self.header:
                self.write(h, echo=False)  # the console has shown the config already
        self.t0, self.first_step = time.monotonic(), state.global_step
        for old in state.log_history:  # resumed: the rules cover the whole run, not just this session
            if record := StepRecord.from_logs(old.get("step", 0), old.get("epoch", 0.0), old):
                self._remember(record)
                if self.metrics is not None and backfill:
                    self.metrics.write_many([record.to_json()])

    def _remember(self, r: StepRecord) -> None:
        """A log step's point, as analyze.py will read it back from metrics.jsonl."""
        self.history.append(r)
        if r.passed_any is not None:
            self.passes.append(r.passed_any)
        self.zero_kinds.update({k: r.groups[k] for k in ZERO_VARIANCE} if r.groups else {})

    def passes_share(self) -> float | None:
        """Share of scored completions that passed at least one test, over the run (log steps weigh
        alike: each holds the same number of completions)."""
        return sum(self.passes) / len(self.passes) if self.passes else None

    def warn(self, key: str, message: str, notes: list[str]) -> None:
        if self.n_logs - self.last_warned.get(key, -10**9) >= self.REPEAT_EVERY:
            self.last_warned[key] = self.n_logs
            notes.append(health_line(message))

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        record = StepRecord.from_logs(state.global_step, logs.get("epoch", state.epoch or 0.0), logs, self.session)
        if record is None:
            return control
        self._remember(record)
        self.n_logs += 1
        record.rss_gb, record.peak_rss_gb = process_memory()
        record.notes = self.judge(record, control)
        if self.metrics is not None:
            self.metrics.write_many([record.to_json()])  # the record first: learning.log is its rendering
        for line in metric_lines(record):
            self.write(line)
        if self.echo and self.fd is not None:
            print(self.progress(state), flush=True)
        for line in record.notes:
            self.write(line)
        return control

    def judge(self, r: StepRecord, control) -> list[str]:
        """The lines the monitor writes after a step's metrics: a new curriculum phase, crashes,
        the health findings, the stop (which it also sets on `control`)."""
        notes: list[str] = []
        if self.curriculum is not None:
            phase, w = curriculum_phase(r.epoch, self.curriculum)
            if phase != self.phase:
                self.phase = phase
                notes.append(curriculum_line(phase, r.epoch, w))
        if r.crashed:  # averaged over every process: a crash on any rank shows
            notes.append(health_line(f"grading crashed on {r.crashed:.1%} of the completions scored "
                                     "since the last log (reward None: left out of the group baseline; see "
                                     "first_error in the breakdown log and stderr)"))
        for f in health.findings(self.history, self.th):
            if f.severity != "info":
                # identical rewards have three causes with three remedies (report/groups.py): name the commonest
                title = TITLES[max(self.zero_kinds, key=self.zero_kinds.get) if +self.zero_kinds else None] \
                    if f.key == "zero_std" else f.title
                self.warn(f.key, f"{f.severity.upper()} {title}: {f.detail}", notes)

        verdict = health.stop_verdict(self.history, self.passes_share(), self.th)
        if verdict.stop and not control.should_training_stop:
            if self.auto_stop:
                notes.append(stop_line(verdict.reasons, r.epoch))
                control.should_save = True
                control.should_training_stop = True
                self.stopped_by_rule = True
            else:
                self.warn("stop", f"stop criteria met ({verdict.reasons}) but GRPO_AUTO_STOP=0: continuing", notes)
        return notes

    def on_train_end(self, args, state, control, **kw):
        ended = f"stopped by {self.stop.requested}" if self.stop and self.stop.requested else "finished"
        self.write(end_line(ended, state.global_step, state.epoch or 0.0))
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None


class GracefulStop(TrainerCallback):
    """Ctrl-C (SIGINT) or SIGTERM: the first finishes the current step, saves a checkpoint and
    ends training normally (logs flushed, the grader closed); a second stops the process at once.
    Every log line is written whole, so even then nothing written is torn."""

    def __init__(self):
        self.requested: str | None = None  # the signal's name once one has arrived
        self.signum = 0

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            print(f"\n{name} again: stopping now, without saving (the last checkpoint is kept)", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.requested, self.signum = name, signum
        print(f"\n{name}: finishing the current step, then saving a checkpoint and stopping "
              f"({name} again to stop at once)", file=sys.stderr, flush=True)

    def on_step_end(self, args, state, control, **kw):
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class KeepAdapters(TrainerCallback):
    """GRPO_KEEP_ADAPTERS=N: after the checkpoint of every N-th step is saved, its adapter (and
    README) is copied to `adapters/step-N/` in the output directory, where checkpoint rotation
    (GRPO_SAVE_TOTAL_LIMIT) never reaches: evaluations along the run need the adapters, not the
    optimizer states."""

    def __init__(self, every: int):
        self.every = every

    def on_save(self, args, state, control, **kw):
        step = state.global_step
        if not state.is_world_process_zero or step % self.every:
            return control
        checkpoint = Path(args.output_dir) / f"checkpoint-{step}"
        kept = Path(args.output_dir) / "adapters" / f"step-{step}"
        tmp = kept.with_name(kept.name + ".partial")  # a crash mid-copy leaves no folder that looks whole
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in checkpoint.iterdir():
            if f.name.startswith("adapter_") or f.name == "README.md":
                shutil.copy2(f, tmp / f.name)
        shutil.rmtree(kept, ignore_errors=True)
        tmp.rename(kept)
        return control
