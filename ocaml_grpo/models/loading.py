"""Loading the models the commands train and sample, and folding an adapter into its base: one
way to pick the dtype, pad the tokenizer, configure LoRA and merge (train.py, `train.py sft`,
`train.py merge`, evaluate.py, the demo).

torch, transformers and peft are imported inside the functions, so importing this module costs
nothing (`train.py --help` and config errors answer in a second).
"""
from __future__ import annotations

import difflib
import inspect
import json
import re
import socket
from pathlib import Path
from typing import Mapping, MutableMapping
from urllib.parse import urlparse

from ocaml_grpo.config.grpo import LoRA
from ocaml_grpo.problems import is_hub_id
from ocaml_grpo.models.named import NAMED, hub_stand_in, named_model_error

# A hub id: `name` or `owner/name`. Anything else that is not an existing directory is a path
# that does not exist.
HUB_ID_RE = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def hub_cache(environ: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps downloaded models (its own rule, without importing it)."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    home = environ.get("HF_HOME") or Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_offline(environ: Mapping[str, str]) -> bool:
    return environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def hub_reachable(environ: Mapping[str, str], timeout: float = 3.0) -> bool:
    """One TCP connection to the hub: an offline machine answers in seconds here, where the
    libraries' own retries take 25-50 s before they give up."""
    url = urlparse(environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def is_hub_model(model_id: str) -> bool:
    """Whether from_pretrained would look `model_id` up on the hub: not a local path nor a named
    model (models/named.py), shaped like a hub id."""
    return (model_id not in NAMED and not Path(model_id).expanduser().exists() and not model_id.startswith(("/", ".", "~"))
            and bool(HUB_ID_RE.fullmatch(model_id)))


def go_offline_unless_needed(model_ids: list[str], dataset: str, environ: MutableMapping[str, str]) -> str | None:
    """Set HF_HUB_OFFLINE=1 (and HF_DATASETS_OFFLINE=1) in `environ` when the run needs nothing
    from the hub, or needs it and cannot reach it (then the note returned says so; the model and
    dataset checks report what is missing from the cache). Must run before transformers,
    datasets or huggingface_hub are imported: they read these variables once, on import."""
    if hub_offline(environ):
        return None
    needed = [m for m in model_ids if is_hub_model(m)] + ([dataset] if is_hub_id(dataset) else [])
    if needed and hub_reachable(environ):
        return None
    environ["HF_HUB_OFFLINE"] = environ["HF_DATASETS_OFFLINE"] = "1"
    return (f"note: the Hugging Face hub cannot be reached; working offline (HF_HUB_OFFLINE=1) with the cached "
            f"copies of {', '.join(needed)}") if needed else None


def model_error(name: str, model_id: str, environ: Mapping[str, str]) -> str | None:
    """Why `model_id` (the value of the variable `name`) cannot be loaded, found without loading
    it: a local directory must hold a saved model, a name (models/named.py) its installed package,
    and a hub id needs the hub or its cached copy."""
    if model_id in NAMED or model_id.endswith(".gguf"):
        return named_model_error(name, model_id)
    path = Path(model_id).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            return (f"{name}={model_id} is not a model directory (no config.json in it): point it at a directory "
                    "written by save_pretrained (e.g. sft_runs/final_model), or at a hub id")
        return None
    if not is_hub_model(model_id):
        return f"{name}={model_id}: no such directory"
    # A near miss of a named model (smollm2-135m) is a typo, not a hub id to download.
    if "/" not in model_id and (named := difflib.get_close_matches(model_id.lower(), list(NAMED), n=1, cutoff=0.7)):
        return f"{name}={model_id} is not a model here: did you mean {named[0]} (a named model, {NAMED[named[0]].pip})?"
    cached = any((hub_cache(environ) / f"models--{model_id.replace('/', '--')}" / "snapshots").glob("*/config.json"))
    if hub_offline(environ) and not cached:
        stand_in = hub_stand_in(model_id)
        return (f"{name}={model_id} is neither a local directory nor a hub model in the local cache "
                f"({hub_cache(environ)}), and the hub is offline (HF_HUB_OFFLINE=1): download it once where the "
                f"hub can be reached (`hf download {model_id}`), or point {name} at a local model "
                "directory" + (f"; {stand_in}" if stand_in else ""))
    return None


def quiet_library_warnings() -> None:
    """Silence the warnings every training run repeats and nobody can act on, where they are raised:
    TRL 1.16 calls transformers 5's deprecated `is_gradient_checkpointing` and toggles gradient
    checkpointing through its deprecated aliases around every generation (FutureWarning each
    step), and warns once that `rollout_func` (the repair turns' rollout) is experimental."""
    import warnings
    for message in (".*is_gradient_checkpointing.*", ".*`gradient_checkpointing_(enable|disable)` is deprecated.*"):
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    warnings.filterwarnings("ignore", message="You are using 'rollout_func', which is an experimental feature",
                            category=UserWarning)


def load_tokenizer(path: str | Path, padding_side: str | None = None):
    """The tokenizer, with the end-of-sequence token as padding when it has none."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if padding_side:
        tokenizer.padding_side = padding_side
    return tokenizer


def load_model(path: str | Path, fp32: bool = False):
    """A causal LM in bf16 on a GPU, in fp32 on a CPU (or when asked): TRL's bf16 default runs
    ~5x slower on CPUs without bf16 units."""
    import torch
    from transformers import AutoModelForCausalLM
    dtype = torch.bfloat16 if torch.cuda.is_available() and not fp32 else torch.float32
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)


def lora_config(lora: LoRA):
    """peft's description of the adapter the LORA_* settings describe."""
    from peft import LoraConfig
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias=lora.bias,
                      target_modules=lora.target_modules.split(","), task_type="CAUSAL_LM")


def adapter_base(adapter_dir: str | Path) -> str | None:
    """The base model an adapter was trained on, as its adapter_config.json records it."""
    return json.loads((Path(adapter_dir) / "adapter_config.json").read_text()).get("base_model_name_or_path")


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path, fp32: bool = False) -> Path:
    """Fold a LoRA adapter into its base model and save the result with its tokenizer (the
    adapter's when it was saved with one), so it loads without peft (vLLM, llama.cpp export)."""
    from peft import PeftModel
    from transformers import AutoTokenizer
    base = adapter_base(adapter_dir)
    merged = PeftModel.from_pretrained(load_model(base, fp32), str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out_dir))
    has_tokenizer = (Path(adapter_dir) / "tokenizer_config.json").exists()
    AutoTokenizer.from_pretrained(str(adapter_dir) if has_tokenizer else base).save_pretrained(str(out_dir))
    return Path(out_dir)


def export_adapter(adapter_dir: str | Path, out_dir: str | Path, base: str) -> Path:
    """A LoRA adapter to keep or share: its weights in bf16 (half the size; evaluate.py and
    `GRPO_INIT_ADAPTER` load them into an fp32 model as they load fp32 ones) and its config naming
    `base` (a named model or hub id) instead of the path of the machine that trained it."""
    import torch
    from safetensors.torch import load_file, save_file
    src, out = Path(adapter_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
               for k, v in load_file(str(src / "adapter_model.safetensors")).items()}
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}, indent=2) + "\n")
    return out


def checkpointing_kwargs(config_cls: type, on: bool) -> dict:
    """Activation checkpointing, under the name this transformers' TrainingArguments takes: 5.23
    (the pinned set) calls it `activation_checkpointing`, older releases `gradient_checkpointing`
    (5.17, on the GPU image this project is lent, rejected the new name)."""
    params = inspect.signature(config_cls.__init__).parameters
    return {"activation_checkpointing" if "activation_checkpointing" in params else "gradient_checkpointing": on}
