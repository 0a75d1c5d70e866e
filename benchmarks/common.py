"""What every benchmark shares: the command-line options `--smoke` and `--out`, where results go,
the tiny model of smoke runs, and the machine's description.

Every benchmark runs as ``python -m benchmarks.NAME``. ``--smoke`` runs the whole script in
seconds on a tiny random-weight model (results in a fresh temporary folder, never in
benchmarks/results/): the test suite runs every benchmark that way.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

# A tiny Llama with SmolLM2's vocabulary: SmolLM2's real tokenizer fits it, and a forward costs
# almost nothing, so what is measured around the engine is not hidden by the model.
# The shape of a dummy Llama (engine.model "dummy" with a dummy_config) small enough to serve in
# seconds on one thread; users add its context (max_position_embeddings).
TINY_DUMMY_SHAPE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
# Its large initialisation makes the logits peaked, so that greedy answers do not depend on the
# batch a request runs in.
PEAKED_DUMMY_CONFIG = {**TINY_DUMMY_SHAPE, "max_position_embeddings": 512, "initializer_range": 0.5}
TINY_CONFIG = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "eos_token_id": 2,
    "bos_token_id": 1,
}


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="run everything in seconds on a tiny random model; results go to a temporary folder",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the JSON and PNG results (default: benchmarks/results, or a "
        "temporary folder with --smoke)",
    )


def out_dir(args: argparse.Namespace, name: str) -> Path:
    """Where this run's results go; created."""
    if args.out is not None:
        path = Path(args.out)
    elif args.smoke:
        path = Path(tempfile.mkdtemp(prefix=f"fairlane-bench-{name}-"))
    else:
        path = RESULTS
    path.mkdir(parents=True, exist_ok=True)
    return path


def tiny_model() -> str:
    """A tiny random-weight Llama with SmolLM2's real tokenizer, as a Hugging Face folder (what
    `Engine`, `LLM` and `fairlane serve` read as a model) kept in the model cache; its path."""
    from engine import assets

    key = hashlib.sha256(json.dumps(TINY_CONFIG, sort_keys=True).encode()).hexdigest()[:8]
    folder = assets.cache_dir() / "models" / f"tiny-llama-smollm2-tokenizer-{key}"
    if not (folder / "config.json").exists():
        from engine.loader import load_dummy, save_model

        tokenizer = assets.load_tokenizer("smollm2")
        assets.save_atomically(
            folder, lambda tmp: save_model(load_dummy(TINY_CONFIG), tmp, tokenizer=tokenizer)
        )
    return str(folder)


# Other families at a real model's shape (its config's shape fields), random weights, SmolLM2's
# tokenizer (its ids fit every vocabulary here): what the benchmarks measure a family by.
FAMILY_SHAPES: dict[str, dict] = {
    "qwen3": {  # Qwen3-0.6B: q/k norms, 16 heads of 128 over hidden 1024, tied 151,936-token head
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "eos_token_id": 2,
        "bos_token_id": 1,
    },
}
# --smoke: the same family, tiny (and SmolLM2's vocabulary)
SMOKE_SHAPE = {k: TINY_CONFIG[k] for k in TINY_CONFIG if k not in ("eos_token_id", "bos_token_id")}


def family_model(family: str, *, smoke: bool = False) -> str:
    """A random-weight Hugging Face folder of `family` at its FAMILY_SHAPES shape (tiny with
    `smoke`), weights stored in bf16 (read in any dtype), with SmolLM2's tokenizer; kept in the model
    cache; its path."""
    from engine import assets

    fields = {**FAMILY_SHAPES[family], **(SMOKE_SHAPE if smoke else {})}
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
    folder = assets.cache_dir() / "models" / f"random-{family}-smollm2-tokenizer-{key}"
    if not (folder / "config.json").exists():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        def write(tmp: Path) -> None:
            torch.manual_seed(0)
            config = AutoConfig.for_model(**fields)
            AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp)
            assets.load_tokenizer("smollm2").save_pretrained(tmp)

        assets.save_atomically(folder, write)
    return str(folder)


def machine() -> dict:
    """The CPU (lscpu's model name, family, model, caches and the ISA extensions the engine's
    paths choose by), cores, Python and the date of the run: "AMD EPYC" alone names Zen 3, 4 and 5."""
    return {
        **cpu_details(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


# The flags `dtype: auto` and the C kernels choose by (engine/device.py, engine/models/*.c).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
LSCPU_FIELDS = {
    "Model name": "cpu",
    "CPU family": "cpu_family",
    "Model": "cpu_model",
    "L2 cache": "l2_cache",
    "L3 cache": "l3_cache",
}


def cpu_details() -> dict:
    """lscpu's fields of LSCPU_FIELDS (the platform's processor name alone where lscpu is missing)
    and the ISA_FLAGS the CPU has, as the engine reads them (engine.device.cpu_flags)."""
    from engine.device import cpu_flags

    flags = cpu_flags()
    found: dict = {"isa": [f for f in ISA_FLAGS if f in flags]}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in LSCPU_FIELDS:
            found.setdefault(LSCPU_FIELDS[key.strip()], value.strip())
    found.setdefault("cpu", platform.processor() or platform.machine())
    return found


def done(path: Path) -> None:
    """The last line of every benchmark: where its results are. The process ends next (its
    interpreter's shutdown then skips collecting every object: gateway/cli/process_exit.py)."""
    from gateway.cli.process_exit import prepare_exit

    print(f"results: {path}", flush=True)
    prepare_exit()


def result_line(stdout: str) -> dict:
    """The JSON result a runner of another environment (benchmarks/external) printed after "RESULT "
    among whatever else its libraries print to stdout."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"no result line in the runner's output: {stdout[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def checkouts(against: list[str]) -> dict[str, Path]:
    """The trees a side-by-side benchmark runs: this one ("this"), then each ``LABEL=PATH`` of its
    ``--against`` options (another checkout, e.g. from `git archive COMMIT | tar -x -C PATH`)."""
    return {"this": RESULTS.parent.parent} | {
        a.split("=", 1)[0]: Path(a.split("=", 1)[1]).resolve() for a in against
    }


def in_checkout(
    tree: Path, script: str, args: list[str], *, env: dict[str, str] | None = None, echo_stderr: bool = False
) -> list[dict]:
    """Run ``script`` (a file of this tree) with ``args`` in a fresh process, with ``tree`` first on
    PYTHONPATH and as its folder, so that it measures that checkout's engine; the JSON objects of
    the lines of its stdout that start with "{". ``echo_stderr``: print the end of its stderr."""
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(script).resolve()), *args]
    out = subprocess.run(cmd, cwd=tree, env=full_env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stderr[-3000:]}")
    if echo_stderr:
        print(out.stderr[-20000:])
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def grouped_bars(ax, groups: list[str], series: dict[str, list[float]], fontsize: int = 7) -> None:
    """One bar per series in each group, side by side on matplotlib axes ``ax``: the groups' names
    under their bars, a legend of the series."""
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([g + i * width for g in range(len(groups))], values, width, label=label)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], groups, fontsize=fontsize)
    ax.legend(fontsize=fontsize)
