"""serve's check of engine.device (gateway/cli/device_check.py): a CUDA device torch cannot see
started a "healthy" serve whose worker crash-looped; it now stops the start in one line. The check
is the engine's own, in a child process (the gateway process stays without torch)."""

from __future__ import annotations

import pytest
from serve_process import refused_serve

from gateway.cli.device_check import start_device_probe


def _missing_cuda_devices() -> list[str]:
    """Device names no worker can run on here: the GPU past the last one torch sees, and plain
    "cuda" on a host without one."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{count}"] + ([] if count else ["cuda"])


@pytest.mark.parametrize("device", _missing_cuda_devices())
def test_serve_refuses_a_cuda_device_torch_does_not_see_in_one_line(tmp_path, device):
    env = {
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_ENGINE__MODEL": "dummy",
        "FAIRLANE_ENGINE__DEVICE": device,
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'fairlane.db'}",
    }
    output = refused_serve(env)
    assert len(output.strip().splitlines()) == 1, output
    assert output.startswith(
        f"fairlane serve: cannot run the engine on engine.device {device!r} (FAIRLANE_ENGINE__DEVICE): "
    )
    assert "fl-" not in output and not (tmp_path / "fairlane.db").exists()  # nothing started


def test_the_probe_runs_only_for_a_cuda_device_and_workers_here():
    assert start_device_probe("auto", 1) is None and start_device_probe("cpu", 2) is None
    assert start_device_probe("cuda", 0) is None  # gateway only: the workers are elsewhere
    probe = start_device_probe("cuda:9999", 1)
    assert probe is not None and "cuda:9999" in probe.refusal()
