"""benchmarks/gpu.py's loop logic on the CPU: `--dry-run` runs the decode grid of a real run
(batches 1-128, contexts 512/4096 and the 8192-token prefill budget scaled down together, 32 timed
steps), so a grid cell that would time no step on an H100 fails here first."""

from __future__ import annotations

import torch

from benchmarks import gpu, gpu_report


def test_decode_tokens_outlast_the_last_prefill():
    # batch 128 x context 4096 at 8192 tokens a step: 66 prefill steps, so 36 tokens are too few
    assert gpu.decode_tokens(128, 4096, 32, 8192) >= 32 + 66
    assert gpu.decode_tokens(1, 512, 32, 8192) == 32 + 2 + 4


def test_dry_run_times_every_cell_of_the_real_grid(tmp_path):
    args = gpu.parse_args(["--dry-run", "--out", str(tmp_path)])
    assert args.batches == [1, 8, 32, 64, 128] and args.steps == 32
    assert [c * gpu.DRY_RUN_SCALE for c in args.contexts] == [512, 4096]
    assert args.max_batched_tokens * gpu.DRY_RUN_SCALE == gpu.MAX_BATCHED_TOKENS
    results = gpu.main(["--dry-run", "--parts", "bandwidth,decode", "--out", str(tmp_path)])
    rows = results["models"]["tiny"]["decode"]
    assert [(r["batch"], r["context"]) for r in rows] == [(b, c) for c in args.contexts for b in args.batches]
    for row in rows:
        assert "skipped" not in row and row["step_ms"] > 0, row
    assert (tmp_path / "gpu.json").exists()


def test_no_part_starts_after_the_time_budget(tmp_path):
    assert gpu.parse_args([]).budget_s == gpu.BUDGET_S <= 480  # the default run: within 10 minutes
    assert gpu.parse_args(["--smoke"]).budget_s == 0  # no budget on the CPU runs
    results = gpu.main(["--smoke", "--budget-s", "1e-9", "--out", str(tmp_path)])
    m = results["models"]["tiny"]
    assert m["decode"] and all(r["skipped"].startswith("time budget") for r in m["decode"])
    assert set(m["workload"]) == {"fairlane", "hf_static", "hf_continuous"}
    assert all(w["skipped"].startswith("time budget") for w in m["workload"].values())
    assert m["hf_batch1_static_cache"]["skipped"].startswith("time budget")
    assert "time budget" in gpu_report.table(results)


def test_static_batches_stop_at_the_deadline_and_count_what_ran():
    import time

    from transformers import LlamaConfig

    from benchmarks.gpu_hf import build_hf, hf_static

    hf = build_hf(LlamaConfig(**gpu.SHAPES["tiny"]), torch.float32, torch.device("cpu"))
    prompts, budgets = gpu.workload(6, 512, prompts=(4, 8), outputs=(2, 4))
    whole = hf_static(hf, prompts, budgets, batch_size=2)
    cut = hf_static(hf, prompts, budgets, batch_size=2, deadline=time.monotonic())
    assert whole["requests"] == 6 and cut["requests"] == 2  # the batch under way finishes
    assert cut["output_tokens"] == sum(budgets[:2])
