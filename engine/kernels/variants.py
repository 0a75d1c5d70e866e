"""What the Triton kernels cost a serving process in compiles and launches, measurable anywhere.

`specialization_key` is the key Triton's launcher looks a compiled variant up by (argument types,
which ints are 1 or multiples of 16, pointer alignment, constexprs, warps), computed for an sm_90
target without a GPU. `VariantLog` records the keys of every launch of the engine's kernels (in the
interpreter, through their pre-run hooks; on a GPU the kernels' own caches hold the same count), so
a test can hold the count after a warm-up fixed across any mix of steps. `LaunchCounter` counts
the device kernels of a forward: Triton launches one each, torch ops one each, views and
allocations none.
"""

from __future__ import annotations

import functools
import importlib
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

KERNEL_MODULES = {
    "engine.kernels.kv_write": ["_kv_write_kernel"],
    "engine.kernels.paged_decode": ["_decode_kernel", "_reduce_kernel"],
    "engine.kernels.paged_prefill": ["_prefill_kernel"],
    "engine.kernels.fused_ops": ["_add_rms_norm_kernel", "_rope_kernel", "_silu_mul_kernel"],
    "engine.kernels.fused_moe": ["_moe_gate_up_kernel", "_moe_down_kernel"],
    "engine.lora.kernels.triton_sgmv": ["_shrink", "_expand"],
}
OPTIONS = ("num_warps", "num_stages")
FREE_OPS = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::lift_fresh", "aten::detach"}


def kernels() -> dict[str, Any]:
    """Every Triton kernel of the engine's forward, by name (imports triton): JITFunctions, or the
    wrappers Triton's decorators put around them (their `.run` launches, `.fn` is the function)."""
    out: dict[str, Any] = {}
    for module, names in KERNEL_MODULES.items():
        mod = importlib.import_module(module)
        out.update({name: getattr(mod, name) for name in names})
    return out


@functools.cache
def _binder(kernel: Any) -> Callable[..., tuple[Any, Any, Any]]:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    twin = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)
    return create_function_from_signature(
        twin.signature, twin.params, make_backend(GPUTarget("cuda", 90, 32))
    )


def specialization_key(kernel: Any, *args: Any, **kwargs: Any) -> str:
    """The variant a launch with these arguments compiles to on an sm_90 GPU."""
    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
    _, specialization, _ = _binder(kernel)(*args, **kwargs)
    return repr((specialization, sorted(options.items())))


class VariantLog:
    """Distinct variants launched per kernel while installed. `execute=False` records without
    running the kernels (their outputs stay uninitialised: for checks that only need the engine's
    control flow, such as scheduling with `ignore_eos`, at the speed of the host code)."""

    def __init__(self, execute: bool = True) -> None:
        self.keys: dict[str, set[str]] = defaultdict(set)
        self.launches: Counter[str] = Counter()
        self.examples: dict[str, dict[str, tuple]] = defaultdict(dict)  # one launch's arguments a key
        self.last: dict[str, tuple[Any, tuple, dict]] = {}  # the last launch a kernel: grid, args, kwargs
        self._patched: list[tuple[Any, Callable[..., Any]]] = []
        for name, kernel in kernels().items():
            original = kernel.run

            def run(
                *args: Any,
                _name: str = name,
                _kernel: Any = kernel,
                _run: Callable[..., Any] = original,
                grid: Any,
                warmup: bool = False,
                **kwargs: Any,
            ) -> Any:
                self.launches[_name] += 1
                self.last[_name] = (grid, args, kwargs)
                key = specialization_key(_kernel, *args, **kwargs)
                self.keys[_name].add(key)
                self.examples[_name].setdefault(key, (args, dict(kwargs)))
                return _run(*args, grid=grid, warmup=warmup, **kwargs) if execute else None

            kernel.run = run
            self._patched.append((kernel, original))

    def counts(self) -> dict[str, int]:
        return {name: len(keys) for name, keys in self.keys.items()}

    def close(self) -> None:
        for kernel, original in self._patched:
            kernel.run = original
        self._patched.clear()


class LaunchCounter(TorchDispatchMode):
    """Device kernels of the code run inside it: torch ops that compute (views and allocations
    are free) plus Triton launches (the work the interpreter does inside one is not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self._inside = 0
        self._patched: list[tuple[Any, Callable[..., Any]]] = []

    def __enter__(self) -> LaunchCounter:
        for name, kernel in kernels().items():
            original = kernel.run

            def run(*args: Any, _name: str = name, _run: Callable[..., Any] = original, **kwargs: Any) -> Any:
                self.ops[f"triton:{_name}"] += 1
                self._inside += 1
                try:
                    return _run(*args, **kwargs)
                finally:
                    self._inside -= 1

            kernel.run = run
            self._patched.append((kernel, original))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        for kernel, original in self._patched:
            kernel.run = original
        self._patched.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if not self._inside and not func.is_view and func._schema.name not in FREE_OPS:
            self.ops[func._schema.name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())
