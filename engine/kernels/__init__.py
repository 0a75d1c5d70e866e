"""Triton kernels for the GPU path: the paged KV-cache write, paged decode attention (GQA-aware,
split along the context) and paged prefill/extend attention (causal, variable length).

Each kernel module imports triton when it is imported; this package imports none of them, so
`import engine` never needs triton. Triton reads TRITON_INTERPRET when a kernel is defined: set it
before importing a kernel module to run the kernels on CPU (tests/engine/kernels).
"""
