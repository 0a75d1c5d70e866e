"""vLLM as one of the systems a benchmark measures in turn: a vllm_runner.py "steps" session in
vLLM's own Python environment (vLLM is never a dependency of fairlane), kept loaded between
measurements so that its ~90 s start is paid once and the systems still take turns.

    with VllmSteps(python, folder, "float32", threads=1, prompts=ids) as vllm:
        ms = vllm.ms_per_step(batch=8, steps=8)
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks.throughput import VLLM_RUNNER

RESULT = "RESULT "  # vllm_runner.py's answer lines; vLLM logs to stdout too


class VllmSteps:
    """A loaded vLLM answering "ms of one decode step of the first `batch` prompts" (stdin/stdout)."""

    def __init__(
        self, python: str, model: Path, dtype: str, threads: int, prompts: list[list[int]], max_model_len: int
    ) -> None:
        self.dtype = dtype
        self.tmp = tempfile.TemporaryDirectory()
        tmp = self.tmp.name
        job = {"model": str(model), "dtype": dtype, "threads": threads, "mode": "steps"}
        job.update(prompts=prompts, max_tokens=[1], ignore_eos=True, max_model_len=max_model_len)
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        env = {
            **os.environ,
            "TMPDIR": tmp,
            "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", f"{tmp}/vllm"),
            "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", f"{tmp}/inductor"),
            # GiB of KV cache vLLM reserves on the CPU: a few short sequences need little
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }
        env.pop("PYTHONPATH", None)
        self.log = open(Path(tmp) / "stderr.log", "w+")  # noqa: SIM115 - read back on failure
        self.proc = subprocess.Popen(
            [python, str(VLLM_RUNNER), str(Path(tmp) / "job.json")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self.ready = False

    def _answer(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT) :])
        self.log.seek(0)
        raise RuntimeError(f"vLLM exited ({self.proc.wait()}): {self.log.read()[-3000:]}")

    def wait_ready(self) -> None:
        """Block until the model is loaded and warmed up (vLLM's start: about 90 s)."""
        if not self.ready:
            self._answer()
            self.ready = True

    def ms_per_step(self, batch: int, steps: int) -> float:
        self.wait_ready()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"batch": batch, "steps": steps}) + "\n")
        self.proc.stdin.flush()
        return self._answer()["ms_per_step"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the runner's loop ends; vLLM shuts down its engine process
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        self.tmp.cleanup()

    def __enter__(self) -> VllmSteps:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
