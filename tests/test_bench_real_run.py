"""bench/bench_real.py end to end on the plumbing model: every stage of the base and base + GRPO
arms, from a relative --stages folder, and the record it writes."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from ocaml_grpo.models.tiny import ensure_plumbing_model


@pytest.mark.slow
def test_the_base_and_grpo_arms_run_from_a_relative_stages_folder(tmp_path, cache_home):
    model = ensure_plumbing_model(cache_home / "ocaml-grpo" / "plumbing-qwen2-tiny")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(cache_home), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "bench.bench_real", "--model", str(model), "--stages", "stages",
            "--arms", "base,base_grpo", "--heldout", "4", "--pool", "2", "--k", "2", "--multiple", "0",
            "--grpo-steps", "2", "--grpo-min-lines", "0", "--min-std", "0", "--no-selection", "--json", "out.json",
            "--grpo-keep", "1", "--dynamic", "--export", "adapters"]
    res = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["heldout_ids"]) == 4 and set(out) >= {"base", "base_grpo", "gains", "minutes", "seed"}
    for arm in ("base", "base_grpo"):
        assert 0 <= out[arm]["heldout_pass"] <= 1 and 0 <= out[arm]["heldout_compiled"] <= 1
    run = next((tmp_path / "stages").glob("grpo-base_grpo-*/run"))
    assert (run / "finished.json").is_file() and (run / "final_adapter" / "adapter_config.json").is_file()
    assert out["recipe"]["base_grpo"]["dynamic_sampling"] is True 
    assert json.loads((run / "config.json").read_text())["GRPO_DYNAMIC_SAMPLING"] in (True, 1)
    # the curve: the adapter kept at step 1, evaluated and set against the start
    assert set(out["curves"]["base_grpo"]) == {"1"} and -1 <= out["curves"]["base_grpo"]["1"]["pass_gain"] <= 1
    # the run as a stress test: memory per step in its records, nothing of the grader's left behind
    stress = out["stress"]["base_grpo"]
    assert stress["left_folders"] == [] and stress["stray_processes"] == []
    # the exported adapter: bf16, portable (names the model as given), and the arm evaluates from it
    exported = tmp_path / "adapters" / f"{model.name.lower()}-base_grpo"
    from safetensors import safe_open
    with safe_open(str(exported / "adapter_model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}
    assert json.loads((exported / "adapter_config.json").read_text())["base_model_name_or_path"] == str(model)
    assert json.loads((exported / "recipe.json").read_text())["steps"] == 2
    assert (exported / "heldout_ids.txt").read_text().split() == out["heldout_ids"]
    assert "evaluate.py" in (exported / "README.md").read_text() and (exported / "stress.json").is_file()
    assert json.loads((exported / "step-1" / "recipe.json").read_text())["at_step"] == 1
    sft = subprocess.run([*args[:args.index("--arms")], "--arms", "sft", "--heldout", "4", "--pool", "2", "--k", "2",
                          "--multiple", "0", "--adapter", f"sft={exported}", "--json", "sft.json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert sft.returncode == 0 and "SFT (LoRA)" not in sft.stdout, sft.stdout[-3000:] + sft.stderr[-3000:]
    assert json.loads((tmp_path / "sft.json").read_text())["recipe"]["sft"]["weights"] == "bf16"
    # a rerun finds every stage done
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and "== GRPO from base" not in again.stdout and "sampling" not in again.stdout
