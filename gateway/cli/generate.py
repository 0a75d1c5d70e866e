"""`fairlane generate`: offline batch generation from a JSONL file, resumable.

Each input line is a JSON object with an "id" (default: its line number) and one of "prompt"
(text), "messages" (chat) or "prompt_token_ids", plus optional fields of the engine's
SamplingParams (max_tokens, temperature, top_p, top_k, seed, stop, stop_token_ids, ignore_eos).
Each output line carries the id and either the completion or an "error". Lines are appended as
requests finish, so a run that is interrupted loses nothing: running it again skips every id
already in the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from engine import SamplingParams

SAMPLING_FIELDS = tuple(
    field.name for field in dataclasses.fields(SamplingParams)
)  # a line may set any of them


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, type=Path, help="JSONL file of requests")
    p.add_argument("--output", required=True, type=Path, help="JSONL file of results (appended; resumable)")
    p.add_argument("--model", default="smollm2", help='"smollm2", a HF folder, a .gguf file or "dummy"')
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=128, help="default max_tokens for lines without one")
    p.add_argument("--temperature", type=float, default=0.0, help="default temperature (0 = greedy)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def read_requests(path: Path) -> list[tuple[str, dict | None, str | None]]:
    """(id, request, parse error) per non-empty line."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("each line must be a JSON object")
        except ValueError as e:
            rows.append((f"line-{n}", None, f"line {n}: invalid JSON: {e}"))
            continue
        rows.append((str(obj.get("id", f"line-{n}")), obj, None))
    return rows


def done_ids(path: Path) -> set[str]:
    if not path.exists():
        return set()
    ids = set()
    for line in path.read_text().splitlines():
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from an interrupted run is simply redone
    return ids


def main(args: argparse.Namespace) -> int:
    from engine import LLM, EngineError  # loads torch: only when generating

    rows = [r for r in read_requests(args.input) if r[0] not in done_ids(args.output)]
    if not rows:
        print(f"nothing to do: every id in {args.input} is already in {args.output}", file=sys.stderr)
        return 0
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        num_threads=args.threads,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_gib=args.kv_cache_gib,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    errors = 0
    with args.output.open("a") as out:

        def write(record: dict) -> None:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()

        ids, prompts, params = [], [], []
        for rid, req, err in rows:
            try:
                if err:
                    raise ValueError(err)
                fields = {k: req[k] for k in SAMPLING_FIELDS if k in req}
                fields.setdefault("max_tokens", args.max_tokens)
                fields.setdefault("temperature", args.temperature)
                p = SamplingParams(**fields)
                prompt = next((req[k] for k in ("prompt", "messages", "prompt_token_ids") if k in req), None)
                if prompt is None:
                    raise ValueError('a request needs "prompt", "messages" or "prompt_token_ids"')
                llm.engine.validate(llm.encode(prompt), p)
            except (EngineError, ValueError, TypeError) as e:
                errors += 1
                write({"id": rid, "error": {"message": str(e), "param": getattr(e, "param", None)}})
                continue
            ids.append(rid)
            prompts.append(prompt)
            params.append(p)

        def on_finish(i, c) -> None:
            write(
                {
                    "id": ids[i],
                    "text": c.text,
                    "finish_reason": c.finish_reason,
                    "token_ids": c.token_ids,
                    "usage": {
                        "prompt_tokens": len(c.prompt_token_ids),
                        "completion_tokens": len(c.token_ids),
                    },
                }
            )

        if prompts:
            llm.generate(prompts, params, use_tqdm=not args.no_progress, on_finish=on_finish)
    print(f"wrote {len(prompts)} results and {errors} errors to {args.output}", file=sys.stderr)
    return 1 if errors else 0
