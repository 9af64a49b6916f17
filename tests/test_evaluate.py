"""evaluate.py: the pass@k estimator, aggregation over real grading, and an offline end-to-end run."""
import json
import os
import subprocess
import sys

import pytest

import preloaded
from conftest import GRADED, ROOT
from ocaml_grpo.commands.model_eval import render_markdown
from ocaml_grpo.training.sampling import RATES, grade_completions, pass_at_k, verdict
from ocaml_grpo.grading import source as src
from ocaml_grpo.problems import load_problems
from rewards import RewardConfig, RewardScorer


def test_pass_at_k_matches_hand_computed_values():
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(3, 1, 3) == 1.0  # n - c < k: some draw always contains the correct one
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_aggregation_over_real_grading():
    probs = load_problems("bundled")[:2]
    good = [f"```ocaml\n{p.solution}\n```\n(* END *)" for p in probs]
    stub = [f"```ocaml\n{src.parse_signature(p.prompt).signature}\n  failwith \"no\"\n```" for p in probs]
    texts = [[good[0], stub[0]], [stub[1], stub[1]]]  # problem 0: 1 of 2 solved; problem 1: 0 of 2
    scorer = RewardScorer(RewardConfig(min_lines=0, workers=2))
    try:
        core, rows = grade_completions(probs, texts, [[10, 10], [10, 10]], 2, 512, scorer, min_lines=0)
    finally:
        scorer.close()
    assert core["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert core["pass@k"] == pytest.approx((1.0 + 0.0) / 2)
    assert core["rates"]["solved"] == pytest.approx(0.25)
    assert core["rates"]["has_end_marker"] == pytest.approx(0.25)
    assert core["rates"]["compiled"] == 1.0 and core["rates"]["tests_compiled"] == 1.0
    # a definition that compiles alone but at a type the tests cannot use: not compiled as asked (the
    # verdict the compile part, `score` and `feedback` share), tests not compiled
    wrong_type = [[f"```ocaml\nlet {src.parse_signature(probs[0].prompt).entry} (x : unit) : unit = x\n```"]]
    scorer = RewardScorer(RewardConfig(min_lines=0, workers=2))
    try:
        other, _ = grade_completions(probs[:1], wrong_type, [[10]], 1, 512, scorer, min_lines=0)
    finally:
        scorer.close()
    assert other["rates"]["compiled"] == 0.0 and other["rates"]["tests_compiled"] == 0.0
    assert [r["solved"] for r in rows] == [True, False, False, False]
    assert core["mean_reward"] == pytest.approx((1.0 + 3 * 0.30) / 4)  # stubs: type check + compile
    assert sum(v["n_problems"] for v in core["per_difficulty"].values()) == 2
    assert "stronger base model" in verdict(0.1) and "enough" in verdict(0.5)


def test_end_to_end_on_the_demo_model(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    ids = [json.loads(line)["id"] for line in GRADED.read_text().splitlines() if line.strip()][-3:]
    (tmp_path / "ids.txt").write_text("\n".join(ids) + "\n")  # --ids: these problems, not --n's sample
    r = preloaded.run(ROOT / "evaluate.py", ["--model", "plumbing", "--ids", tmp_path / "ids.txt", "--k", "2",
                                              "--max-new-tokens", "24", "--out", tmp_path / "out", "--dataset", GRADED],
                      cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    for key in ("model", "adapter", "dataset", "n_problems", "k", "pass@1", "pass@k", "mean_reward", "rates",
                "per_difficulty"):
        assert key in report
    assert list(report["rates"]) == ["has_end_marker", "compiled", "tests_compiled", "solved", "constant"] == list(RATES)
    assert report["n_problems"] == 3 and report["k"] == 2
    rows = [json.loads(l) for l in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(0 <= x["graded_reward"] <= 1 and "reward" not in x for x in rows)
    assert {x["problem_id"] for x in rows} == set(ids)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "pass@1" in md and "| `tests_compiled` rate: the solution and the tests build one program |" in md


def test_bad_arguments_fail_before_any_model_loads(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "plumbing", "--k", "3", "--samples", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--samples 2 must be >= --k 3" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "plumbing", "--dataset", str(tmp_path / "x.jsonl")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "x.jsonl: no such file" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "plumbing", "--dataset", "bundled",
                        "--ids", "p001_count_evens,p999_nowhere"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--ids: 1 not in bundled: p999_nowhere" in r.stderr, r.stderr


def test_k_1_reports_pass_at_1_once_and_a_failed_run_leaves_no_report_dir(tmp_path):
    report = {"model": "m", "adapter": None, "dataset": "d", "n_problems": 1, "seed": 0, "samples_per_problem": 1,
              "temperature": 0.0, "pass@1": 0.5, "pass@k": 0.5, "k": 1, "mean_reward": 0.1, "rates": {},
              "per_difficulty": {}, "verdict": "v"}
    assert [line for line in render_markdown(report).splitlines() if line.startswith("| pass@")] == ["| pass@1 | 50.0% |"]
    r = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", str(tmp_path / "no_model"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--model=" in r.stderr and "no such directory" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_a_killed_sampling_resumes_and_samples_what_one_run_would(tmp_path):
    """generate_hf's partial file (the benchmark's evaluations): stopped after two batches and
    started again, it samples the rest exactly as one uninterrupted run does, then removes the file."""
    from ocaml_grpo.models.tiny import ensure_plumbing_model
    from ocaml_grpo.training.sampling import generate_hf
    model = str(ensure_plumbing_model(tmp_path / "plumbing"))
    prompts = [[{"role": "user", "content": f"Write f{i}."}] for i in range(4)]
    partial = tmp_path / "generations.partial.json"

    def sample(seed: int, stop: bool = False) -> tuple[list, list[int]]:
        seen: list[int] = []

        def on_batch(start, texts, lens):
            seen.append(start)
            if stop and start == 2:
                raise KeyboardInterrupt
        out = generate_hf(model, None, prompts, 2, 12, 1.0, 1, seed, top_k=0, progress=False, partial=partial,
                          on_batch=on_batch)
        return out, seen

    whole, _ = sample(7)
    assert not partial.exists()
    with pytest.raises(KeyboardInterrupt):
        sample(7, stop=True)
    assert len(json.loads(partial.read_text())["outs"]) == 2
    resumed, seen = sample(7)
    assert resumed == whole and seen == [2, 3] and not partial.exists()
    # a partial file of other sampling (another seed) is not resumed from
    with pytest.raises(KeyboardInterrupt):
        sample(8, stop=True)
    again, seen = sample(7)
    assert again == whole and seen == [0, 1, 2, 3]
