"""KV blocks held against sequence length for a model mixing sliding and full layers, with the
sliding layers in a pool of their own (released out of the window) and with one pool for all.

    python -m benchmarks.kv_groups            # about two minutes on 2 CPU cores
    python -m benchmarks.kv_groups --smoke    # a few seconds

One greedy conversation on a tiny random Gemma 3 text model with Gemma 3's layer pattern (five
sliding layers to one full, window 512, 16-token blocks): a 1,024-token prompt, then decoding to
3,072 tokens, served twice: `sliding_pool=True` (engine/kv_groups.py) and `sliding_pool=False`.
After each step: the blocks in use in each pool. Block counts depend only on the layer types, the
window and the block size, not on the model's width, so the bytes are also given at Gemma 3 1B's
shape (22 sliding and 4 full layers, one KV head of 256, bf16) and Gemma 3 27B's (52 / 10, 16 KV
heads of 128) from the same counts. The two runs' tokens must be equal.

Writes kv_groups.json and kv_groups.png under --out (benchmarks/results) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from benchmarks.common import add_common_args, done, machine, out_dir
from engine import Engine, SamplingParams

WINDOW, BLOCK, PATTERN = 512, 16, 6  # Gemma 3: every sixth layer is full
PROMPT, TOTAL = 1024, 3072
SHAPES = {  # (sliding layers, full layers, KV heads, head dim) of real models, bf16
    "gemma-3-1b": (22, 4, 1, 256),
    "gemma-3-27b": (52, 10, 16, 128),
}


def tiny_gemma3(folder: Path, window: int, layers: int, max_pos: int) -> Path:
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=window,
        layer_types=[
            "full_attention" if (i + 1) % PATTERN == 0 else "sliding_attention" for i in range(layers)
        ],
        max_position_embeddings=max_pos,
        eos_token_id=1,
        bos_token_id=0,
        pad_token_id=0,
    )
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


def serve(folder: Path, pool: bool, prompt: list[int], total: int) -> tuple[list[int], list[dict]]:
    """Greedy tokens and, after each step, {tokens, full, sliding} blocks in use (one pool: all
    under full)."""
    eng = Engine(
        model=str(folder),
        dtype="float32",
        block_size=BLOCK,
        num_kv_blocks=-(-total // BLOCK) + 8,
        max_num_seqs=1,
        num_threads=2,
        sliding_pool=pool,
        preemption_mode="recompute",
    )
    eng.add_request(
        "0", prompt, SamplingParams(max_tokens=total - len(prompt), temperature=0, ignore_eos=True)
    )
    tokens: list[int] = []
    rows = []
    while eng.has_unfinished():
        for o in eng.step():
            tokens += o.new_token_ids
        bm = eng.block_manager
        seqs = eng.scheduler.running
        if not seqs:
            continue
        full, sliding = (bm.full, bm.sliding) if pool else (bm, None)
        rows.append(
            dict(
                tokens=seqs[0].num_computed_tokens,
                full=full.num_used_blocks,
                sliding=sliding.num_used_blocks if sliding is not None else full.num_used_blocks,
            )
        )
    eng.step()
    assert eng.block_manager.num_used_blocks == 0, "blocks left after the sequence finished"
    return tokens, rows


def gib(row: dict, shape: tuple[int, int, int, int]) -> float:
    n_slide, n_full, kvh, hd = shape
    layer_block = 2 * BLOCK * kvh * hd * 2  # bytes of one layer's K and V for one block, bf16
    return (row["full"] * n_full + row["sliding"] * n_slide) * layer_block / 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    args = ap.parse_args()
    out = out_dir(args, "kv_groups")
    window, prompt_len, total, layers = (
        (16, 40, 160, PATTERN) if args.smoke else (WINDOW, PROMPT, TOTAL, PATTERN)
    )
    prompt = [(7 * i + 3) % 250 + 2 for i in range(prompt_len)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_gemma3(Path(tmp), window, layers, total + 64)
        tokens, pooled = serve(folder, True, prompt, total)
        same, one = serve(folder, False, prompt, total)
    assert tokens == same, "the two pools' tokens differ from one pool's"
    bound = -(-window // BLOCK) + 1
    report = dict(
        model=dict(family="gemma3_text", layers=layers, pattern=PATTERN, window=window, block_size=BLOCK),
        prompt_tokens=prompt_len,
        total_tokens=total,
        tokens_equal=True,
        sliding_bound_blocks=bound,
        two_pools=pooled,
        one_pool=one,
        gib_at={
            name: dict(two_pools=gib(pooled[-1], s), one_pool=gib(one[-1], s)) for name, s in SHAPES.items()
        },
        machine=machine(),
    )
    (out / "kv_groups.json").write_text(json.dumps(report, indent=2))
    print("| tokens | one pool: blocks | two pools: full | two pools: sliding |")
    print("|---:|---:|---:|---:|")
    one_by = {r["tokens"]: r for r in one}
    shown = set()
    for target in range(0, total + 1, total // 6):  # the first row at or past each sixth
        row = next((r for r in pooled if r["tokens"] >= target and r["tokens"] in one_by), None)
        if row is not None and row["tokens"] not in shown:
            shown.add(row["tokens"])
            t = row["tokens"]
            print(f"| {t} | {one_by[t]['full']} | {row['full']} | {row['sliding']} |")
    for name, g in report["gib_at"].items():
        print(
            f"{name} at {total} tokens: {g['one_pool']:.3f} GiB one pool, {g['two_pools']:.3f} GiB two pools"
        )
    plot(pooled, one, bound, out / "kv_groups.png", window)
    done(out)


def plot(pooled: list[dict], one: list[dict], bound: int, path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([r["tokens"] for r in one], [r["full"] for r in one], label="one pool (every layer)")
    ax.plot([r["tokens"] for r in pooled], [r["full"] for r in pooled], "--", label="two pools: full layers")
    ax.plot([r["tokens"] for r in pooled], [r["sliding"] for r in pooled], label="two pools: sliding layers")
    ax.axhline(bound, color="grey", lw=0.8, ls=":", label=f"ceil(window / block) + 1 = {bound}")
    ax.set_xlabel("tokens in the sequence")
    ax.set_ylabel("KV blocks in use (per pool)")
    ax.set_title(f"Gemma 3 pattern (5 sliding : 1 full), window {window}, {BLOCK}-token blocks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
