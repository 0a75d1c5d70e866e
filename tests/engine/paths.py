"""The numeric paths of the engine that the suite runs, whatever `dtype: auto` and the attention
backend's `auto` pick on the machine in front of it: fp32 with and without the C kernels, bf16
(forced; on a CPU without AVX512-BF16 the C linears widen bf16 to fp32 with AVX2, the same
arithmetic) with the C kernels alone and with oneDNN's (AMX) linears for many rows, INT8,
and each attention backend (C, torch, Triton in its interpreter).

Tests take a path with `@pytest.mark.parametrize("path", PATHS, ids=str)` (or a subset) and build
their engine with `path.llm(...)`; tests/engine/conftest.py prints, at the end of the run, which
paths ran and how their tests ended.

What each path is held to against Hugging Face transformers:
- exact (fp32, no quantization): the same greedy tokens as transformers in fp32.
- bf16: transformers in bf16 on the same weights, by greedy-prefix agreement (AGREE_BF16 of the
  tokens before the first divergence, summed over prompts) and the log-probability the engine gives
  each of the reference's tokens within LOGPROB_TOL_BF16 nats up to that divergence. bf16 rounding
  differs between our kernels and transformers' (fused ops, the paged attention's summation order),
  so after a near tie two greedy continuations may part; before it they agree.
- int8: the fp32 path by greedy-prefix agreement (tests/engine/models/test_quant.py holds the
  perplexity).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

LOGPROB_TOL_BF16 = 0.25  # nats, |ours - transformers bf16| on the reference's own tokens
AGREE_BF16 = 0.5  # share of the reference's tokens produced before the first divergence


@dataclass(frozen=True)
class EnginePath:
    name: str
    dtype: str = "float32"
    cpu_kernels: bool = True
    attention_backend: str = "cpu"
    quantization: str | None = None
    cpu_amx: bool | None = None  # EngineConfig.cpu_amx: None where the CPU has AMX
    marks: tuple = field(default=(), compare=False)

    def __str__(self) -> str:
        return self.name

    @property
    def exact(self) -> bool:
        """Token for token against transformers in fp32."""
        return self.dtype == "float32" and self.quantization is None

    @property
    def reference_dtype(self) -> str:
        """The transformers dtype this path is compared with."""
        return "bfloat16" if self.dtype == "bfloat16" else "float32"

    def overrides(self) -> dict:
        """EngineConfig fields of this path."""
        return dict(
            dtype=self.dtype,
            cpu_kernels=self.cpu_kernels,
            attention_backend=self.attention_backend,
            quantization=self.quantization,
            cpu_amx=self.cpu_amx,
        )

    def llm(self, model: str = "smollm2", **overrides):
        from engine import LLM

        return LLM(model=model, **{"num_threads": 2, **self.overrides(), **overrides})

    def param(self):
        return pytest.param(self, id=self.name, marks=self.marks)


FP32_C = EnginePath("fp32-c")  # the fp32 C linears, fused ops, one-call decode, C paged attention
FP32_TORCH = EnginePath("fp32-torch", cpu_kernels=False, attention_backend="torch")  # plain torch ops
# bf16 C linears for every row count (else oneDNN), fused ops, one-call decode, C paged attention
BF16_C = EnginePath("bf16-c", dtype="bfloat16", cpu_amx=False)
# as on a CPU with AMX (forced elsewhere): bf16 C linears below 3 rows, oneDNN from 3 (AMX where the
# CPU has it), the one-call decode below 8 rows
BF16_AMX = EnginePath("bf16-amx", dtype="bfloat16", cpu_amx=True)
BF16_TORCH = EnginePath("bf16-torch", dtype="bfloat16", cpu_kernels=False, attention_backend="torch")
INT8 = EnginePath("int8", quantization="int8")  # the INT8 C kernel, fp32 elsewhere
TRITON_FP32 = EnginePath("fp32-triton", cpu_kernels=False, attention_backend="triton")  # interpreter
TRITON_BF16 = EnginePath("bf16-triton", dtype="bfloat16", cpu_kernels=False, attention_backend="triton")

# Every path on the real model (SmolLM2-135M). Triton's interpreter runs the tiny model only
# (tests/engine/attention/test_triton_engine.py): on SmolLM2 it would take minutes a token.
PATHS = [FP32_C, FP32_TORCH, BF16_C, BF16_AMX, BF16_TORCH, INT8]
TRITON_PATHS = [TRITON_FP32, TRITON_BF16]
ALL = PATHS + TRITON_PATHS


def params(paths: list[EnginePath]) -> list:
    return [p.param() for p in paths]


def greedy_prefix(reference: list[int], ours: list[int]) -> int:
    """How many of the reference's tokens come before the first divergence."""
    return next(
        (i for i, (a, b) in enumerate(zip(reference, ours)) if a != b), min(len(reference), len(ours))
    )
