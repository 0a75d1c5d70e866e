"""The drafter EngineConfig.speculative_config asks for: prompt lookup (ngram.py) or a draft model
(draft_model.py), the latter built here beside the target: its weights (the target's own for
"self"), its vocabulary checked against the target's, its shadow KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.speculative.config import SELF, SpeculativeConfig, parse_speculative_config
from engine.speculative.ngram import NgramProposer

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.loader import LoadedModel
    from engine.model_runner import ModelRunner
    from engine.speculative.draft_model import DraftModelDrafter


def make_drafter(
    config: EngineConfig,
    max_model_len: int,
    target: LoadedModel | None = None,
    runner: ModelRunner | None = None,
) -> NgramProposer | DraftModelDrafter | None:
    """The scheduler's drafter for config.speculative_config (None: speculation off), for sequences
    of up to `max_model_len` tokens. A draft model needs the engine's loaded target and runner
    (ValueError without them)."""
    spec = parse_speculative_config(config.speculative_config)
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer(spec, max_model_len)
    if target is None or runner is None:
        raise ValueError("speculative_config method 'draft_model' needs the engine's target model")
    return build_draft_model(spec, max_model_len, config, target, runner)


def build_draft_model(
    config: SpeculativeConfig,
    max_model_len: int,
    engine_config: EngineConfig,
    target: LoadedModel,
    runner: ModelRunner,
) -> DraftModelDrafter:
    """The draft model of `config` on the target's device and in its dtype (INT8 linears with
    quantization "int8"), over a cache of the target's blocks. ValueError for a draft the target
    cannot use: another vocabulary, or a cache the shadow scheme does not cover (sliding windows,
    longrope)."""
    from engine.attention import make_backend
    from engine.loader import load_model
    from engine.models import LlamaModel, resolve
    from engine.models.decode import DecodeForward
    from engine.speculative.draft_model import DraftModelDrafter

    name = config.model
    assert name is not None  # parse_speculative_config requires it for draft_model
    target_spec = runner.model.spec
    if runner.sliding_window or target_spec.window or target_spec.long_rope_after:
        raise ValueError(
            "speculative_config method 'draft_model' does not serve a target with sliding-window "
            "attention or longrope (its draft cache mirrors the target's block tables)"
        )
    same = name in (SELF, engine_config.model)
    draft = target if same else load_model(name, cache_dir=engine_config.cache_dir)
    if not same:
        check_vocabulary(target, draft, name)
    cfg: Any = draft.config
    spec = resolve(cfg)
    if spec.window or spec.long_rope_after:
        raise ValueError(
            f"speculative_config.model {name!r}: a draft with sliding-window attention or longrope "
            "is not served"
        )
    device, dtype = runner.device, runner.dtype
    backend = make_backend(
        engine_config.attention_backend, spec.num_heads, spec.num_kv_heads, spec.head_dim, device
    )
    weights = {
        k: t.to(device, dtype if t.is_floating_point() else t.dtype) for k, t in draft.state_dict.items()
    }
    model = LlamaModel.from_state_dict(
        cfg,
        weights,
        dtype,
        backend,
        max_model_len,
        config.quantization,
        cpu_kernels=engine_config.cpu_kernels,
        cpu_amx=engine_config.cpu_amx,
    )
    del weights
    one_call = engine_config.cpu_kernels and model.spec.supports_one_call_decode
    decode = DecodeForward.make(model) if one_call else None
    kv_caches = [
        backend.allocate_cache(runner.num_blocks * runner.block_size, dtype, device)
        for _ in range(spec.num_layers)
    ]  # the shadow cache: the target's block ids and block size
    return DraftModelDrafter(
        config, model, decode, kv_caches, runner.block_size, max_model_len, runner.tables
    )


def check_vocabulary(target: LoadedModel, draft: LoadedModel, name: str) -> None:
    """A draft proposes token ids the target verifies: the two must share one vocabulary."""
    t_size, d_size = target.config.vocab_size, draft.config.vocab_size
    if t_size != d_size:
        raise ValueError(
            f"speculative_config.model {name!r} has a vocabulary of {d_size} tokens, the target "
            f"{t_size}: a draft model must share the target's tokenizer"
        )
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    if (t_tok is None) != (d_tok is None) or (
        t_tok is not None and d_tok is not None and t_tok.get_vocab() != d_tok.get_vocab()
    ):
        raise ValueError(
            f"speculative_config.model {name!r} has another tokenizer than the target: a draft "
            "model must share the target's tokenizer"
        )
