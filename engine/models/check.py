"""The check a checkpoint passes before any weight is read: its family, the config fields we would
ignore and the tensors we would not read, from config.json and the safetensors headers (the JSON at
the start of each file; no tensor data). Torch-free: the gateway runs it at start-up."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from engine.models.registry import quantization, resolve
from engine.models.spec import ModelSpec, UnsupportedModelError

# Tensors checkpoints carry that the forward has no use for and that change nothing it computes.
HARMLESS_SUFFIXES = ("rotary_emb.inv_freq",)
FP8_SUFFIXES = (".weight_scale_inv", ".weight_scale", ".input_scale")


def safetensors_header(path: Path) -> dict[str, dict]:
    """{tensor name: {dtype, shape, data_offsets}} of one .safetensors file, from its header alone."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def tensor_headers(folder: Path) -> dict[str, dict]:
    """Every tensor of a folder's safetensors files (sharded or not), by name."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {folder}")
    tensors: dict[str, dict] = {}
    for f in files:
        tensors.update(safetensors_header(f))
    return tensors


def check_tensors(spec: ModelSpec, names: set[str], fp8: bool) -> None:
    """Raise naming the tensors the forward needs but the checkpoint lacks, or has but we would not read."""
    expected = spec.weight_names()
    missing = sorted(expected - names)
    extra = names - expected - {"lm_head.weight"}
    extra = {n for n in extra if not n.endswith(HARMLESS_SUFFIXES)}
    if fp8:
        extra = {n for n in extra if not (n.endswith(FP8_SUFFIXES) and _fp8_owner(n) in expected)}
    if missing:
        raise UnsupportedModelError(
            f"{spec.family}: checkpoint lacks {len(missing)} tensor(s) the model needs, e.g. {missing[:3]}"
        )
    if extra:
        raise UnsupportedModelError(
            f"{spec.family}: checkpoint has {len(extra)} tensor(s) this engine would not read "
            f"(an unsupported variant of the family), e.g. {sorted(extra)[:3]}"
        )


def _fp8_owner(name: str) -> str:
    return name.rsplit(".", 1)[0] + ".weight"


def check_folder(folder: str | Path) -> ModelSpec:
    """The ModelSpec of a Hugging Face folder, or UnsupportedModelError; reads no tensor data."""
    from transformers import AutoConfig  # configs only: no torch needed

    folder = Path(folder)
    raw = json.loads((folder / "config.json").read_text())
    try:
        config = AutoConfig.from_pretrained(folder)
    except (ValueError, KeyError) as exc:  # a model_type transformers does not know
        raise UnsupportedModelError(f"model type {raw.get('model_type')!r} is not supported: {exc}") from None
    spec = resolve(config)
    check_tensors(spec, set(tensor_headers(folder)), fp8=quantization(config) is not None)
    return spec


GGUF_ARCHITECTURES = {"gemma3": "gemma3_text"}  # GGUF architecture names that differ from model_type


def check_model(model: str) -> ModelSpec | None:
    """The check for a model spec as the engine reads it ("smollm2", "dummy", a folder, a .gguf):
    a folder (or a GGUF file's converted folder) is checked in full, a GGUF file not yet converted
    by its architecture name. None where there is nothing to check (dummy weights)."""
    from engine import assets
    from engine.models.registry import FAMILIES

    source = assets.resolve_model(model)
    if source.kind == assets.DUMMY:
        return None
    if source.kind == "folder":
        assert source.path is not None  # a folder source names its folder
        return check_folder(source.path)
    converted = assets.converted_dir(source)
    if (converted / "config.json").is_file():
        return check_folder(converted)
    arch = assets.model_config(model)["model_type"]
    if GGUF_ARCHITECTURES.get(arch, arch) not in FAMILIES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported; "
            f"supported model types: {', '.join(sorted(FAMILIES))}"
        )
    return None
