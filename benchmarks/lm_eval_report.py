"""The report of benchmarks.lm_eval: the two runs compared request by request (loglikelihoods
within TOLERANCE, accuracies, generations), printed as a table and drawn as lm_eval.png."""

from __future__ import annotations

from pathlib import Path

from benchmarks import lm_eval_scoring as scoring

TOLERANCE = 1e-3  # the largest |loglikelihood difference| between fairlane and the reference


def compare(fairlane: dict, reference: dict) -> dict:
    mc_docs = scoring.read_jsonl(scoring.MC_FILE)
    gen_docs = scoring.read_jsonl(scoring.GEN_FILE)
    keys = sorted(reference["logliks"])
    assert sorted(fairlane["logliks"]) == keys, "the two runs scored different requests"
    items = [
        {
            "doc_id": i,
            "choice": j,
            "continuation": mc_docs[i]["choices"][j],
            "fairlane": fairlane["logliks"][i, j],
            "reference": reference["logliks"][i, j],
            "abs_diff": abs(fairlane["logliks"][i, j] - reference["logliks"][i, j]),
            "greedy_agree": fairlane["greedy"][i, j] == reference["greedy"][i, j],
        }
        for i, j in keys
    ]
    diffs = [x["abs_diff"] for x in items]
    generations = [
        {
            "doc_id": i,
            "target": gen_docs[i]["capital"],
            "fairlane": fairlane["generations"][i],
            "reference": reference["generations"][i],
        }
        for i in sorted(reference["generations"])
    ]
    return {
        "loglikelihood": {
            "requests": len(items),
            "items_scored": len({i for i, _ in keys}),
            "max_abs_diff": max(diffs),
            "mean_abs_diff": sum(diffs) / len(diffs),
            "within_tolerance": max(diffs) <= TOLERANCE,
            "is_greedy_agree": sum(x["greedy_agree"] for x in items),
        },
        "accuracy": {
            "fairlane": fairlane["accuracy"],
            "reference": reference["accuracy"],
            "equal": fairlane["accuracy"] == reference["accuracy"],
        },
        "generate_until": {
            "items": len(generations),
            "exact_match": {"fairlane": fairlane["exact_match"], "reference": reference["exact_match"]},
            "same_text": sum(g["fairlane"] == g["reference"] for g in generations),
            "generations": generations,
        },
        "items": items,
    }


def setup_fields(setup: dict, fairlane: dict, reference: dict) -> dict:
    return {
        "runs": {
            side: {"what": setup[side], "seconds": round(run["seconds"], 1), "command": run["command"]}
            for side, run in (("fairlane", fairlane), ("reference", reference))
        }
    }


def print_table(report: dict) -> None:
    ll, acc, gen = report["loglikelihood"], report["accuracy"], report["generate_until"]
    print(
        f"\n{report['model']} ({report['dtype']}), {report['mode']}: {ll['requests']} loglikelihood requests "
        f"over {ll['items_scored']} items; max |diff| {ll['max_abs_diff']:.2e} "
        f"(mean {ll['mean_abs_diff']:.2e}, tolerance {report['tolerance']:.0e})"
    )
    print("| run | acc | acc_norm | capitals exact_match | seconds |")
    print("|---|---:|---:|---:|---:|")
    for side in ("fairlane", "reference"):
        print(
            f"| {report['runs'][side]['what']} | {acc[side]['acc']:.4f} | {acc[side]['acc_norm']:.4f} "
            f"| {gen['exact_match'][side]:.4f} | {report['runs'][side]['seconds']} |"
        )
    print(
        f"generations identical: {gen['same_text']}/{gen['items']}; "
        f"is_greedy agrees: {ll['is_greedy_agree']}/{ll['requests']}"
    )


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = report["items"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    floor = 1e-9  # an exact match drawn on the log axis
    left.scatter(range(len(items)), [max(x["abs_diff"], floor) for x in items], s=8, color="#e63")
    left.axhline(
        report["tolerance"], color="#555", linestyle="--", label=f"tolerance {report['tolerance']:.0e}"
    )
    left.set_yscale("log")
    left.set_xlabel("request (item x choice)")
    left.set_ylabel("|loglikelihood fairlane - reference|\n(equal: drawn at 1e-9)")
    left.set_title(
        f"{report['model']} fp32, {report['mode']}: max {report['loglikelihood']['max_abs_diff']:.1e}"
    )
    left.legend(loc="upper right")
    acc, gen = report["accuracy"], report["generate_until"]["exact_match"]
    for k, (side, color) in enumerate((("fairlane", "#e63"), ("reference", "#69c"))):
        values = [acc[side]["acc"], acc[side]["acc_norm"], gen[side]]
        bars = right.bar(
            [m + k * 0.4 for m in range(3)],
            values,
            width=0.4,
            color=color,
            label=report["runs"][side]["what"].split(" (")[0],
        )
        right.bar_label(bars, fmt="%.3f", fontsize=8)
    right.set_xticks([m + 0.2 for m in range(3)], ["mc acc", "mc acc_norm", "capitals\nexact_match"])
    right.set_ylim(0, 1.15)
    right.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
