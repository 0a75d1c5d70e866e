"""fairlane_chat_qa's scores of one answer: exact_match (the whole reply, trimmed, equals the answer;
case and punctuation ignored) and contains (the answer appears in the reply as a word of its own)."""

from __future__ import annotations

import re
import string


def _norm(text: str) -> str:
    return re.sub(f"[{re.escape(string.punctuation)}]", "", text.strip().lower()).strip()


def scores(reply: str, answer: str) -> dict[str, int]:
    contains = re.search(rf"(?<![\w]){re.escape(answer.lower())}(?![\w])", reply.lower()) is not None
    return {"exact_match": int(_norm(reply) == _norm(answer)), "contains": int(contains)}


def process_results(doc: dict, results: list[str]) -> dict[str, int]:
    return scores(results[0], doc["answer"])
