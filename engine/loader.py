"""Where weights come from: a Hugging Face folder, a GGUF file (converted once and cached as
safetensors), the packaged SmolLM2, or random "dummy" weights for any Llama-family config.

Which files a model spec names, the cache directory and the tokenizer come from `engine.assets`
(torch-free, shared with the gateway); this module adds what needs torch."""

from __future__ import annotations

import glob
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, LlamaConfig

from engine import assets
from engine.models import fp8
from engine.models.check import check_folder
from engine.models.registry import quantization

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    config: LlamaConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: Any  # a transformers tokenizer, or None (dummy weights)
    eos_token_ids: tuple[int, ...]
    name: str
    path: Path | None = None  # the folder the weights were read from (None: dummy)


def load_model(
    model: str,
    *,
    cache_dir: str | None = None,
    dummy_config: dict | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Resolve `model` ("smollm2", "dummy", a folder or a .gguf path) to weights and tokenizer.
    Dummy weights are drawn on `device` in `dtype`; read weights stay on the host as stored."""
    source = assets.resolve_model(model)
    if source.kind == assets.DUMMY:
        return load_dummy(dummy_config or {}, seed=seed, device=device, dtype=dtype)
    if source.kind == "gguf":
        return load_gguf(source, cache_dir=cache_dir)
    return load_folder(source.files)


def load_folder(path: Path, name: str | None = None) -> LoadedModel:
    """A Hugging Face folder: config.json, *.safetensors (sharded or not) and (optionally) a
    tokenizer. The checkpoint is checked first (engine/models/check.py): one we cannot serve exactly
    raises UnsupportedModelError before any weight is read."""
    check_folder(path)
    config = AutoConfig.from_pretrained(path)
    files = sorted(glob.glob(str(path / "*.safetensors")))
    sd: dict[str, torch.Tensor] = {}
    for file in files:
        sd.update(load_file(file))
    if quantization(config) is not None:
        sd = fp8.dequantize(sd)
    tokenizer = assets.load_tokenizer(str(path))
    return LoadedModel(config, sd, tokenizer, _eos_ids(path, config), name or path.name, path)


def load_gguf(source: assets.ModelSource, *, cache_dir: str | None = None) -> LoadedModel:
    """Dequantize a GGUF file through transformers once (about 20 s) and keep a safetensors copy."""
    target = assets.converted_dir(source, cache_dir)
    if not (target / "config.json").exists():
        log.info("converting %s to safetensors in %s (first use only)", source.path, target)
        assets.save_atomically(target, lambda tmp: _convert_gguf(source.files, tmp))
    return load_folder(target, name=source.name)


def _convert_gguf(gguf: Path, folder: Path) -> None:
    """Weights (float32), config and tokenizer of a GGUF file as a Hugging Face folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def load_dummy(
    overrides: dict[str, Any],
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Random weights (normal, std = initializer_range) for a Llama config; SmolLM2's shape by default.
    Drawn on `device` (an 8B shape in seconds on a GPU) one tensor at a time in float32, kept in
    `dtype`; the same seed gives the same weights on the same kind of device."""
    config: Any = LlamaConfig(**{**assets.DUMMY_CONFIG, **overrides})  # its fields typed loosely
    gen = torch.Generator(device=device).manual_seed(seed)
    std = config.initializer_range
    hd = config.head_dim or config.hidden_size // config.num_attention_heads
    shapes: dict[str, tuple[int, int] | None] = {
        "model.embed_tokens.weight": (config.vocab_size, config.hidden_size),
        "model.norm.weight": None,
    }
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (config.num_attention_heads * hd, config.hidden_size),
                p + "self_attn.k_proj.weight": (config.num_key_value_heads * hd, config.hidden_size),
                p + "self_attn.v_proj.weight": (config.num_key_value_heads * hd, config.hidden_size),
                p + "self_attn.o_proj.weight": (config.hidden_size, config.num_attention_heads * hd),
                p + "mlp.gate_proj.weight": (config.intermediate_size, config.hidden_size),
                p + "mlp.up_proj.weight": (config.intermediate_size, config.hidden_size),
                p + "mlp.down_proj.weight": (config.hidden_size, config.intermediate_size),
                p + "input_layernorm.weight": None,
                p + "post_attention_layernorm.weight": None,
            }
        )
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, config.hidden_size)

    def draw(shape: tuple[int, int] | None) -> torch.Tensor:
        if shape is None:
            return torch.ones(config.hidden_size, device=device, dtype=dtype)
        return (torch.randn(shape, generator=gen, device=device) * std).to(dtype)

    sd = {k: draw(s) for k, s in shapes.items()}
    eos = config.eos_token_id
    return LoadedModel(config, sd, None, tuple(eos if isinstance(eos, list) else [eos]), "dummy")


def save_model(loaded: LoadedModel, folder: Path, *, tokenizer: Any = None) -> Path:
    """Write weights, config and a tokenizer (`tokenizer` or the model's own) as a Hugging Face
    folder that `load_model` reads back: e.g. random weights beside a real tokenizer."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    loaded.config.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in loaded.state_dict.items()}, str(folder / "model.safetensors"))
    tokenizer = tokenizer if tokenizer is not None else loaded.tokenizer
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def _eos_ids(path: Path, config: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (path / "generation_config.json", path / "config.json"):
        if source.exists():
            eos = json.loads(source.read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
    return tuple(dict.fromkeys(ids))
