"""llama.cpp sampling resumes a killed run where it stopped (training/sampling.generate_llamacpp's
partial file), as bench_real's evaluations use it. A module of its own: its engines are made and
closed while no other is alive (an engine made and closed beside a live one crashes that one's
close, in llama.cpp: tests/test_llamacpp.py's module engine)."""
import json

import pytest

from test_llamacpp import MODEL, needs_engine, needs_model


@needs_engine
@needs_model
def test_a_killed_sampling_resumes_where_it_stopped_and_samples_what_one_run_would(tmp_path, cache_home):
    """bench_real's evaluations through the engine keep each batch as it is done (a partial file):
    started again after a kill, they go on from there, with the answers one run gives."""
    from ocaml_grpo.training.sampling import generate_llamacpp
    prompts = [[{"role": "user", "content": f"Write an OCaml function number {i}."}] for i in range(3)]
    args = (MODEL, None, prompts, 2, 12, 0.8, 1, 7, cache_home)
    whole = generate_llamacpp(*args, progress=False)
    partial = tmp_path / "generations.partial.json"

    class Killed(Exception):
        pass

    def killed(start, texts, lens):
        if start == 1:
            raise Killed  # killed after the second batch, before it was kept (a KeyboardInterrupt ends an xdist worker)
    with pytest.raises(Killed):
        generate_llamacpp(*args, progress=False, on_batch=killed, partial=partial)
    assert len(json.loads(partial.read_text())["outs"]) == 1  # the first batch kept
    seen = []
    resumed = generate_llamacpp(*args, progress=False, partial=partial, on_batch=lambda s, t, n: seen.append(s))
    assert resumed == whole and seen == [1, 2] and not partial.exists()
