"""benchmarks/gpu.py's results as a text table and a PNG (matplotlib, where it is installed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(results: dict) -> str:
    bw = results["copy_bandwidth_Bps"]
    lines = [
        f"{results['device']}, {results['date']}, torch {results['torch']}, {results.get('dtype')}, "
        f"device copy {bw / 1e12:.2f} TB/s (read + write)"
    ]
    for m in results["models"].values():
        if "name" not in m:
            continue
        lines.append(
            f"\n{m['name']}: weights {m['weight_bytes'] / 1e9:.2f} GB, bound at batch 1 "
            f"{m['bound_batch1_ms']:.3f} ms/step ({1e3 / m['bound_batch1_ms']:.0f} tok/s)"
        )
        lines.append("  batch context   step ms  bound ms  of bound   tok/s")
        for r in m["decode"]:
            if "skipped" in r:
                lines.append(f"  {r['batch']:5d} {r['context']:7d}   skipped: {r['skipped']}")
            else:
                lines.append(
                    f"  {r['batch']:5d} {r['context']:7d} {r['step_ms']:9.3f} {r['bound_ms']:9.3f} "
                    f"{r['fraction_of_bound']:9.2f} {r['tokens_per_s']:7.0f}"
                )
        hf1 = m.get("hf_batch1_static_cache")
        if hf1 and ("error" in hf1 or "skipped" in hf1):
            lines.append(f"  HF batch-1 static cache: {hf1.get('error') or 'skipped: ' + hf1['skipped']}")
        elif hf1:
            lines.append(
                f"  HF batch-1 static cache: {hf1['step_ms']:.3f} ms/token ({hf1['tokens_per_s']:.0f} tok/s, "
                f"{hf1['fraction_of_bound']:.2f} of the bound)"
            )
        for system, w in m["workload"].items():
            if "error" in w or "skipped" in w:
                lines.append(f"  workload {system:14s} {w.get('error') or 'skipped: ' + w['skipped']}")
                continue
            lines.append(
                f"  workload {system:14s} {w['requests']:4d} requests {w['output_tokens']:7d} tokens "
                f"{w['seconds']:8.1f} s {w['tokens_per_s']:9.0f} tok/s"
            )
    return "\n".join(lines)


def plot(results: dict, path: Path) -> bool:
    """Decode step time against the bound per batch size (one panel per model and context), and the
    workload's tokens/s per system. False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = [m for m in results["models"].values() if "name" in m]
    if not models:
        return False
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models)), squeeze=False)
    for row, m in zip(axes, models):
        ax = row[0]
        for context in sorted({r["context"] for r in m["decode"]}):
            rows = [r for r in m["decode"] if r["context"] == context and "step_ms" in r]
            if rows:
                b = [r["batch"] for r in rows]
                ax.plot(b, [r["step_ms"] for r in rows], "o-", label=f"fairlane, context {context}")
                ax.plot(b, [r["bound_ms"] for r in rows], "k--", alpha=0.5, label=f"bound, context {context}")
        ax.set(xscale="log", xlabel="batch", ylabel="decode step (ms)", title=f"{m['name']}: decode step")
        ax.legend(fontsize=7)
        ax = row[1]
        systems = [s for s in m["workload"] if "tokens_per_s" in m["workload"][s]]
        ax.bar(systems, [m["workload"][s]["tokens_per_s"] for s in systems], color="tab:blue")
        ax.set(ylabel="output tokens/s", title=f"{m['name']}: workload")
    fig.suptitle(f"{results['device']} ({results['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":  # python3 -m benchmarks.gpu_report results/gpu.json: table and PNG again
    src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results" / "gpu.json")
    res = json.loads(src.read_text())
    print(table(res))
    plot(res, src.with_suffix(".png"))
