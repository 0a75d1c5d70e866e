"""Small C kernels for the CPU, compiled with the system C compiler on first use (about a second),
cached per source version, flags and machine under the fairlane cache (``kernels/``) and loaded
through ctypes. Used by the `cpu` attention backend (engine/attention/csrc) and by the fp32 and
INT8 linears and the fused elementwise ops (engine/models/csrc)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from engine import assets

FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC"]
# Linked without -ffast-math: with it gcc links crtfastmath.o, whose constructor turns on flush-to-
# zero for the whole process when the library loads (Python floats below 2.2e-308 would become 0).
LINK_FLAGS = ["-fopenmp", "-shared"]
_LIBS: dict[Path, ctypes.CDLL] = {}
_TYPED: dict[Path, ctypes.CDLL | None] = {}


def kernel_cache_dir() -> Path:
    return assets.cache_dir() / "kernels"


def _sources(source: Path, seen: set[Path] | None = None) -> bytes:
    """The source's bytes and those of the local files it includes (`#include "..."`), recursively:
    a kernel built from several files is rebuilt when any of them changes."""
    seen = set() if seen is None else seen
    source = source.resolve()
    if source in seen:
        return b""
    seen.add(source)
    data = source.read_bytes()
    for name in re.findall(rb'^\s*#\s*include\s+"([^"]+)"', data, flags=re.M):
        data += _sources(source.parent / name.decode(), seen)
    return data


def _machine() -> bytes:
    """What -march=native compiles for: the architecture and the CPU's feature flags."""
    flags = b""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            flags = next((line for line in f if line.startswith((b"flags", b"Features"))), b"")
    except OSError:
        pass
    return os.uname().machine.encode() + flags


def load(source: Path) -> ctypes.CDLL:
    """Compile `source` (once per source version and machine) and load it; cached per process.
    Raises RuntimeError without a C compiler or when the build fails."""
    if source in _LIBS:
        return _LIBS[source]
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        raise RuntimeError(f"{source.name} needs a C compiler (gcc or cc)")
    key = hashlib.sha256(_sources(source) + " ".join(FLAGS + LINK_FLAGS).encode() + _machine()).hexdigest()[
        :16
    ]
    lib_path = kernel_cache_dir() / f"{source.stem}-{key}.so"
    if not lib_path.exists():
        lib_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_path.parent)
        os.close(fd)
        obj = f"{tmp}.o"
        built = subprocess.run([cc, *FLAGS, "-c", "-o", obj, str(source)], capture_output=True, text=True)
        if built.returncode == 0:
            built = subprocess.run([cc, *LINK_FLAGS, "-o", tmp, obj, "-lm"], capture_output=True, text=True)
        if os.path.exists(obj):
            os.unlink(obj)
        if built.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"compiling {source.name} failed: {built.stderr.strip()[-2000:]}")
        os.replace(tmp, lib_path)  # atomic: concurrent builders never load a half-written file
    # torch's own libgomp (same soname) is already loaded: the kernels share its OpenMP threads.
    _LIBS[source] = lib = ctypes.CDLL(str(lib_path))
    return lib


def library(source: Path, signatures: dict[str, list]) -> ctypes.CDLL | None:
    """`load(source)` with each named function's argument types set (no return values), or None
    without a C compiler or when the build fails (callers then take their torch path). Once per
    process, the outcome included."""
    if source not in _TYPED:
        try:
            lib = load(source)
        except RuntimeError:
            lib = None
        for name, argtypes in signatures.items() if lib is not None else ():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = None, argtypes
        _TYPED[source] = lib
    return _TYPED[source]
