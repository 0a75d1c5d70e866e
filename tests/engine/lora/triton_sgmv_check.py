"""The Triton SGMV kernels against the torch segment kernel on small shapes, fp32 and bf16; then the
whole engine with lora_kernel="triton" against PEFT on a tiny model. Exits non-zero on a mismatch.
On the CPU run it in a subprocess with TRITON_INTERPRET=1 (set before triton is imported); with
`--device cuda` the kernels run compiled on the GPU and the engine runs there (triton attention,
CUDA graphs on)."""

import os
import sys
import tempfile
from pathlib import Path

DEVICE = "cuda" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cuda" else "cpu"
assert DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from engine.lora.kernels import Segment, make_kernel  # noqa: E402


def compare(dtype, wdtype, tol, shape, segs) -> float:
    """The Triton kernel against the torch kernel in fp32 on the same values (max abs error over
    the max |reference| within `tol`); rows of no segment bit for bit unchanged; a bf16/fp16 model
    with fp32 adapters within one step of its dtype of the torch kernel's (the sum rounded once)."""
    S, R, M, IN, OUT, T = shape
    a = torch.randn(S, R, M, IN).to(wdtype)
    b = torch.randn(S, R, M, OUT).to(wdtype)
    x = torch.randn(T, IN).to(dtype)
    y0 = torch.randn(T, OUT).to(dtype)
    dev = torch.device(DEVICE)
    want, got = y0.float(), y0.clone()
    make_kernel("torch", "cpu").apply(want, x.float(), a.float(), b.float(), segs)
    tri = make_kernel("triton", "cuda")
    out = got.to(dev)
    tri.apply(out, x.to(dev), a.to(dev), b.to(dev), tri.prepare(segs, dev))
    got = out.cpu()
    err = (want - got.float()).abs().max().item()
    assert err <= tol * want.abs().max().item(), (dtype, wdtype, shape, err)
    touched = torch.zeros(T, dtype=torch.bool)
    for s in segs:
        touched[s.start : s.end] = True
    assert torch.equal(got[~touched], y0[~touched]), "rows without adapter changed"
    if wdtype == torch.float32 != dtype:
        same = y0.clone()
        make_kernel("torch", "cpu").apply(same, x, a, b, segs)
        step = torch.finfo(dtype).eps * want.abs()
        assert ((same.float() - got.float()).abs() <= step + 1e-6).all(), "triton and torch disagree"
    return err


def check_kernels() -> None:
    torch.manual_seed(0)
    # (activations and outputs, adapter weights, tolerance): the engine keeps adapters in fp32 for
    # every model dtype; bf16 adapters are checked too (a dot of the model's dtype on both sides)
    cases = (
        (torch.float32, torch.float32, 1e-5),
        (torch.bfloat16, torch.float32, 1e-2),
        (torch.float16, torch.float32, 1e-3),
        (torch.bfloat16, torch.bfloat16, 1e-2),
    )
    # rows 0-4 no adapter; ranks differ; one segment longer than a row block; rows 35-36 none
    segs = [Segment(5, 9, 2, 3), Segment(9, 30, 0, 8), Segment(30, 35, 1, 1)]
    for dtype, wdtype, tol in cases:
        err = compare(dtype, wdtype, tol, (3, 8, 2, 40, 72, 37), segs)  # sizes off the block sizes
        print(f"kernels {dtype} (adapters {wdtype}): max abs err {err:.2e}")


def check_split_k() -> None:
    """Decode-sized steps, whose shrink splits K over several programs a tile: K off the block
    size, several adapters and ranks, rows of no adapter before, between and after."""
    from engine.kernels.variants import VariantLog
    from engine.lora.kernels.triton_sgmv import _shrink

    torch.manual_seed(1)
    segs = [Segment(2, 3, 1, 16), Segment(3, 5, 0, 4), Segment(7, 8, 2, 8)]
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        for in_f in (200, 1000, 4100):
            log = VariantLog()
            try:
                err = compare(dtype, torch.float32, tol, (3, 16, 3, in_f, 72, 10), segs)
                grid, args, kwargs = log.last["_shrink"]
            finally:
                log.close()
            arg = {**dict(zip(_shrink.arg_names, args)), **kwargs}  # one adapter's rows a row block
            splits = grid[0] * grid[1] * grid[2] // (len(segs) * -(-16 * 3 // arg["BLOCK_N"]))
            assert splits > 1, grid  # programs a row x column tile
            print(f"split-K {dtype} in {in_f}: {splits} chunks, max abs err {err:.2e}")


def check_engine(adapters_module_dir: str) -> None:
    sys.path.insert(0, adapters_module_dir)
    from lora_adapters import AdapterRecipe, PeftReference, engine_prefill_logits, make_adapter
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine import Engine

    torch.manual_seed(0)
    root = Path(tempfile.mkdtemp())
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,  # head dim 16: the smallest the triton attention backend takes
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    base = LlamaForCausalLM(cfg).eval()
    base.save_pretrained(root / "base")
    paths = [
        make_adapter(base, AdapterRecipe("a", 4, 8, ("q_proj", "v_proj", "down_proj"), 1, 0.2), root),
        make_adapter(base, AdapterRecipe("b", 2, 2, ("o_proj", "gate_proj", "up_proj"), 2, 0.2), root),
    ]
    prompts = [[3, 4, 5, 6, 7], [8, 9, 10], [11, 12, 13, 14]]
    loras = [str(paths[0]), None, str(paths[1])]
    requests = [(f"r{i}", p, lo) for i, (p, lo) in enumerate(zip(prompts, loras))]
    peft = PeftReference(base, paths)
    for dtype in ("float32", "bfloat16"):
        ours = {}
        for kernel in ("triton", "torch"):
            eng = Engine(
                model=str(root / "base"),
                dtype=dtype,
                max_loras=2,
                max_lora_rank=4,
                lora_kernel=kernel,
                device=DEVICE,
                attention_backend="triton" if DEVICE == "cuda" else "torch",
            )
            ours[kernel] = {k: v.cpu() for k, v in engine_prefill_logits(eng, requests).items()}
        for i, (p, ad) in enumerate(zip(prompts, [paths[0], None, paths[1]])):
            tri = ours["triton"][f"r{i}"]
            if dtype == "float32":
                err = (tri - peft.logits(ad, p)).abs().max().item()
                assert err < 1e-4, (i, err)
            else:  # the torch kernel is PEFT's bf16 arithmetic (tests/engine/lora/test_lora_smollm2.py)
                err = (tri - ours["torch"][f"r{i}"]).abs().max().item()
                assert err < 2e-2 * tri.abs().max().item(), (i, err)
    print("engine with triton LoRA matches PEFT")
    if DEVICE == "cuda":
        check_graph_decodes(root, paths)


def check_graph_decodes(root: Path, paths: list[Path]) -> None:
    """Decode steps with LoRA rows replaying captured CUDA graphs (batches of 3, 2 and 1 rows:
    padding; a third adapter swapped into a slot for the second run) against the engine without
    graphs and PEFT's greedy tokens. On the CPU (a try of this script's logic) the graph path
    runs its static buffers eagerly."""
    from lora_adapters import AdapterRecipe, PeftReference, make_adapter, static_decode_graphs
    from transformers import LlamaForCausalLM

    from engine import LLM, SamplingParams

    base = LlamaForCausalLM.from_pretrained(root / "base", dtype=torch.float32).eval()
    third = make_adapter(base, AdapterRecipe("c", 3, 3, ("k_proj", "down_proj"), 3, 0.3), root)
    peft = PeftReference(base, [*paths, third])
    prompts, max_tokens = [[3, 4, 5, 6, 7], [8, 9, 10], [11, 12, 13, 14]], [7, 3, 5]
    runs = [[paths[0], None, paths[1]], [third, paths[0], None]]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=0) for n in max_tokens]
    for dtype in ("float32", "bfloat16"):
        outs = {}
        for graphs in (True, False):
            llm = LLM(
                model=str(root / "base"),
                dtype=dtype,
                max_loras=2,
                max_lora_rank=4,
                lora_kernel="triton",
                device=DEVICE,
                attention_backend="triton",
                cuda_graphs=graphs,
                cuda_graph_max_batch=4,
            )
            runner = llm.engine.runner
            if DEVICE == "cpu" and graphs:
                runner.graphs = static_decode_graphs(runner)
            assert (runner.graphs is not None and runner.graphs.lora is not None) == graphs
            outs[graphs] = []
            for loras in runs:
                before = runner.graphs.replays if runner.graphs is not None else 0
                got = llm.generate(prompts, params, lora=[None if a is None else str(a) for a in loras])
                outs[graphs].append([(c.token_ids, [lp.logprob for lp in c.logprobs]) for c in got])
                if graphs:  # every step has LoRA rows: every decode step replays a graph
                    assert runner.graphs.replays - before >= max(max_tokens) - 1, runner.graphs.replays
            assert runner.lora.slots.evictions >= 1
        tol = 1e-4 if dtype == "float32" else 2e-2
        for run, loras in enumerate(runs):
            for i, ((tok, lps), (ref_tok, ref_lps)) in enumerate(zip(outs[True][run], outs[False][run])):
                assert tok == ref_tok, (dtype, run, i, tok, ref_tok)
                assert max(abs(a - b) for a, b in zip(lps, ref_lps)) < tol, (dtype, run, i)
                if dtype == "float32":
                    assert tok == peft.greedy(loras[i], prompts[i], max_tokens[i]), (run, i)
    print("graph decodes with LoRA match the eager engine and PEFT")


if __name__ == "__main__":
    check_kernels()
    check_split_k()
    check_engine(sys.argv[1])
    print(f"device {DEVICE}")
