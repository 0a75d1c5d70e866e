"""A decode step's whole forward in one C call (`csrc/decode_forward.c`).

At batch 1 a decode step on the CPU is a few hundred small operator calls, and from Python each
costs about 10 microseconds of dispatch and ctypes (measured: `add_rms_norm` on one row 10 us,
`index_copy_` of one K row 10 us), about a third of an INT8 step. `DecodeForward` hands the
model's weight pointers to C once; each decode-only step then runs every layer there, with the
same kernels in the same order as the per-operator path, so its outputs are bit-identical.

It serves models on the CPU with the own kernels on and the `cpu` attention backend, for steps
with no prefill and no LoRA: fp32 models (fp32 or int8 projections, the latter in int8_vnni.c or
int8_linear.c as Int8Linear runs them), and bf16 models whose
projections run the AVX512-BF16 kernel (`csrc/decode_forward_bf16.c`: the per-operator forward's
torch ops in bf16, rounded at the same points). Every other step, model and device takes
LlamaModel's per-operator forward. The ModelRunner chooses it (`make`) and dispatches to it,
beside CUDA graphs; it reads the model and its linear layers through their public accessors
(`rope_tables`, `kernel_weight`, `kernel_scale`, `kernel_bias`).

Where bf16 linears hand calls of many rows to AMX tiles (`Linear.onednn_rows`; bf16_amx.c, which
the one call's projections run for as many rows as the per-operator forward's, or oneDNN), the
one call serves decode steps of fewer than `ONE_CALL_MAX_ROWS_ONEDNN` rows: above that the
per-operator forward with AMX linears is faster (a 2-core Xeon with AMX, SmolLM2 in bf16, ms per
decode step, one call against per operator: batch 1 18.3 / 23.7, 4 24.7 / 24.7, 6 27.2 / 27.5,
8 33.0 / 28.8, 16 54.3 / 38.1, 32 92.7 / 56.0).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine import native
from engine.attention import AttentionMetadata
from engine.models.bf16_linear import AMX_MAX_ROWS
from engine.models.fused import CPUOps
from engine.models.linear import Linear
from engine.models.quant import Int8Linear

if TYPE_CHECKING:
    from engine.models.llama import LlamaModel

SOURCE = Path(__file__).parent / "csrc" / "decode_forward.c"
SOURCE_BF16 = Path(__file__).parent / "csrc" / "decode_forward_bf16.c"
_P, _I, _F, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long
_BETWEEN = ctypes.CFUNCTYPE(None, ctypes.c_int)  # LlamaModel.between_layers, called from the C loop
ONE_CALL_MAX_ROWS_ONEDNN = 8  # with oneDNN (AMX) bf16 linears, the one call takes fewer rows than this


_FIELDS: list[tuple[str, Any]] = (  # the C struct DecodeModel (csrc/decode_model.h), in order
    [(n, _I) for n in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate")]
    + [
        ("eps", _F),
        ("attn_scale", _F),
        ("int8", _I),
        ("cache_slots", _L),
        ("block_size", _I),
        ("cos", _P),
        ("sin", _P),
        ("final_norm", _P),
    ]
    + [
        (n, ctypes.POINTER(_P))
        for n in (
            "input_norm",
            "post_norm",
            "qkv",
            "o",
            "gate_up",
            "down",
            "qkv_scale",
            "o_scale",
            "gate_up_scale",
            "down_scale",
            "qkv_bias",
            "o_bias",
            "kv",
        )
    ]
    + [("amx_min_rows", _I), ("amx_max_rows", _I)]
    + [("between_layers", _BETWEEN)]
)


class _Model(ctypes.Structure):
    _fields_ = _FIELDS


def _library(bf16: bool) -> ctypes.CDLL | None:
    name = "decode_forward_bf16" if bf16 else "decode_forward"
    args = [ctypes.POINTER(_Model), _P, _P, _P, _P, _P, _P, _I, _I, _I]
    return native.library(SOURCE_BF16 if bf16 else SOURCE, {name: args})


def _ptrs(tensors: list[torch.Tensor | None]) -> ctypes.Array:
    return (_P * len(tensors))(*[t.data_ptr() if t is not None else None for t in tensors])


class DecodeForward:
    """Built by `make`; call with a decode-only step's inputs."""

    def __init__(self, model: LlamaModel, lib: ctypes.CDLL, int8: bool):
        self.model, self.lib, self.int8 = model, lib, int8
        self.bf16 = model.dtype == torch.bfloat16  # projections in BF16Panels (csrc/bf16_linear.c)
        lin = model.layers[0].qkv
        amx = self.bf16 and lin.onednn_rows is not None  # type: ignore[union-attr]
        own_amx = amx and lin.bf16.amx  # type: ignore[union-attr]
        self.max_rows = ONE_CALL_MAX_ROWS_ONEDNN if amx else None  # None: any batch
        # with bf16_amx.c: the one call's projections of as many rows as the per-operator forward's
        amx_rows = (lin.onednn_rows, AMX_MAX_ROWS) if own_amx else (0, 0)  # type: ignore[union-attr]
        # int8 projections: 2 in int8_vnni.c's panels (Int8Linear.vnni), 1 in int8_linear.c's groups
        vnni = int8 and model.layers[0].qkv.vnni is not None  # type: ignore[union-attr]
        self.int8_kernel = (2 if vnni else 1) if int8 else 0
        self.forward = lib.decode_forward_bf16 if self.bf16 else lib.decode_forward
        layers = model.layers
        cfg = model.config

        def weights(name: str) -> ctypes.Array:
            lins = [getattr(layer, name) for layer in layers]
            return _ptrs([lin.bf16.panels if self.bf16 else lin.kernel_weight for lin in lins])

        def scales(name: str) -> ctypes.Array | None:
            return _ptrs([getattr(layer, name).kernel_scale for layer in layers]) if int8 else None

        def biases(name: str) -> ctypes.Array:
            lins = [getattr(layer, name) for layer in layers]
            return _ptrs([lin.bf16.bias if self.bf16 else lin.kernel_bias for lin in lins])

        # the ctypes arrays must outlive the struct that points into them
        cos, sin = model.rope_tables()
        self._keep: dict[str, ctypes.Array | None] = {
            "input_norm": _ptrs([layer.input_norm for layer in layers]),
            "post_norm": _ptrs([layer.post_norm for layer in layers]),
            **{name: weights(name) for name in ("qkv", "o", "gate_up", "down")},
            **{f"{name}_scale": scales(name) for name in ("qkv", "o", "gate_up", "down")},
            "qkv_bias": biases("qkv"),
            "o_bias": biases("o"),
        }
        self.struct = _Model(
            layers=len(layers),
            hidden=cfg.hidden_size,
            heads=model.num_heads,
            kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            intermediate=cfg.intermediate_size,
            eps=model.eps,
            attn_scale=model.attention.scale,
            int8=self.int8_kernel,
            amx_min_rows=amx_rows[0],
            amx_max_rows=amx_rows[1],
            cache_slots=0,
            block_size=0,
            cos=cos.data_ptr(),
            sin=sin.data_ptr(),
            final_norm=model.norm.data_ptr(),
            **{k: ctypes.cast(v, ctypes.POINTER(_P)) for k, v in self._keep.items() if v is not None},
        )
        self._caches: tuple[int, ...] = ()
        self._between = _BETWEEN(self._between_layers)  # kept alive with the struct that points to it
        self._raised: BaseException | None = None

    def _between_layers(self, layer: int) -> None:
        """From the C loop, after each layer: the model's hook (engine/interrupts.py). An exception
        cannot cross ctypes: it is kept and raised once the call returns."""
        hook = self.model.between_layers
        if hook is not None and self._raised is None:
            try:
                hook(layer)
            except BaseException as exc:  # noqa: BLE001 - re-raised after the C call
                self._raised = exc

    @staticmethod
    def make(model: LlamaModel) -> DecodeForward | None:
        """The one-call decode forward for `model`, or None where it does not apply."""
        from engine.attention.cpu_paged import CPUPagedAttention

        if model.embed.device.type != "cpu" or not isinstance(model.attention, CPUPagedAttention):
            return None
        lins = [getattr(layer, n) for layer in model.layers for n in ("qkv", "o", "gate_up", "down")]
        if model.dtype == torch.float32:  # the fused C ops, fp32 or int8 projections in C
            int8 = all(type(lin) is Int8Linear and lin.has_cpu_kernel for lin in lins)
            dense = all(type(lin) is Linear and lin.has_cpu_kernel for lin in lins)
            if not isinstance(model.ops, CPUOps) or not (int8 or dense):
                return None
        elif model.dtype == torch.bfloat16:  # every projection in the bf16 C kernel (AVX512-BF16 or AVX2)
            int8 = False
            if not all(type(lin) is Linear and lin.bf16 is not None for lin in lins):
                return None
        else:
            return None
        if any(getattr(layer, n).bias is not None for layer in model.layers for n in ("gate_up", "down")):
            return None
        norms = [model.norm] + [t for layer in model.layers for t in (layer.input_norm, layer.post_norm)]
        if not all(t is not None and t.is_contiguous() for t in norms):
            return None
        lib = _library(model.dtype == torch.bfloat16)
        return DecodeForward(model, lib, int8) if lib is not None else None

    def applies(self, meta: AttentionMetadata, kv_caches: list[torch.Tensor]) -> bool:
        cache = kv_caches[0]
        return (
            not meta.prefills
            and meta.num_decodes > 0
            and (self.max_rows is None or meta.num_decodes < self.max_rows)
            and cache.dtype == self.model.dtype
            and cache.device.type == "cpu"
            and cache.is_contiguous()
        )

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        model = self.model
        key = tuple(c.data_ptr() for c in kv_caches)
        if key != self._caches:  # the cache tensors (allocated once per runner)
            caches = (_P * len(key))(*key)
            self._keep["kv"] = caches
            self.struct.kv = ctypes.cast(caches, ctypes.POINTER(_P))
            self.struct.cache_slots = kv_caches[0].shape[2]
            self._caches = key
        self.struct.block_size = meta.block_size
        x = torch.nn.functional.embedding(input_ids, model.embed)  # [B, hidden], the residual stream
        out = torch.empty_like(x)
        tables, ctx = meta.decode_tables_int32()
        positions = positions.to(torch.int64).contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        self.struct.between_layers = self._between if model.between_layers is not None else _BETWEEN()
        self.forward(
            ctypes.byref(self.struct),
            x.data_ptr(),
            out.data_ptr(),
            positions.data_ptr(),
            slots.data_ptr(),
            tables.data_ptr(),
            ctx.data_ptr(),
            x.shape[0],
            tables.shape[1],
            torch.get_num_threads(),
        )
        if self._raised is not None:
            raised, self._raised = self._raised, None
            raise raised
        return out
