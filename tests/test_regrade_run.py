"""bench/regrade_run.py: a finished run's answers graded again, per window of steps."""
import json

from bench import regrade_run
from ocaml_grpo.problems import BUNDLED


def test_a_runs_answers_are_graded_again_per_window(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "reward_logs").mkdir(parents=True)
    (run / "learning.log").write_text(f"# dataset: {BUNDLED} (1 problems)\n")
    honest = "```ocaml\nlet count_evens xs = List.length (List.filter (fun x -> x mod 2 = 0) xs)\n```\n(* END *)"
    constant = "```ocaml\nlet count_evens (xs : int list) : int = 2\n```\n(* END *)"
    stub = "```ocaml\nlet count_evens (xs : int list) : int = failwith \"todo\"\n```\n(* END *)"
    rows = [(0, honest), (1, constant), (10, constant), (11, stub)]
    (run / "reward_logs" / "completions.jsonl").write_text(
        "".join(json.dumps({"step": s, "problem_id": "p001_count_evens", "completion": c}) + "\n" for s, c in rows))
    assert regrade_run.main([str(run), "--window", "10", "--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [(r["steps"], r["answers"]) for r in out] == [("0-9", 2), ("10-19", 2)]
    assert (out[0]["solved"], out[0]["constant"], out[0]["stub"]) == (0.5, 0.5, 0.0)
    assert (out[1]["solved"], out[1]["constant"], out[1]["stub"]) == (0.0, 0.5, 0.5)
    assert "constant" in capsys.readouterr().out
