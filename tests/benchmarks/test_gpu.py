"""benchmarks/gpu.py's loop logic on the CPU: `--dry-run` runs the decode grid of a real run
(batches 1-128, contexts 512/4096 and the 8192-token prefill budget scaled down together, 32 timed
steps), so a grid cell that would time no step on an H100 fails here first."""

from __future__ import annotations

from benchmarks import gpu


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
