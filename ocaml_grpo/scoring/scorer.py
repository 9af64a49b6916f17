"""The reward policy's scorer: a completion's code graded (grading/) and paid by the reward's parts
(reward/parts.py), with the rules around them: the line minimum, no code earns nothing, a runaway
is multiplied down. Grades are cached by (problem, code), so duplicates in a GRPO group and
re-scoring under new weights cost nothing. `GuardedScorer` is the trainer's: a grader bug on one
completion costs that completion its reward (None), not the run."""
from __future__ import annotations

import hashlib
import sys
import threading
import time
import traceback
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from ocaml_grpo.config import RewardConfig
from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.completions import assemble_solution, completion_text, extract_code, has_end_marker
from ocaml_grpo.grading.feedback import Feedback, feedback_for
from ocaml_grpo.grading.grader import Grade, OcamlGrader
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.problems import Problem
from ocaml_grpo.reward.breakdown import Breakdown
from ocaml_grpo.reward.parts import Weights


def score_grade(grade: Grade, b: Breakdown, w: Weights) -> None:
    """What the grader found, into the breakdown, and each part's credit for it (reward/parts.py)."""
    b.type_errors = len(grade.compile_errors)
    b.syntax_errors = grade.syntax_errors
    b.error_kinds = [e.kind for e in grade.compile_errors]
    b.first_error = grade.compile_errors[0].message if grade.compile_errors else grade.test_error
    b.compiled, b.tests_compiled = grade.compiled_as_asked, grade.tests_compiled
    b.tests_passed, b.tests_total, b.timed_out = grade.tests_passed, grade.tests_total, grade.timed_out
    b.forbidden, b.unverifiable, b.compile_timed_out = grade.forbidden, grade.unverifiable, grade.compile_timed_out
    b.stub, b.constant, b.unchecked = grade.stub, grade.constant, grade.unchecked
    b.credit(grade, w)


class RewardScorer:
    """Scores batches in parallel; facts about (problem, code) are cached so duplicates in a
    GRPO group, and re-scoring under new weights, cost nothing."""

    def __init__(self, config: RewardConfig | None = None, grader: OcamlGrader | None = None,
                 cache_size: int = 50_000):
        self.config = config or RewardConfig()
        self.grader = grader or OcamlGrader(Sandbox(self.config.sandbox), cores=self.config.workers)
        # Runs mostly wait on subprocesses; more threads than cores lets infinite loops time
        # out side by side while compiles stay bounded by the grader's compile slots.
        self.pool = ThreadPoolExecutor(max_workers=max(32, 8 * self.config.workers), thread_name_prefix="reward")
        self._cache: OrderedDict[str, Grade] = OrderedDict()
        self._inflight: dict[str, threading.Event] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.grader.close()

    def _grade_cached(self, problem: Problem, solution: str, entries: list[str]) -> tuple[Grade, bool]:
        key = hashlib.sha256("\0".join([problem.id, problem.prompt, problem.tests, ",".join(problem.requires),
                                        ",".join(entries), solution]).encode()).hexdigest()
        while True:
            with self._lock:
                if key in self._cache:
                    self._cache.move_to_end(key)
                    return self._cache[key], True
                event = self._inflight.get(key)
                if event is None:
                    self._inflight[key] = threading.Event()
                    break
            event.wait()  # the same code is being graded by another thread: share its result
        try:
            grade = self.grader.grade(solution, problem.tests, problem.requires, entries, problem.prompt)
            with self._lock:
                self._cache[key] = grade
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            return grade, False
        finally:
            with self._lock:
                self._inflight.pop(key).set()

    def feedback(self, problem: Problem, completion) -> Feedback:
        """What a repair turn shows the model after this answer, under this scorer's line minimum."""
        return feedback_for(self.grader, problem, completion, self.config.min_lines)

    def score_one(self, problem: Problem, completion, completion_tokens: int | None = None,
                  max_completion_tokens: int | None = None, weights: Weights | None = None) -> Breakdown:
        t0 = time.perf_counter()
        cfg = self.config
        w = weights or cfg.weights
        text = completion_text(completion)
        b = Breakdown(problem_id=problem.id, isolated=self.grader.sandbox.isolated)
        b.has_end_marker = has_end_marker(text)
        # Cut off at the limit, whatever it wrote before: a marker proves nothing about the text after it.
        b.runaway = (completion_tokens is not None and max_completion_tokens is not None
                     and completion_tokens >= max_completion_tokens)
        code = extract_code(text)
        b.code_lines = src.count_code_lines(code)
        # No line of code (nothing, or comments only) is no answer, whatever MIN_NON_EMPTY_LINES says:
        # with the gate at 0, a GRPO run of Qwen2.5-Coder-0.5B collapsed in 4 steps to "(* END *)"
        # alone, whose END marker earned more than its honest attempts' syntax errors.
        if b.code_lines < max(1, cfg.min_lines):
            b.gated_min_lines = True  # no part earns anything, the END marker included
            b.tests_total = src.assertion_count(src.parse_assert_tests(problem.tests))
        else:
            solution, entries = assemble_solution(code, problem.prompt, problem.entry_point)
            grade, b.cached = self._grade_cached(problem, solution, entries)
            score_grade(grade, b, w)
        reward = b.parts_total()
        if b.runaway:
            reward *= cfg.runaway_multiplier
        b.reward = round(reward, 6)
        b.elapsed_ms = round((time.perf_counter() - t0) * 1000, 2)
        return b

    def score_batch(self, problems: list[Problem], completions: list, completion_tokens: list | None = None,
                    max_completion_tokens: int | None = None, weights: Weights | None = None) -> list[Breakdown]:
        toks = completion_tokens or [None] * len(completions)
        futures = [self.pool.submit(self.score_one, p, c, t, max_completion_tokens, weights)
                   for p, c, t in zip(problems, completions, toks)]
        return [f.result() for f in futures]


class GuardedScorer(RewardScorer):
    """The trainer's scorer: a grader bug on one odd completion costs that completion its reward,
    not the whole run. Its reward is None, which TRL 1.16 treats as unscorable: it stays out of
    its group's baseline and gets no advantage (a 0 would drag the baseline down). The failure is
    recorded in the breakdown log (first_error), its traceback printed once per process, and its
    share reaches learning.log through log_metric (METRIC_CRASHED)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.crashes = 0
        self._crash_lock = threading.Lock()

    def score_one(self, problem: Problem, completion, *a, **kw) -> Breakdown:
        try:
            return super().score_one(problem, completion, *a, **kw)
        except Exception as e:  # noqa: BLE001 -- deliberate: see the docstring
            with self._crash_lock:
                self.crashes += 1
                first = self.crashes == 1
            if first:
                traceback.print_exc()
            print(f"warning: grading crashed on a completion for {problem.id} ({type(e).__name__}: {e}); "
                  f"reward None [{self.crashes} so far]", file=sys.stderr)
            return Breakdown(problem_id=problem.id, reward=None, isolated=self.grader.sandbox.isolated,
                             first_error=f"reward crashed: {type(e).__name__}: {e}")
