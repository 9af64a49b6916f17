"""Dynamic sampling (GRPO_DYNAMIC_SAMPLING): the keep decision alone, on two real processes
(torch.distributed over gloo), inside a real TRL trainer with the tiny plumbing model, and in
plumbing runs of train.py."""
import json
import math
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from conftest import ROOT, check_log_wellformed, log_lines, read_jsonl, run_env, train
from ocaml_grpo.problems import load_problems
from ocaml_grpo.prompting import chat_messages
from ocaml_grpo.training import dynamic_sampling as ds
from ocaml_grpo.reward.group_kinds import GroupStat
from ocaml_grpo.models.loading import load_model, load_tokenizer
from ocaml_grpo.models.tiny import ensure_plumbing_model
from ocaml_grpo.training.trainer import OcamlGRPOTrainer

PROBLEMS = load_problems("bundled")[:8]
TEACH = {p.id for p in PROBLEMS[4:]}  # the scripted reward gives these problems' groups spread


@pytest.fixture(scope="module")
def model_dir(cache_home):
    return ensure_plumbing_model(cache_home / "ocaml-grpo" / "plumbing-qwen2-tiny")


def test_a_group_teaches_when_its_scored_rewards_differ():
    nan = float("nan")
    assert ds.teaching_groups([0.0, 0.0, 1.0, 0.5, 0.3, 0.3, nan, 0.2], 2) == [False, True, False, False]
    assert ds.teaching_groups([nan, nan, 0.1, 0.1 + 1e-12], 2) == [False, False]  # unscored; a float's noise
    # the tracker's threshold (GRPO_LEARNABLE_MIN_STD): a stray END marker's 0.05 is noise, half passing is not
    assert ds.teaching_groups([0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 1.0, 1.0], 4, 0.05) == [False, True]
    assert ds.teaching_groups([0.0, 0.0, 0.0, 0.05], 4, 0.0) == [True]
    with pytest.raises(ValueError, match="whole groups"):
        ds.teaching_groups([0.0] * 5, 2)


def test_each_process_fills_its_share_and_the_cap_fills_with_what_it_has():
    plan = ds.StepPlan(processes=2, quota=2)
    plan.add([True, False, False, False])  # process 0: one of two; process 1: none
    assert plan.shortfall() == 2
    plan.add([True, True, True, False])
    assert plan.shortfall() == 1  # process 1 has one
    assert plan.picks(0) == [(0, 0), (1, 0)]  # its teaching groups in the order generated; the surplus left out
    assert plan.picks(1) == [(1, 0), (0, 0)]  # short at the cap: its first group without spread fills the place
    figures = ds.step_figures(plan, ["mixed", "too_hard", "too_easy", "identical",
                                     "mixed", "mixed", "mixed", "too_hard"], (30.0, 80.0))
    assert figures == {"groups_generated": 8.0, "groups_kept": 3.0, "generation_rounds": 2.0,
                       "frac_zero_std_trained": 0.25, "dropped_surplus": 1.0, "tokens_trained": 0.375,
                       "dropped_too_hard": 2.0, "dropped_too_easy": 0.0, "dropped_identical": 1.0}
    plan.add([False, False, True, True])
    assert plan.shortfall() == 0 and plan.picks(1) == [(1, 0), (2, 0)]


def test_a_draw_leaves_out_the_step_s_problems_while_others_remain():
    gen = ds.round_generator(42, 3, 1)
    again = ds.draw_prompts(3, [1.0] * 6, {0, 1, 2}, gen)
    assert sorted(again) == [3, 4, 5]
    assert ds.draw_prompts(3, [1.0] * 6, {0, 1, 2}, ds.round_generator(42, 3, 1)) == again  # seeded: every process
    assert len(set(ds.draw_prompts(4, [1.0] * 6, {0, 1, 2}, gen))) == 4  # too few others: the step's come back
    weighted = ds.draw_prompts(1, [0.0, 0.0, 1.0], set(), gen)
    assert weighted == [2]


def _rank(rank: int, port: int, out: dict) -> None:
    """One process: its own rewards each round, gathered over gloo as TRL gathers them; the plan
    built from the gathered rewards; the next round's draw."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    G, quota = 3, 2
    plan, draws = ds.StepPlan(2, quota), []
    gen = torch.Generator().manual_seed(100 + rank)  # each process's rewards differ, as its completions do
    for round_ in range(4):
        local = torch.randint(0, 2, (quota * G,), generator=gen).float() * (rank + round_ % 2)
        gathered = [torch.zeros_like(local) for _ in range(2)]
        dist.all_gather(gathered, local)
        plan.add(ds.teaching_groups(torch.cat(gathered).tolist(), G))
        if not plan.shortfall():
            break
        draws.append(ds.draw_prompts(2 * quota, [1.0, 0.2, 1.0, 1.0, 0.2, 1.0], set(), ds.round_generator(7, 5, round_ + 1)))
    out[rank] = {"trained": plan.trained(), "picks": plan.picks(rank), "rounds": len(plan.rounds), "draws": draws,
                 "mine": [t for r, j, t in plan.mine(rank)], "local_teaches": plan.rounds}
    dist.destroy_process_group()


def test_two_processes_keep_the_same_groups():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(port, out), nprocs=2, join=True)
    zero, one = out[0], out[1]
    assert zero["trained"] == one["trained"] and zero["rounds"] == one["rounds"] and zero["draws"] == one["draws"]
    assert zero["rounds"] > 1  # process 0's rewards are all 0 in even rounds: it had to generate again
    # each process's picks are its own part of the shared decision
    assert [(r, 0 * 2 + j) for r, j in zero["picks"]] + [(r, 2 + j) for r, j in one["picks"]] == zero["trained"]


def make_trainer(tmp_path, model_dir, reward, dynamic_rounds, G=2, prompts=2, trainer=OcamlGRPOTrainer, **kw):
    tok = load_tokenizer(str(model_dir))
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=prompts * G, num_generations=G,
                      max_completion_length=8, use_cpu=True, bf16=False, report_to=[], max_steps=1, seed=3)
    data = Dataset.from_list([{"prompt": chat_messages(p.prompt), "id": p.id} for p in PROBLEMS])
    extra = {"tracker": None, "dynamic_rounds": dynamic_rounds, **kw} if trainer is OcamlGRPOTrainer else {}
    t = trainer(model=load_model(str(model_dir)), reward_funcs=[reward], args=args, train_dataset=data,
                processing_class=tok, **extra)
    t.model.train()
    return t


def scripted(completions, id, **k):
    """Groups of the TEACH problems get rewards 0, 1, 0, 1, ...; the others all 0.5."""
    return [float(i % 2) if pid in TEACH else 0.5 for i, pid in enumerate(id)]


def rows_of(problems, G=2):
    return [{"prompt": chat_messages(p.prompt), "id": p.id} for p in problems for _ in range(G)]


def test_a_group_without_spread_is_never_trained_on(tmp_path, model_dir):
    """A real trainer and engine; a step whose first groups all tie draws problems until its batch
    holds only groups that teach, and hands TRL a batch of the usual shape."""
    trainer = make_trainer(tmp_path, model_dir, scripted, dynamic_rounds=8)
    inputs = rows_of(PROBLEMS[:2])  # neither teaches
    out = trainer._generate_and_score_completions(inputs)
    assert out["completion_ids"].shape[0] == out["advantages"].shape[0] == len(inputs)
    assert (out["advantages"] != 0).all()  # every kept completion has an advantage: its group had spread
    tok = trainer.processing_class
    prompts = tok.batch_decode(out["prompt_ids"], skip_special_tokens=True)
    trained = {p.id for p in PROBLEMS for text in prompts if p.prompt.splitlines()[0] in text}
    assert trained and trained <= TEACH
    m = trainer._metrics["train"]
    assert m[ds.METRIC_DYNAMIC["generation_rounds"]][-1] >= 2 and m[ds.METRIC_DYNAMIC["frac_zero_std_trained"]] == [0.0]
    assert m[ds.METRIC_DYNAMIC["groups_kept"]] == [2.0]
    assert len(m["reward"]) == m[ds.METRIC_DYNAMIC["generation_rounds"]][-1]  # every round's groups logged
    # the loss runs on the merged batch (outside train(), the loop's accumulation count is set here)
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, out)
    assert math.isfinite(loss.item())


def test_the_cap_holds_and_the_step_trains_on_what_it_has(tmp_path, model_dir):
    trainer = make_trainer(tmp_path, model_dir, lambda completions, **k: [0.0] * len(completions), dynamic_rounds=2)
    inputs = rows_of(PROBLEMS[:2])
    out = trainer._generate_and_score_completions(inputs)
    assert out["completion_ids"].shape[0] == len(inputs) and not out["advantages"].any()
    m = trainer._metrics["train"]
    assert m[ds.METRIC_DYNAMIC["generation_rounds"]] == [3.0]  # the first round and 2 more, then no more
    assert m[ds.METRIC_DYNAMIC["frac_zero_std_trained"]] == [1.0] and m[ds.METRIC_DYNAMIC["groups_generated"]] == [6.0]
    trainer.current_gradient_accumulation_steps = 1
    assert math.isfinite(trainer.compute_loss(trainer.model, out).item())


def test_the_dropped_groups_are_named_by_kind(tmp_path, model_dir):
    log = ds.GroupLog()

    def reward(completions, id, **k):
        log(0, [GroupStat(pid, "mixed", 2, 0.5, 0.5, 0.0, 1.0) if pid in TEACH
                else GroupStat(pid, "too_hard", 2, 0.5, 0.0, 0.0, 0.0) for pid in id[::2]])
        return scripted(completions, id)

    trainer = make_trainer(tmp_path, model_dir, reward, dynamic_rounds=8, group_log=log)
    trainer._generate_and_score_completions(rows_of(PROBLEMS[:2]))
    m = trainer._metrics["train"]
    rounds = m[ds.METRIC_DYNAMIC["generation_rounds"]][-1]
    generated, kept = m[ds.METRIC_DYNAMIC["groups_generated"]][-1], m[ds.METRIC_DYNAMIC["groups_kept"]][-1]
    assert generated == 2 * rounds and kept == 2
    assert m[ds.METRIC_DYNAMIC["dropped_too_hard"]][-1] + m[ds.METRIC_DYNAMIC["dropped_surplus"]][-1] == generated - kept
    assert m[ds.METRIC_DYNAMIC["dropped_too_easy"]] == m[ds.METRIC_DYNAMIC["dropped_identical"]] == [0.0]


def test_off_the_trainer_generates_exactly_as_trl_does(tmp_path, model_dir):
    """Without dynamic sampling the step's batch is TRL's own, token for token (same seed)."""
    outs = []
    for cls in (GRPOTrainer, OcamlGRPOTrainer):
        trainer = make_trainer(tmp_path / cls.__name__, model_dir, scripted, dynamic_rounds=None, trainer=cls)
        torch.manual_seed(0)
        outs.append(trainer._generate_and_score_completions(rows_of(PROBLEMS[:2])))
    assert outs[0].keys() == outs[1].keys()
    for key in outs[0]:
        assert torch.equal(outs[0][key], outs[1][key]), key


def test_plumbing_runs_off_unset_and_on(tmp_path, cache_home):
    """GRPO_DYNAMIC_SAMPLING=0 is today's run exactly (the same completions, no new figures); =1
    logs its figures in metrics.jsonl and learning.log, and the random model's all-zero groups
    take every round the cap allows."""
    runs = {}
    for name, extra in (("unset", {}), ("zero", {"GRPO_DYNAMIC_SAMPLING": "0"}),
                        ("on", {"GRPO_DYNAMIC_SAMPLING": "1", "GRPO_DYNAMIC_SAMPLING_ROUNDS": "1"})):
        d = tmp_path / name
        d.mkdir()
        train(d, run_env(d, cache_home, GRPO_MAX_STEPS="2", **extra))
        runs[name] = [(r["step"], r["problem_id"], r["completion"], r["reward"]) for r in
                      read_jsonl(d / "run" / "reward_logs" / "completions.jsonl")]
        metrics = read_jsonl(d / "run" / "metrics.jsonl")
        lines = log_lines(d / "run")
        check_log_wellformed(lines)
        dynamic = [line for line in lines if line.startswith("[Dynamic]")]
        if name != "on":
            assert not dynamic and not any("generation_rounds" in m for m in metrics)
            continue
        assert len(dynamic) == 2 and "generation_rounds=2.00" in dynamic[0]
        assert all(m["generation_rounds"] == 2 and m["groups_generated"] == 4 and m["frac_zero_std_trained"] == 1.0
                   and m["dropped_too_hard"] == 2 for m in metrics)
        # every generated group is logged and tracked: 2 steps x 2 rounds x 2 prompts x 2 completions
        assert len(runs["on"]) == 16
        assert len(read_jsonl(d / "run" / "reward_logs" / "problem_tracking.jsonl")) == 8
    assert runs["unset"] == runs["zero"] and len(runs["zero"]) == 8


@pytest.mark.parametrize("extra", [
    {"GRPO_REPAIR_TURNS": "1", "REWARD_CURRICULUM": "1"},
    pytest.param({"GRPO_COMPILED_GENERATION": "1"}, marks=pytest.mark.slow),
], ids=["repair-turns-and-curriculum", "compiled-engine"])
def test_dynamic_sampling_runs_with_the_other_switches(tmp_path, cache_home, extra):
    """Every round is TRL's own generation: repair episodes (their per-token advantages merged like
    any other tensor), the curriculum's weights and the compiled engine's static shapes."""
    train(tmp_path, run_env(tmp_path, cache_home, GRPO_MAX_STEPS="2", GRPO_SAVE_STEPS="10", GRPO_DYNAMIC_SAMPLING="1",
                            GRPO_DYNAMIC_SAMPLING_ROUNDS="1", **extra))
    run = tmp_path / "run"
    lines = log_lines(run)
    check_log_wellformed(lines)
    assert sum(line.startswith("[Dynamic]") for line in lines) == 2
    rows = read_jsonl(run / "reward_logs" / "completions.jsonl")
    assert len(rows) == 16  # 2 steps x 2 rounds x 2 prompts x 2 completions
    if "GRPO_REPAIR_TURNS" in extra:
        assert all(len(r["turns"]) in (1, 2) for r in rows) and sum(line.startswith("[Repair]") for line in lines) == 2
        assert any(line.startswith("[Curriculum]") for line in lines)


def test_the_benchmark_refuses_a_real_model_row_without_its_tracked_run(tmp_path):
    """The real model's row replays bench_real's base + GRPO run: without one, it says how to make it."""
    res = subprocess.run([sys.executable, "-m", "bench.bench_dynamic", "--model", "qwen2.5-coder-0.5b-instruct",
                          "--tracked", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode != 0 and f"--tracked {tmp_path}: not a finished GRPO run folder" in res.stderr, res.stderr


@pytest.mark.slow
def test_the_real_model_row_replays_the_tracked_run_with_dynamic_sampling(tmp_path, cache_home):
    """bench_dynamic --model M --tracked RUN: the run again from its config.json, dynamic sampling on,
    compared with the tracked run at equal generated tokens (here with the plumbing model)."""
    train(tmp_path, run_env(tmp_path, cache_home, GRPO_MAX_STEPS="3", GRPO_SAVE_STEPS="10"))
    tracked = tmp_path / "run"
    model = json.loads((tracked / "config.json").read_text())["BASE_MODEL_ID"]
    out, result = tmp_path / "bench", tmp_path / "dynamic.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(cache_home)}
    res = subprocess.run([sys.executable, "-m", "bench.bench_dynamic", "--model", model, "--tracked", str(tracked),
                          "--steps", "1", "--rounds", "1", "--out", str(out), "--json", str(result)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    row = json.loads(result.read_text())[model]
    replayed = json.loads((out / "dynamic" / "config.json").read_text())
    assert replayed == {**json.loads((tracked / "config.json").read_text()), "GRPO_OUTPUT_DIR": str(out / "dynamic"),
                        "GRPO_MAX_STEPS": 1, "GRPO_SAVE_STEPS": 1, "GRPO_SAVE_TOTAL_LIMIT": 2,
                        "GRPO_DYNAMIC_SAMPLING": True, "GRPO_DYNAMIC_SAMPLING_ROUNDS": 1}
    d, t = row["dynamic"], row["tracked"]
    assert d["steps"] == 1 and d["rounds_per_step"][0] in (1, 2) and d["steps_below_cap_with_zero_std"] == 0
    assert d["groups_generated"] == row["setup"]["prompts_per_step"] * d["rounds_per_step"][0] and d["tokens"] > 0
    assert 1 <= row["setup"]["tracked_steps_matched"] <= 3 and t["steps"] == row["setup"]["tracked_steps_matched"]
    assert "| dynamic | 1 |" in res.stdout
