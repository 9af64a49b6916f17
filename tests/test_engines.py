"""The compiled generation engine (training/engines.py) on CPU, through TRL's own trainer: greedy
tokens equal the eager engine's before and after optimizer steps change the LoRA weights, the
decode graph is compiled once, and the hooks gradient checkpointing leaves behind do not pile up."""
import os

import pytest
import torch

from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.training.engines import (compiled_graphs, drop_orphaned_input_hooks, enable_compiled_generation,
                                         end_turn_at_stop, engine_kwargs)
from ocaml_grpo.models.tiny import ensure_plumbing_model, plumbing_model_dir


def test_compiled_engine_settings_give_one_cache_size():
    kw = engine_kwargs("compiled", 24, 704, 512)
    assert kw["cache_implementation"] == "static" and kw["generation_kwargs"] == {"max_cache_len": 704 + 512}
    assert not kw["use_vllm"] and not kw["use_transformers_continuous_batching"]
    # no length buckets: TRL's pad_to_multiple_of gave NaN gradients on a GPU (engines.py)
    assert "pad_to_multiple_of" not in kw


@pytest.fixture
def trainer(tmp_path, cache_home, monkeypatch):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from ocaml_grpo.training.trainer import OcamlGRPOTrainer

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    model_dir = ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ)))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [{"prompt": "let f x = " + "x + 1 :: " * n} for n in (2, 9, 30, 5)]  # 4 prompt lengths

    def reward(completions, **_):  # varies within a group, so every step moves the weights
        return [float(len(c) % 5) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=12, max_steps=4, learning_rate=5e-2, beta=0.0, logging_steps=10**6,
                      save_strategy="no", report_to=[], use_cpu=True, bf16=False, remove_unused_columns=False,
                      seed=0, **engine_kwargs("compiled", 4, 256, 12))  # gradient checkpointing: TRL's default, on
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"],
                      task_type="CAUSAL_LM")  # no dropout: a train-mode forward is deterministic
    t = OcamlGRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer, peft_config=lora, tracker=None)
    enable_compiled_generation(t)
    t.prompt_ids = [tokenizer(r["prompt"])["input_ids"] for r in rows]
    return t


def greedy(trainer, compiled: bool) -> list[list[int]]:
    """The trainer's own generation path, greedy, with the compiled decode step or without it."""
    config = trainer.generation_config
    config.do_sample, config.disable_compile = False, not compiled
    try:
        trainer.model.train()  # as in training: the mode is part of what the graph was compiled for
        ids, _ = trainer._generate_single_turn(trainer.prompt_ids, None, {}, 1)
    finally:
        config.do_sample, config.disable_compile = True, False
    return ids


def test_compiled_greedy_tokens_equal_eager_across_optimizer_steps(trainer):
    from transformers import TrainerCallback

    embeddings = trainer.model.get_input_embeddings()
    before = greedy(trainer, compiled=False)
    assert greedy(trainer, compiled=True) == before

    graphs_per_step = []

    class CountGraphs(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            graphs_per_step.append(compiled_graphs())

    lora_before = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if "lora_B" in k}
    trainer.add_callback(CountGraphs())
    trainer.train()  # 4 steps: the first compiles for training's model state (gradient checkpointing set up)
    # the 3 steps after it changed the weights and generated with the same graph: none compiled another
    assert graphs_per_step[1:] == [graphs_per_step[0]] * 3
    changed = [k for k, v in trainer.model.named_parameters() if "lora_B" in k and not torch.equal(v, lora_before[k])]
    assert len(changed) == len(lora_before)

    after = greedy(trainer, compiled=False)
    assert after != before  # the weights moved the eager tokens: a stale graph would still give `before`
    assert greedy(trainer, compiled=True) == after
    assert compiled_graphs() == graphs_per_step[0]
    # gradient checkpointing's toggles add hooks (7 a step); each generation starts by dropping the
    # orphans, so at most the live one and the one the last generation's toggle added remain
    assert len(embeddings._forward_hooks) <= 2


def test_orphaned_input_hooks_are_dropped_and_live_ones_kept(cache_home, monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    model = AutoModelForCausalLM.from_pretrained(ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ))))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    embeddings = model.get_input_embeddings()
    for _ in range(3):  # what TRL does around each generation
        model.gradient_checkpointing_disable()
        model.gradient_checkpointing_enable()
    other = embeddings.register_forward_hook(lambda *a: None)  # somebody else's hook stays
    assert len(embeddings._forward_hooks) == 4
    assert drop_orphaned_input_hooks(model) == 2
    live = {h.id for h in model.get_base_model()._require_grads_hooks}
    assert set(embeddings._forward_hooks) == live | {other.id} and len(live) == 1
    out = embeddings(torch.tensor([[1, 2]]))
    assert out.requires_grad  # the live hook still does its job


def test_the_per_step_library_warnings_are_silenced_where_raised(cache_home, monkeypatch):
    """TRL toggles gradient checkpointing around every generation through transformers' deprecated
    aliases (a FutureWarning each time, on GPU runs); models.quiet_library_warnings silences them."""
    import warnings
    from transformers import AutoModelForCausalLM

    from ocaml_grpo.models.loading import quiet_library_warnings

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    model = AutoModelForCausalLM.from_pretrained(ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ))))
    with warnings.catch_warnings(record=True) as loud:
        warnings.simplefilter("always")
        model.gradient_checkpointing_enable()
        model.gradient_checkpointing_disable()
    assert any("deprecated" in str(w.message) for w in loud)
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        quiet_library_warnings()
        model.gradient_checkpointing_enable()
        model.gradient_checkpointing_disable()
    assert [str(w.message) for w in quiet] == []


def test_end_turn_at_stop_closes_only_the_answers_that_stopped():
    decode = lambda ids: "".join(chr(i) for i in ids)  # one character per id
    eos, pad = 1, 0
    ids = [[ord(c) for c in "x = 1 (* END *)"] + [pad, pad],  # stopped early: generate padded it
           [ord(c) for c in "x = 2 (* END *)"],                # stopped last: no end at all
           [ord(c) for c in "x = 3 (* END *)"] + [eos],        # the model ended its turn itself
           [ord(c) for c in "x = 4 (* EN"]]                   # cut at the budget: left alone
    out, _ = end_turn_at_stop(ids, None, decode, "(* END *)", {eos, pad}, eos)
    assert out == [ids[0][:-2] + [eos], ids[1] + [eos], ids[2], ids[3]]
    # vLLM's log-probabilities: the added end of turn was not sampled (probability 1)
    _, lps = end_turn_at_stop(ids[1:2], [[-0.5] * len(ids[1])], decode, "(* END *)", {eos, pad}, eos)
    assert lps == [[-0.5] * len(ids[1]) + [0.0]]
    with pytest.raises(ValueError, match="paged"):
        engine_kwargs("paged", 4, 64, 12, stop="(* END *)")
    assert engine_kwargs("vllm", 4, 64, 12, stop="S")["generation_kwargs"] == {"stop": ["S"], "include_stop_str_in_output": True}
    assert engine_kwargs("compiled", 4, 64, 12, stop="S")["generation_kwargs"] == {"stop_strings": ["S"], "max_cache_len": 76}


def test_the_trainer_stops_an_answer_at_the_stop_text_and_ends_its_turn(tmp_path, cache_home, monkeypatch):
    """TRL's own generation path, sampled from one seed: with the stop text set to what the first
    answer writes in its first tokens, that answer ends right there with one end-of-turn token; the
    other runs on as it did without a stop text."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from ocaml_grpo.training.trainer import OcamlGRPOTrainer

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    model_dir = ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ)))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [{"prompt": "let f x = " + "x + 1 :: " * n} for n in (2, 9)]
    prompt_ids = [tokenizer(r["prompt"])["input_ids"] for r in rows]

    def answers(stop: str | None) -> list[list[int]]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=12, max_steps=1, beta=0.0, report_to=[], use_cpu=True, bf16=False,
                          save_strategy="no", remove_unused_columns=False, seed=0,
                          **engine_kwargs("default", 2, 64, 12, stop=stop))
        t = OcamlGRPOTrainer(model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)], args=args,
                             train_dataset=Dataset.from_list(rows), processing_class=tokenizer, tracker=None, stop=stop)
        torch.manual_seed(1)
        return t._generate_single_turn(prompt_ids, None, {}, 1)[0]

    free = answers(None)
    assert all(len(x) == 12 and tokenizer.eos_token_id not in x for x in free)  # the random model never ends its turn
    n = next(n for n in range(3, 10) if not tokenizer.decode(free[0][:n])[-1].isspace())
    stop = tokenizer.decode(free[0][:n])
    stopped = answers(stop)
    assert stopped[0] == free[0][:n] + [tokenizer.eos_token_id]
    assert stopped[1] == free[1]


def test_a_shaped_model_has_its_real_models_shape_and_is_built_once(tmp_path, monkeypatch):
    """The benchmarks' shaped models (models/tiny.py): a real model's config with random weights and
    the plumbing tokenizer, built once. The real shapes cost seconds to GBs to write; a small one of
    each architecture stands in for them here."""
    import json
    from ocaml_grpo.models import tiny
    for arch in ("Qwen2", "Llama"):
        name = f"small-{arch.lower()}-shape"
        shape = dict(tiny.SHAPES["qwen1.5b-shape" if arch == "Qwen2" else "smollm2-shape"][2], hidden_size=64,
                     intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=1500)
        monkeypatch.setitem(tiny.SHAPES, name, (arch, "float32", shape))
        monkeypatch.setitem(tiny.SHAPE_DIRS, name, name)
        path = tiny.ensure_shaped_model(name, tmp_path)
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == [f"{arch}ForCausalLM"]
        sized = {k: v for k, v in shape.items() if k != "rope_theta"}  # (transformers 5 keeps it in rope_parameters)
        assert {k: config[k] for k in sized} == sized and (path / "tokenizer.json").is_file()
        built = (path / "config.json").stat().st_mtime_ns
        assert tiny.ensure_shaped_model(name, tmp_path) == path and (path / "config.json").stat().st_mtime_ns == built
