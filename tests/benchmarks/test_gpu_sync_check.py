"""benchmarks/gpu_sync_check.py runs its mixed steps (the sync checks themselves need CUDA)."""

from benchmarks.gpu_sync_check import run


def test_sync_check_steps_run_on_the_cpu():
    result = run(["--device", "cpu", "--steps", "3"])
    assert result["checked_forwards"] == 3 and result["max_syncs_per_step"] == 0
