"""``fairlane serve``'s check of ``engine.device`` before anything starts: a device the workers
cannot run on (``cuda`` on a host whose torch sees no CUDA GPU, ``cuda:N`` past the GPUs it sees)
stops serve in one line naming the setting. Without it serve started "healthy" while every worker
died at start and crash-looped.

The check is the engine's own (``engine.device.resolve_device``, what a worker runs at start), in a
child process: the gateway process stays without torch (gateway/cli/torch_free.py). It runs only
when the device names CUDA and serve starts workers (``auto`` and ``cpu`` always resolve; with
``--workers 0`` the workers, and their devices, are on other hosts), and it runs beside the model
check, so a start pays for it only in the time torch takes to import past that check.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from engine.device import resolve_device
try:
    resolve_device(sys.argv[1])
except ValueError as exc:
    print(exc)
    sys.exit(3)
"""
TIMEOUT_S = 120.0  # torch's import and CUDA's initialisation on a busy host


class DeviceProbe:
    """The child process resolving ``device``; ``refusal()`` waits for its answer."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.process = subprocess.Popen(
            [sys.executable, "-c", PROBE, device],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def refusal(self) -> str | None:
        """Why the workers cannot run on the device (one line), or None."""
        try:
            out, err = self.process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None  # not known in time: the workers will say
        if self.process.returncode == 0:
            return None
        lines = (out.strip() or err.strip() or f"exit status {self.process.returncode}").splitlines()
        return (
            f"cannot run the engine on engine.device {self.device!r} (FAIRLANE_ENGINE__DEVICE): "
            f"{lines[-1].strip()}"
        )

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_device_probe(device: str, workers: int) -> DeviceProbe | None:
    """A probe of ``device`` when it needs one (a CUDA device and workers to start here), else None."""
    if workers == 0 or not device.startswith("cuda"):
        return None
    return DeviceProbe(device)
