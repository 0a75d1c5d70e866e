"""CPU backend: decode attention in a small C kernel that reads the paged cache in place.

The torch reference gathers every decode's K/V into a padded copy each step and layer; on CPU
that copy costs more than the attention itself. This backend compiles `csrc/paged_decode.c` with
the system C compiler on first use (about a second), caches the shared library, and calls it
through ctypes. Prefill chunks use the reference path. Without a C compiler, `make_backend("cpu")`
raises and the engine can fall back to "torch".
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from engine import assets
from engine.attention.base import AttentionMetadata, register_backend
from engine.attention.torch_ref import TorchAttention

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.c"
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC"]
# Linked without -ffast-math: with it gcc links crtfastmath.o, whose constructor turns on flush-to-
# zero for the whole process when the library loads (Python floats below 2.2e-308 would become 0).
LINK_FLAGS = ["-fopenmp", "-shared"]
_LIB: ctypes.CDLL | None = None


def kernel_cache_dir() -> Path:
    return assets.cache_dir() / "kernels"


def load_library() -> ctypes.CDLL:
    """Compile (once per source version and machine) and load the kernel library."""
    global _LIB
    if _LIB is not None:
        return _LIB
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        raise RuntimeError("the cpu attention backend needs a C compiler (gcc or cc)")
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + " ".join(FLAGS + LINK_FLAGS).encode() + os.uname().machine.encode()).hexdigest()[:16]
    lib_path = kernel_cache_dir() / f"paged_decode-{key}.so"
    if not lib_path.exists():
        lib_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_path.parent)
        os.close(fd)
        obj = f"{tmp}.o"
        built = subprocess.run([cc, *FLAGS, "-c", "-o", obj, str(SOURCE)], capture_output=True, text=True)
        if built.returncode == 0:
            built = subprocess.run([cc, *LINK_FLAGS, "-o", tmp, obj, "-lm"], capture_output=True, text=True)
        if os.path.exists(obj):
            os.unlink(obj)
        if built.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"compiling {SOURCE.name} failed: {built.stderr.strip()[-2000:]}")
        os.replace(tmp, lib_path)  # atomic: concurrent builders never load a half-written file
    lib = ctypes.CDLL(str(lib_path))
    for name in ("paged_decode_f32", "paged_decode_bf16"):
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4 + [ctypes.c_long] + [ctypes.c_int] * 2 + [
            ctypes.c_float, ctypes.c_int]
    _LIB = lib
    return lib


@register_backend("cpu")
class CPUPagedAttention(TorchAttention):
    KERNELS = {torch.float32: "paged_decode_f32", torch.bfloat16: "paged_decode_bf16"}

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__(num_heads, num_kv_heads, head_dim)
        if head_dim > 256 or num_heads // num_kv_heads > 16:
            raise ValueError("the cpu kernel supports head_dim <= 256 and <= 16 query heads per KV head")
        self.lib = load_library()

    def _decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        kernel = self.KERNELS.get(q.dtype)
        if kernel is None or q.device.type != "cpu":
            return super()._decode(q, kv_cache, meta)
        B, H, D = q.shape
        q = q.contiguous()
        out = torch.empty_like(q)
        tables = meta.decode_block_tables.to(torch.int32).contiguous()
        ctx = meta.decode_context_lens.to(torch.int32).contiguous()
        getattr(self.lib, kernel)(
            q.data_ptr(), kv_cache.data_ptr(), tables.data_ptr(), ctx.data_ptr(), out.data_ptr(),
            B, H, self.num_kv_heads, D, kv_cache.shape[2], meta.block_size, tables.shape[1],
            self.scale, torch.get_num_threads(),
        )
        return out
