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
            "--grpo-steps", "1", "--grpo-min-lines", "0", "--min-std", "0", "--no-selection", "--json", "out.json"]
    res = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["heldout_ids"]) == 4 and set(out) >= {"base", "base_grpo", "gains", "minutes", "seed"}
    for arm in ("base", "base_grpo"):
        assert 0 <= out[arm]["heldout_pass"] <= 1 and 0 <= out[arm]["heldout_compiled"] <= 1
    run = next((tmp_path / "stages").glob("grpo-base_grpo-*/run"))
    assert (run / "finished.json").is_file() and (run / "final_adapter" / "adapter_config.json").is_file()
    # a rerun finds every stage done
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and "== GRPO from base" not in again.stdout and "sampling" not in again.stdout
