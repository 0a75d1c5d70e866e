"""Read and validate a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) without
torch: the safetensors header is parsed directly, so a gateway can check an upload before storing
it and the engine can check a folder before reading its tensors. Every problem is a named
AdapterError (engine/lora/errors.py) that says what is wrong."""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.lora.errors import (
    AdapterBaseMismatchError,
    AdapterConfigError,
    AdapterNotFoundError,
    AdapterRankError,
    AdapterWeightsError,
    UnsupportedAdapterError,
    UnsupportedTargetModuleError,
)
from engine.lora.shape import ARCHITECTURES, MODULE_PARENT, MOE_ARCHITECTURES, TARGET_MODULES, ModelShape

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
MAX_HEADER_BYTES = 64 << 20
KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# adapter_config.json fields of PEFT features this engine does not serve: any truthy value refuses.
UNSUPPORTED_FIELDS = (
    "use_dora",
    "modules_to_save",
    "lora_bias",
    "fan_in_fan_out",
    "rank_pattern",
    "alpha_pattern",
    "layer_replication",
    "use_qalora",
    "alora_invocation_tokens",
    "trainable_token_indices",
    "target_parameters",
    "use_bdlora",
)


@dataclass(frozen=True)
class TensorEntry:
    name: str
    layer: int
    module: str  # "q_proj", ...
    matrix: str  # "A": [r, in]; "B": [out, r]
    dtype: str  # "F32" | "F16" | "BF16"
    shape: tuple[int, ...]


@dataclass(frozen=True)
class AdapterSpec:
    """A validated adapter: its hyperparameters and the tensors its file holds."""

    rank: int
    alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]  # the modules it has tensors for, in TARGET_MODULES order
    layers: tuple[int, ...]  # the layers it has tensors for
    tensors: tuple[TensorEntry, ...]
    size_bytes: int  # both files

    @property
    def scaling(self) -> float:
        """PEFT's multiplier of B @ A: alpha / r, or alpha / sqrt(r) with rslora."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def parse_config(data: bytes | str | dict, max_rank: int) -> dict:
    """adapter_config.json's content -> dict, checked: a LoRA adapter this engine can serve."""
    if isinstance(data, dict):
        cfg = data
    else:
        try:
            cfg = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise AdapterConfigError(
                f"adapter_config.json is not valid JSON: {e}", param="adapter_config"
            ) from None
    if not isinstance(cfg, dict):
        raise AdapterConfigError("adapter_config.json must hold a JSON object", param="adapter_config")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise UnsupportedAdapterError(
            f"peft_type {cfg.get('peft_type')!r} is not supported (only LORA)", param="adapter_config"
        )
    for name in ("r", "lora_alpha", "target_modules"):
        if cfg.get(name) in (None, "", []):
            raise AdapterConfigError(f"adapter_config.json has no {name!r}", param="adapter_config")
    r, alpha = cfg["r"], cfg["lora_alpha"]
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise AdapterConfigError(f"r must be a positive integer, got {r!r}", param="adapter_config")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise AdapterConfigError(f"lora_alpha must be a number, got {alpha!r}", param="adapter_config")
    if r > max_rank:
        raise AdapterRankError(
            f"adapter rank r={r} is over this engine's max_lora_rank={max_rank}", param="adapter_config"
        )
    for name in UNSUPPORTED_FIELDS:
        if cfg.get(name):
            raise UnsupportedAdapterError(f"{name}={cfg[name]!r} is not supported", param="adapter_config")
    if cfg.get("bias", "none") != "none":
        raise UnsupportedAdapterError(
            f"bias={cfg['bias']!r} is not supported (only 'none')", param="adapter_config"
        )
    targets = cfg["target_modules"]
    if isinstance(targets, list):
        bad = [t for t in targets if t not in TARGET_MODULES]
        if bad:
            raise UnsupportedTargetModuleError(
                f"target module(s) {bad} are not supported; supported: {list(TARGET_MODULES)}",
                param="adapter_config",
            )
    elif not isinstance(targets, str):
        raise AdapterConfigError("target_modules must be a list of names or a string", param="adapter_config")
    return cfg


def read_header(data: bytes, file_size: int) -> dict[str, dict]:
    """The safetensors header (its first 8 + n bytes, `data` may hold more) -> {tensor: entry},
    checked against the file size: a truncated file or overlapping offsets are refused."""
    if len(data) < 8:
        raise AdapterWeightsError("adapter_model.safetensors is truncated: no header", param="adapter_model")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES or 8 + n > file_size or len(data) < 8 + n:
        raise AdapterWeightsError(
            f"adapter_model.safetensors is truncated or not safetensors: its header claims "
            f"{n} bytes of a {file_size}-byte file",
            param="adapter_model",
        )
    try:
        header = json.loads(data[8 : 8 + n])
    except (ValueError, UnicodeDecodeError):
        raise AdapterWeightsError(
            "adapter_model.safetensors has a malformed header", param="adapter_model"
        ) from None
    if not isinstance(header, dict):
        raise AdapterWeightsError("adapter_model.safetensors has a malformed header", param="adapter_model")
    header.pop("__metadata__", None)
    body, end = file_size - 8 - n, 0
    for name, e in sorted(
        header.items(), key=lambda kv: kv[1].get("data_offsets", [0])[0] if isinstance(kv[1], dict) else 0
    ):
        try:
            begin, stop = e["data_offsets"]
            numel = math.prod(e["shape"])
            itemsize = DTYPE_BYTES[e["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise AdapterWeightsError(
                f"tensor {name!r}: unsupported dtype or malformed entry (supported dtypes: "
                f"{list(DTYPE_BYTES)})",
                param="adapter_model",
            ) from None
        if begin != end or stop - begin != numel * itemsize:
            raise AdapterWeightsError(f"tensor {name!r} has inconsistent offsets", param="adapter_model")
        if stop > body:
            raise AdapterWeightsError(
                f"adapter_model.safetensors is truncated: tensor {name!r} ends at byte "
                f"{stop} of {body} data bytes",
                param="adapter_model",
            )
        end = stop
    return header


def inspect_adapter(
    config: bytes | str | dict, header: dict[str, dict], shape: ModelShape, max_rank: int, size_bytes: int = 0
) -> AdapterSpec:
    """Check a parsed config and safetensors header against the base model; returns the spec."""
    cfg = parse_config(config, max_rank)
    if shape.model_type in MOE_ARCHITECTURES:
        raise AdapterBaseMismatchError(
            f"LoRA adapters on mixture-of-experts models are not supported (the base model is "
            f"{shape.model_type!r}: its MLPs are experts, which take no LoRA deltas)",
            param="adapter_model",
        )
    if shape.model_type not in ARCHITECTURES:
        raise AdapterBaseMismatchError(
            f"the base model's architecture {shape.model_type!r} has no LoRA support "
            f"(supported: {list(ARCHITECTURES)})",
            param="adapter_model",
        )
    r = cfg["r"]
    supported = shape.target_modules  # Phi-3's fused qkv_proj and gate_up_proj, else q/k/v, gate/up apart
    if isinstance(cfg["target_modules"], list):
        foreign = [t for t in cfg["target_modules"] if t not in supported]
        if foreign:
            raise UnsupportedTargetModuleError(
                f"target module(s) {foreign} are not modules of the base model "
                f"({shape.model_type}: {', '.join(supported)})",
                param="adapter_config",
            )
    entries: dict[tuple[int, str, str], TensorEntry] = {}
    for name, e in header.items():
        m = KEY.match(name)
        if m is None or m.group(3) not in supported or MODULE_PARENT[m.group(3)] != m.group(2):
            raise UnsupportedTargetModuleError(
                f"tensor {name!r} is not a LoRA A/B weight of a supported module "
                f"(base_model.model.model.layers.N.{{self_attn,mlp}}.{{{','.join(supported)}}}.lora_{{A,B}}.weight)",
                param="adapter_model",
            )
        layer, module, matrix = int(m.group(1)), m.group(3), m.group(4)
        if layer >= shape.num_layers:
            raise AdapterBaseMismatchError(
                f"tensor {name!r} is for layer {layer}, but the base model has {shape.num_layers} layers",
                param="adapter_model",
            )
        d_in, d_out = shape.module_dims(module)
        want = (r, d_in) if matrix == "A" else (d_out, r)
        got = tuple(e["shape"])
        if len(got) != 2 or got != want:
            wrong_rank = len(got) == 2 and (got[0] if matrix == "A" else got[1]) != r
            cls = AdapterWeightsError if wrong_rank else AdapterBaseMismatchError
            raise cls(
                f"tensor {name!r} has shape {list(got)}, expected {list(want)} (r={r}; the base model's "
                f"{module} maps {d_in} -> {d_out})",
                param="adapter_model",
            )
        entries[(layer, module, matrix)] = TensorEntry(name, layer, module, matrix, e["dtype"], got)
    if not entries:
        raise AdapterWeightsError("adapter_model.safetensors holds no LoRA tensors", param="adapter_model")
    pairs = {(layer, module) for layer, module, _ in entries}
    for layer, module in sorted(pairs):
        for matrix in "AB":
            if (layer, module, matrix) not in entries:
                raise AdapterWeightsError(
                    f"tensor base_model.model.model.layers.{layer}.{MODULE_PARENT[module]}."
                    f"{module}.lora_{matrix}.weight is missing",
                    param="adapter_model",
                )
    targets = cfg["target_modules"]
    if isinstance(targets, list) or targets == "all-linear":  # then every named module in every layer
        named = list(supported) if targets == "all-linear" else targets
        layers = cfg.get("layers_to_transform")
        layers = (
            range(shape.num_layers) if layers is None else [layers] if isinstance(layers, int) else layers
        )
        for module in named:
            for layer in layers:
                if (layer, module) not in pairs:
                    raise AdapterWeightsError(
                        f"target module {module} of layer {layer} has no tensors", param="adapter_model"
                    )
    modules = tuple(m for m in TARGET_MODULES if any(p[1] == m for p in pairs))
    return AdapterSpec(
        rank=r,
        alpha=float(cfg["lora_alpha"]),
        use_rslora=bool(cfg.get("use_rslora")),
        target_modules=modules,
        layers=tuple(sorted({p[0] for p in pairs})),
        tensors=tuple(entries.values()),
        size_bytes=size_bytes,
    )


def inspect_adapter_dir(path: str | Path, shape: ModelShape, max_rank: int) -> AdapterSpec:
    """Validate a PEFT adapter folder (reads the config and the weights' header only)."""
    path = Path(path)
    cfg_file, weights = path / CONFIG_FILE, path / WEIGHTS_FILE
    for f, param in ((cfg_file, "adapter_config"), (weights, "adapter_model")):
        if not f.is_file():
            raise AdapterNotFoundError(f"no {f.name} in adapter folder {str(path)!r}", param=param)
    config = cfg_file.read_bytes()
    parse_config(config, max_rank)  # the config's problems first: they are the cheaper to name
    size = weights.stat().st_size
    with weights.open("rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        head += fh.read(min(n, MAX_HEADER_BYTES))
    header = read_header(head, size)
    return inspect_adapter(config, header, shape, max_rank, size_bytes=len(config) + size)
