"""The report of benchmarks.lm_eval_parity: each served answer held to the reference's, item by
item and per engine dtype, printed as a table and drawn as lm_eval_parity.png."""

from __future__ import annotations

from pathlib import Path

from benchmarks.lm_eval_tasks.chat_qa_utils import scores

# The served answers of an item: lm-eval's own local-completions request (token ids lm-eval
# rendered and tokenized), and the same prompt sent by the benchmark as text and as token ids.
SIDES = {"lm_eval": "lm-eval local-completions", "text": "text prompt", "ids": "token-id prompt"}


def _score(answers: dict[int, str], items: list[dict]) -> dict[str, float]:
    per = [scores(answers[it["doc_id"]], it["target"]) for it in items]
    return {m: sum(p[m] for p in per) / len(per) for m in ("exact_match", "contains")}


def compare(items: list[dict], runs: dict[str, dict], reference: dict) -> dict:
    ref = reference["answers"]
    per_dtype, summary = {}, []
    for dtype, run in runs.items():
        answers = {side: {i: a["text"] for i, a in run[side].items()} for side in ("text", "ids")}
        if "lm_eval" in run:
            answers["lm_eval"] = run["lm_eval"]["answers"]
        rows = []
        for it in items:
            i = it["doc_id"]
            check = run["prompt_check"][i]
            row = {
                "doc_id": i,
                "question": it["question"],
                "target": it["target"],
                "reference": ref[i],
                **{side: answers[side][i] for side in SIDES if side in answers},
                "equal": {side: answers[side][i] == ref[i] for side in SIDES if side in answers},
                "prompt_tokens": check["tokenizer_ids"],
                "server_prompt_tokens": check["server_prompt_tokens"],
                "prompt_read_as_ids": check["same"],
            }
            if "lm_eval" in run:
                row["lm_eval_prompt_is_ours"] = run["lm_eval"]["prompts"][i] == it["prompt"]
            rows.append(row)
        per_dtype[dtype] = rows
        entry = {
            "dtype": dtype,
            "engine_dtype": run["engine_dtype"],
            "items": len(rows),
            **{f"{side}_equal": sum(r["equal"][side] for r in rows) for side in SIDES if side in answers},
            "prompt_read_as_ids": sum(r["prompt_read_as_ids"] for r in rows),
            "scores": {side: _score(answers[side], items) for side in SIDES if side in answers},
            "replay_seconds": run["replay_seconds"],
        }
        if "lm_eval" in run:
            entry["lm_eval_prompts_are_ours"] = sum(r["lm_eval_prompt_is_ours"] for r in rows)
            entry["lm_eval_scores"] = run["lm_eval"]["scores"]
            entry["lm_eval_seconds"] = run["lm_eval"]["seconds"]
            entry["lm_eval_command"] = run["lm_eval"]["command"]
        summary.append(entry)
    return {
        "reference_scores": _score(ref, items),
        "summary": summary,
        "items": per_dtype,
    }


def print_table(report: dict) -> None:
    ref = report["reference"]
    print(
        f"\n{report['model']}, {report['task']} with the chat template; reference: {ref['what']} "
        f"(exact_match {report['reference_scores']['exact_match']:.2f}, "
        f"contains {report['reference_scores']['contains']:.2f})"
    )
    print("| fairlane dtype (engine) | answers equal to the reference | exact_match | contains |")
    print("|---|---|---:|---:|")
    for s in report["summary"]:
        for side, label in SIDES.items():
            if f"{side}_equal" not in s:
                continue
            sc = s["scores"][side]
            print(
                f"| {s['dtype']} ({s['engine_dtype']}), {label} | {s[f'{side}_equal']}/{s['items']} "
                f"| {sc['exact_match']:.2f} | {sc['contains']:.2f} |"
            )
        print(
            f"| {s['dtype']}: text prompt read as the tokenizer's ids | "
            f"{s['prompt_read_as_ids']}/{s['items']} | | |"
        )


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, equal, totals = [], [], []
    for s in report["summary"]:
        for side, label in SIDES.items():
            if f"{side}_equal" in s:
                labels.append(f"{s['dtype']} ({s['engine_dtype']})\n{label}")
                equal.append(s[f"{side}_equal"])
                totals.append(s["items"])
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(labels) + 1.6))
    fractions = [e / t for e, t in zip(equal, totals)]
    bars = ax.barh(range(len(labels)), fractions, color=["#4a4" if f == 1 else "#e63" for f in fractions])
    ax.bar_label(bars, labels=[f"{e}/{t}" for e, t in zip(equal, totals)], padding=3, fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15)
    ax.set_xlabel(f"answers equal to {report['reference']['what']}")
    ax.set_title(f"{report['model']}\n{report['task']}, lm-eval --apply_chat_template", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
