"""Repair turns (GRPO_REPAIR_TURNS): the rollout with a real TRL trainer and the tiny plumbing model,
the reward's discount with the real grader, and plumbing runs of train.py."""
import asyncio

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

import analyze
from conftest import check_log_wellformed, fenced, log_lines, read_jsonl, run_env, train
from ocaml_grpo.problems import load_problems
from ocaml_grpo.prompting import chat_messages
from ocaml_grpo.reward.parts import discounted
from ocaml_grpo.models.loading import load_model, load_tokenizer
from ocaml_grpo.training.repair import ENDED_TURNS, FeedbackBlock, RepairRollout, TurnGrades, first_answer_advantages
from ocaml_grpo.models.tiny import ensure_plumbing_model
from ocaml_grpo.training.trainer import OcamlGRPOTrainer
from rewards import make_reward_function

PROBLEMS = {p.id: p for p in load_problems("bundled")}
EVENS = PROBLEMS["p001_count_evens"]
RIGHT = "let count_evens (xs : int list) : int =\n  List.length (List.filter (fun x -> x mod 2 = 0) xs)"
WRONG = "let count_evens (xs : int list) : int =\n  List.length xs"


@pytest.fixture(scope="module")
def model_dir(cache_home):
    return ensure_plumbing_model(cache_home / "ocaml-grpo" / "plumbing-qwen2-tiny")


def test_a_right_first_answer_is_worth_more_than_any_repaired_one(scorer):
    """The reward function grades the final answer and discounts it per extra turn: fishing for
    feedback with a first answer can never beat answering right at once."""
    handed = TurnGrades()
    reward = make_reward_function(None, scorer=scorer, repair_discount=0.8, on_turn_grades=handed)
    episodes = [{"answers": [fenced(RIGHT)], "feedback": [], "answer_tokens": [30], "turns": 1, "ended": "passed"},
                {"answers": [fenced(WRONG), fenced(RIGHT)], "feedback": ["..."], "answer_tokens": [20, 30], "turns": 2,
                 "ended": "passed"},
                {"answers": [fenced(WRONG), fenced(WRONG)], "feedback": ["..."], "answer_tokens": [20, 20], "turns": 2,
                 "ended": "turns"}]
    row = EVENS.to_row()
    got = asyncio.run(reward(prompts=[None] * 3, completions=["the decoded episode, not graded"] * 3,
                             repair=episodes, **{k: [v] * 3 for k, v in row.items()}))
    assert got[0] == 1.0 and got[1] == pytest.approx(0.8) and got[2] < got[1]
    # every answer's own grade, undiscounted, goes to the trainer by name; the episodes stay as they came
    grades = handed.take(3)
    assert grades[0] == [1.0] and grades[1][0] < 0.5 and grades[1][1] == 1.0 and len(grades[2]) == 2
    assert all("grades" not in e for e in episodes)
    with pytest.raises(RuntimeError, match="no episodes"):
        handed.take(3)  # taken once: a batch never reads another batch's grades
    # whatever a second or third answer earns, it stays below a right first answer
    assert all(discounted(r, t, 0.8) < discounted(1.0, 1, 0.8) for r in (0.0, 0.5, 1.0) for t in (2, 3))
    assert discounted(None, 2, 0.8) is None


def test_the_feedback_block_is_the_chat_template_s(model_dir):
    tok = load_tokenizer(str(model_dir))
    block = FeedbackBlock(tok)
    after_eos = tok.decode(block.ids("Type error at line 2", answer_ended=True))
    cut_off = tok.decode(block.ids("Type error at line 2", answer_ended=False))
    assert after_eos == "\n<|im_start|>user\nType error at line 2<|im_end|>\n<|im_start|>assistant\n"
    assert cut_off == "<|im_end|>" + after_eos  # an answer cut at the limit gets its end-of-turn here
    long = tok.decode(block.ids(block.shown("x " * 2000), answer_ended=True))
    assert long.endswith(" ...<|im_end|>\n<|im_start|>assistant\n") and len(long) < 2000


def test_the_rollout_masks_feedback_and_keeps_each_turn(tmp_path, model_dir, scorer, monkeypatch):
    """A real GRPOTrainer's own generation, two turns: the completion is answer 1, the feedback
    block, answer 2; env_mask is 0 exactly on the feedback block; the episode record holds the
    feedback the grader gives for answer 1."""
    problems = [EVENS, PROBLEMS["p002_last_element"]]
    tok = load_tokenizer(str(model_dir))
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=16, use_cpu=True, bf16=False, report_to=[], max_steps=1)
    rollout = RepairRollout(problems, scorer.feedback, 1, 16, tok, scorer.pool)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = GRPOTrainer(model=load_model(str(model_dir)), reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
                          args=args, train_dataset=Dataset.from_list([{"prompt": chat_messages(p.prompt)} for p in problems]),
                          processing_class=tok, rollout_func=rollout)
    prompts = [chat_messages(p.prompt) for p in problems for _ in range(2)]
    out = rollout(prompts, trainer)
    assert len(out["completion_ids"]) == len(out["env_mask"]) == 4 and out["logprobs"] is None
    for ids, mask, ep, prompt in zip(out["completion_ids"], out["env_mask"], out["repair"], prompts):
        assert len(ids) == len(mask)
        # random weights never compile: every episode gets feedback and uses its one repair turn
        assert ep["turns"] == 2 and ep["ended"] == ENDED_TURNS and len(ep["feedback"]) == 1
        first, second = ep["answer_tokens"]
        assert mask == [1] * first + [0] * (len(ids) - first - second) + [1] * second
        masked = tok.decode(ids[first:len(ids) - second])
        assert ep["feedback"][0].splitlines()[0] in masked and masked.endswith("<|im_start|>assistant\n")
        assert tok.decode(ids[:first], skip_special_tokens=True) == ep["answers"][0]
        problem = rollout.problem_of(prompt)
        assert ep["feedback"][0] == scorer.feedback(problem, ep["answers"][0]).text


def normalised(values, scale="group"):
    t = torch.tensor(values)
    centred = t - t.mean()
    return centred / (t.std() + 1e-4) if scale != "none" else centred


def test_a_first_answer_is_judged_by_its_own_grade():
    """One group: right at once (1.0), wrong then repaired (0.1, then 1.0: the episode earns 0.8),
    wrong twice (0.1), half right at once (0.5). TRL would give the repaired episode's first answer
    its repair's credit; here it gets its own grade's, as single-turn GRPO would."""
    episode = normalised([1.0, 0.8, 0.1, 0.5])  # TRL's advantages of the episodes' rewards
    first = normalised([1.0, 0.1, 0.1, 0.5])
    lengths = [3, 2, 2, 4]
    got = first_answer_advantages(episode, [1.0, 0.1, 0.1, 0.5], lengths, 4, "group", 6)
    assert got.shape == (4, 6)
    for i, n in enumerate(lengths):
        assert torch.allclose(got[i, :n], first[i].expand(n), atol=1e-3)
        assert torch.equal(got[i, n:], episode[i].expand(6 - n))
    assert got[1, 0] < 0 < got[1, 2]  # the wrong first answer is pushed down, its repair up
    assert got[0, 0] == got[:, 0].max()  # right at once: the most credit of any first answer
    # several processes: each normalises over the whole batch's grades and keeps its own rows
    halves = [first_answer_advantages(episode[mine], [1.0, 0.1, 0.1, 0.5], lengths, 4, "group", 6, mine)
              for mine in (slice(0, 2), slice(2, 4))]
    assert torch.equal(torch.cat(halves), got)
    # groups are normalised apart; "none" only centres; an ungraded first answer gets nothing
    two = first_answer_advantages(torch.zeros(4), [0.0, 1.0, 0.2, None], [1] * 4, 2, "none", 1)
    assert torch.allclose(two[:, 0], torch.tensor([-0.5, 0.5, 0.0, 0.0]))
    batch = first_answer_advantages(torch.zeros(4), [0.0, 1.0, 0.0, 1.0], [1] * 4, 2, "batch", 1)
    assert torch.allclose(batch[:, 0], normalised([0.0, 1.0, 0.0, 1.0]), atol=1e-3)


def test_the_trainer_gives_the_first_answer_its_own_advantage(tmp_path, model_dir, scorer, monkeypatch):
    """The real trainer, rollout and generation (random weights: every episode takes its repair
    turn), a reward function that scripts the grades: the loss's advantages are per token, the
    first answer's from its grade, the repair's from the episode's reward."""
    problems = [EVENS, PROBLEMS["p002_last_element"]]
    finals, firsts = [0.8, 0.0, 0.4, 0.0], [0.1, 0.3, 0.0, 0.2]

    grades = TurnGrades()

    def scripted(completions, repair, **k):
        grades([[f, r] for f, r in zip(firsts, finals)])
        return finals

    tok = load_tokenizer(str(model_dir))
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, use_cpu=True, bf16=False, report_to=[], max_steps=1)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = OcamlGRPOTrainer(model=load_model(str(model_dir)), reward_funcs=[scripted], args=args,
                               train_dataset=Dataset.from_list([{"prompt": chat_messages(p.prompt)} for p in problems]),
                               processing_class=tok, tracker=None, turn_grades=grades,
                               rollout_func=RepairRollout(problems, scorer.feedback, 1, 8,
                                                          tok, scorer.pool))
    inputs = [{"prompt": chat_messages(p.prompt)} for p in problems for _ in range(2)]
    out = trainer._generate_and_score_completions(inputs)
    adv = out["advantages"]
    assert adv.shape == out["completion_ids"].shape
    for i, row in enumerate(inputs):
        n, group = row["repair"]["answer_tokens"][0], slice(i - i % 2, i - i % 2 + 2)
        assert row["repair"]["turns"] == 2
        assert torch.allclose(adv[i, :n], normalised(firsts[group])[i % 2].expand(n), atol=1e-3)
        assert torch.allclose(adv[i, n:], normalised(finals[group])[i % 2].expand(adv.shape[1] - n), atol=1e-3)
    assert adv[0, 0] < 0 < adv[0, -1]  # repaired to 0.8 from a first answer worse than its partner's


def test_a_plumbing_run_with_a_repair_turn_logs_its_turns(tmp_path, cache_home):
    res = train(tmp_path, run_env(tmp_path, cache_home, GRPO_REPAIR_TURNS="1", GRPO_MAX_STEPS="2"))
    # quiet: neither TRL's experimental-rollout notice nor the per-step gradient-checkpointing deprecations
    assert "rollout_func" not in res.stderr and "is deprecated" not in res.stderr, res.stderr[-2000:]
    run = tmp_path / "run"
    lines = log_lines(run)
    check_log_wellformed(lines)
    assert len([line for line in lines if line.startswith("[Repair]")]) == 2
    records = read_jsonl(run / "reward_logs" / "completions.jsonl")
    assert records and all(len(r["turns"]) in (1, 2) and r["turns"][-1]["completion"] == r["completion"] for r in records)
    for r in records:
        assert [t["feedback"] is None for t in r["turns"]] == [False] * (len(r["turns"]) - 1) + [True]
    metrics = read_jsonl(run / "metrics.jsonl")
    assert all(m["repair_turns"] >= 1 for m in metrics)
    report = analyze.render_markdown(analyze.analyze(run))
    assert "## Repair Turns" in report


def test_no_repair_turn_is_today_s_run_exactly(tmp_path, cache_home):
    """GRPO_REPAIR_TURNS=0 is the single-turn trainer: the same completions and rewards, no turns."""
    runs = {}
    for name, extra in (("unset", {}), ("zero", {"GRPO_REPAIR_TURNS": "0"})):
        d = tmp_path / name
        d.mkdir()
        train(d, run_env(d, cache_home, GRPO_MAX_STEPS="2", **extra))
        runs[name] = [(r["problem_id"], r["completion"], r["reward"]) for r in
                      read_jsonl(d / "run" / "reward_logs" / "completions.jsonl")]
        assert not any("turns" in r for r in read_jsonl(d / "run" / "reward_logs" / "completions.jsonl"))
        assert not any(line.startswith("[Repair]") for line in log_lines(d / "run"))
    assert runs["unset"] == runs["zero"] and len(runs["zero"]) == 8


@pytest.mark.slow
def test_repair_turns_with_the_paged_engine(tmp_path, cache_home):
    """The rollout generates each turn with the trainer's own engine: the paged engine too."""
    train(tmp_path, run_env(tmp_path, cache_home, GRPO_REPAIR_TURNS="1", GRPO_CONTINUOUS_BATCHING="1",
                            GRPO_MAX_STEPS="1", GRPO_SAVE_STEPS="10"))
    records = read_jsonl(tmp_path / "run" / "reward_logs" / "completions.jsonl")
    assert len(records) == 4 and all(len(r["turns"]) == 2 and r["turns"][0]["feedback"] for r in records)
