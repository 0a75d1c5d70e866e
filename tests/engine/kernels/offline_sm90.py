"""Compile every Triton kernel of the engine for an H100 (sm_90a) without a GPU, at the shapes we
serve, and print one JSON line a variant: shared memory, registers, spill bytes.

    python tests/engine/kernels/offline_sm90.py [--jobs 2] [--update]

Run without TRITON_INTERPRET (triton reads it at import). The launchers are called with host
tensors laid out as the engine lays them out, their launches are captured (engine/kernels/variants.py)
instead of run, and each distinct variant is compiled with Triton's compiler and its bundled ptxas,
exactly as the launcher would on the GPU (same signature, specialisation and options).

A compile takes seconds, so results are kept by Triton's own cache key (kernel source, options,
Triton and ptxas versions): in sm90_report.json beside this file (committed; `--update` rewrites
it) and in ~/.cache/fairlane/sm90.json. A changed kernel misses both and is compiled again.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import json
import os
import re
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPORT = Path(__file__).with_name("sm90_report.json")
USER_CACHE = Path.home() / ".cache" / "fairlane" / "sm90.json"

HEAD_DIMS = (64, 128, 256)
GROUPS = (1, 4, 8)  # query heads per KV head (GQA)
SPLITS = (1, 4)
BLOCK_SIZE = 16
SINK_SHAPES = ((64, 8),)  # (head dim, group) of the models with attention sinks (gpt-oss)
# (name, hidden, intermediate, experts, top-k, gpt-oss's activation and biases)
MOE_SHAPES = (
    ("qwen3-30b-a3b", 2048, 768, 128, 8, False),
    ("gpt-oss-20b", 2880, 2880, 32, 4, True),
    ("mixtral-8x7b", 4096, 14336, 8, 2, False),
    ("olmoe-1b-7b", 2048, 1024, 64, 8, False),
)
MOE_TOKENS = (1, 256)  # a decode step (16-row blocks) and a prefill-sized one (64-row blocks)
LORA_SHAPES = ((4096, 3 * 4096, 3), (14336, 4096, 1))  # (in, out, m): an 8B's fused qkv and down
MMA = re.compile(r"\b(wgmma\.mma_async\S*|mma\.sync\S*)")


def launch_lora(dtype, in_f: int, out_f: int, m: int, rows: int = 3) -> None:
    """The LoRA kernels as the engine launches them: fp32 adapters (rank 16) in every model dtype,
    one segment of `rows` rows (run, or captured by a VariantLog)."""
    import torch

    from engine.lora.kernels.base import Segment
    from engine.lora.kernels.triton_sgmv import TritonSGMV

    lora = TritonSGMV()
    a = torch.empty(2, 16, m, in_f, dtype=torch.float32)
    b = torch.empty(2, 16, m, out_f // m, dtype=torch.float32)
    meta = lora.prepare([Segment(0, rows, 0, 16)], torch.device("cpu"))
    x, y = torch.empty(rows, in_f, dtype=dtype), torch.empty(rows, out_f // m * m, dtype=dtype)
    lora.apply(y, x, a, b, meta)


def capture():
    """[(kernel name, args, kwargs, label)] of every distinct variant the grid launches."""
    import torch

    from engine.kernels import fused_moe, kv_write, paged_decode, paged_prefill
    from engine.kernels.fused_ops import TritonOps
    from engine.kernels.variants import VariantLog

    log = VariantLog(execute=False)
    labels = {}

    def mark(label):
        for name, examples in log.examples.items():
            for key in examples:
                labels.setdefault((name, key), label)

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        dn = str(dtype).removeprefix("torch.")
        for d in HEAD_DIMS:
            for g in GROUPS:
                kvh = 8
                h = kvh * g
                T = 5
                qkv = torch.empty(T, (h + 2 * kvh) * d, dtype=dtype)  # the forward's fused projection
                q = qkv[:, : h * d].view(T, h, d)
                k = qkv[:, h * d : (h + kvh) * d].view(T, kvh, d)
                v = qkv[:, (h + kvh) * d :].view(T, kvh, d)
                cache = torch.empty(2, kvh, 64 * BLOCK_SIZE, d, dtype=dtype)
                kv_write.kv_cache_write(k, v, cache, torch.zeros(T, dtype=torch.int64))
                out = torch.empty(T, h, d, dtype=dtype)
                for splits in SPLITS:
                    tables = torch.zeros(2, 40, dtype=torch.int64)
                    ctx = torch.ones(2, dtype=torch.int64)
                    paged_decode.paged_decode(
                        q[:2], cache, tables, ctx, BLOCK_SIZE, 0.1, num_splits=splits, out=out[:2]
                    )
                paged_prefill.paged_prefill(
                    q,
                    cache,
                    torch.zeros(1, 40, dtype=torch.int64),
                    torch.tensor([0, T]),
                    torch.tensor([T]),
                    T,
                    BLOCK_SIZE,
                    0.1,
                    out=out,
                )
                mark(f"{dn} head_dim {d} group {g}")
                if (d, g) in SINK_SHAPES:
                    sinks = torch.empty(h, dtype=torch.float32)
                    for splits in SPLITS:
                        paged_decode.paged_decode(
                            q[:2],
                            cache,
                            tables,
                            ctx,
                            BLOCK_SIZE,
                            0.1,
                            num_splits=splits,
                            out=out[:2],
                            sinks=sinks,
                        )
                    paged_prefill.paged_prefill(
                        q, cache, tables[:1], torch.tensor([0, T]), torch.tensor([T]), T, BLOCK_SIZE, 0.1,
                        out=out, window=128, sinks=sinks,
                    )  # fmt: skip
                    mark(f"{dn} head_dim {d} group {g} sinks")
        for name, hidden, inter, experts, k, oai in MOE_SHAPES:
            # expert weights as stride-0 views: the strides' divisibility is what picks a variant
            w1 = torch.empty(1, 2 * inter, hidden, dtype=dtype).expand(experts, -1, -1)
            w2 = torch.empty(1, hidden, inter, dtype=dtype).expand(experts, -1, -1)
            b1 = torch.empty(experts, 2 * inter, dtype=dtype) if oai else None
            b2 = torch.empty(experts, hidden, dtype=dtype) if oai else None
            act = dict(activation="swigluoai", swiglu_limit=7.0, interleaved_gate_up=True) if oai else {}
            for tokens in MOE_TOKENS:
                ids = torch.arange(tokens * k).view(tokens, k) % experts
                x = torch.empty(tokens, hidden, dtype=dtype)
                weights = torch.empty(tokens, k, dtype=torch.float32)
                fused_moe.fused_moe(x, w1, w2, ids, weights, b_gate_up=b1, b_down=b2, **act)
                mark(f"{dn} moe {name} tokens {tokens}")
        ops = TritonOps()
        for hidden, inter, heads, kvh, d in [
            (2048, 8192, 32, 8, 64),
            (4096, 14336, 32, 8, 128),
            (576, 1536, 9, 3, 64),
        ]:
            x = torch.empty(3, hidden, dtype=dtype)
            ops.add_rms_norm(x, x.clone(), torch.empty(hidden, dtype=dtype), 1e-5)
            ops.add_rms_norm(x, None, torch.empty(hidden, dtype=dtype), 1e-5)
            qkv = torch.empty(3, (heads + 2 * kvh) * d, dtype=dtype)
            cs = torch.empty(64, d, dtype=dtype)
            ops.rope(
                qkv[:, : (heads + kvh) * d].view(3, heads + kvh, d), cs, cs, torch.zeros(3, dtype=torch.int64)
            )
            ops.silu_mul(torch.empty(3, 2 * inter, dtype=dtype))
            mark(f"{dn} hidden {hidden}")
        for in_f, out_f, m in LORA_SHAPES:
            launch_lora(dtype, in_f, out_f, m)
            mark(f"{dn} lora in {in_f}")
    log.close()
    return [
        (name, args, kwargs, labels[(name, key)])
        for name, examples in log.examples.items()
        for key, (args, kwargs) in examples.items()
    ]


def capture_lora():
    """capture() for the LoRA kernels alone: every model dtype at LORA_SHAPES."""
    import torch

    from engine.kernels.variants import VariantLog

    log, labels = VariantLog(execute=False), {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for in_f, out_f, m in LORA_SHAPES:
            launch_lora(dtype, in_f, out_f, m)
            for name, examples in log.examples.items():
                for key in examples:
                    labels.setdefault((name, key), f"{str(dtype).removeprefix('torch.')} lora in {in_f}")
    log.close()
    return [(n, *log.examples[n][key], label) for (n, key), label in labels.items()]


def source(item):
    """(name, label, ASTSource, options, Triton's cache key) of a captured launch."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler.compiler import get_cache_invalidating_env_vars, get_cache_key
    from triton.runtime.jit import create_function_from_signature

    from engine.kernels.variants import OPTIONS, kernels

    name, args, kwargs, label = item
    kernel = kernels()[name]
    backend = make_backend(GPUTarget("cuda", 90, 32))
    kwargs = dict(kwargs)
    opts = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, {**kwargs, **opts}, bound, specialization, options
    )
    src = ASTSource(kernel, signature, constexprs, attrs)
    key = get_cache_key(src, backend, options, get_cache_invalidating_env_vars())
    return name, label, src, options, hashlib.sha256(key.encode()).hexdigest()


def compile_one(item, ptx: bool = False) -> dict:
    """Shared memory, registers and spills of a captured launch's sm_90a build; with `ptx`, also
    the kinds of tensor-core instruction in its PTX ("mma")."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    name, label, src, options, key = source(item)
    target = GPUTarget("cuda", 90, 32)
    knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(src, target=target, options=options.__dict__)
    text = log.getvalue()
    regs = re.search(r"Used (\d+) registers", text)
    stores = re.search(r"(\d+) bytes spill stores", text)
    loads = re.search(r"(\d+) bytes spill loads", text)
    if regs is None:
        raise RuntimeError(f"{name} {label}: no ptxas report (a cached compile?)\n{text[-2000:]}")
    out = {
        "key": key,
        "kernel": name,
        "variant": label,
        "num_warps": options.num_warps,
        "shared": compiled.metadata.shared,
        "registers": int(regs.group(1)),
        "spill_bytes": int(stores.group(1)) + int(loads.group(1)),
    }
    if ptx:
        out["mma"] = sorted(set(MMA.findall(compiled.asm["ptx"])))
    return out


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--update", action="store_true", help=f"rewrite {REPORT.name} with this grid's results")
    ap.add_argument("--lora", action="store_true", help="LoRA kernels only, with MMA kinds")
    args = ap.parse_args(argv)
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="sm90-")  # a fresh cache: ptxas reports
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if args.lora:
        with ProcessPoolExecutor(args.jobs) as pool:
            lora = list(pool.map(functools.partial(compile_one, ptx=True), capture_lora()))
        for r in lora:
            print(json.dumps(r))
        return lora
    items = capture()
    keys = [source(item)[4] for item in items]
    known = {**_load(REPORT), **_load(USER_CACHE)}
    todo = [item for item, key in zip(items, keys) if key not in known]
    if todo:
        with ProcessPoolExecutor(min(args.jobs, len(todo))) as pool:
            for r in pool.map(compile_one, todo):
                known[r.pop("key")] = r
        USER_CACHE.parent.mkdir(parents=True, exist_ok=True)
        USER_CACHE.write_text(json.dumps({**_load(USER_CACHE), **{k: known[k] for k in keys}}))
    results = [{**known[key], "variant": item[3]} for item, key in zip(items, keys)]
    if args.update:
        REPORT.write_text(json.dumps({k: known[k] for k in keys}, indent=1, sort_keys=True) + "\n")
    print(json.dumps({"variants": len(items), "compiled": len(todo)}))
    for r in results:
        print(json.dumps(r))
    return results


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
