"""A StructuredSpec as an xgrammar Grammar, and the check that refuses what xgrammar refuses.

JSON output is compact (``any_whitespace=False``: xgrammar's default separators, no free
whitespace): a small model allowed free whitespace can spend its whole max_tokens on newlines.
A json_schema is strict (properties and items not in the schema are not generated); json_object
is any JSON object."""

from __future__ import annotations

import json

import xgrammar as xgr

from engine.errors import InvalidRequestError
from engine.structured.spec import StructuredSpec
from engine.structured.unenforced import unenforced_keyword

ANY_OBJECT = '{"type": "object"}'


def to_grammar(spec: StructuredSpec) -> xgr.Grammar:
    """The spec's grammar (a few ms at most, no tokenizer). InvalidRequestError naming xgrammar's
    reason when it refuses the schema, pattern or grammar, or naming a schema keyword it would
    accept and not enforce (engine/structured/unenforced.py)."""
    if spec.kind == "json_schema":
        found = unenforced_keyword(json.loads(spec.value))
        if found:
            raise InvalidRequestError(
                f"invalid JSON schema: {found} is not supported: the output could not be held to it",
                param=spec.param,
            )
    try:
        if spec.kind == "json_object":
            return xgr.Grammar.from_json_schema(ANY_OBJECT, any_whitespace=False, strict_mode=False)
        if spec.kind == "json_schema":
            return xgr.Grammar.from_json_schema(spec.value, any_whitespace=False, strict_mode=True)
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.value)
        return xgr.Grammar.from_ebnf(spec.value, root_rule_name="root")
    except (RuntimeError, ValueError, TypeError) as exc:
        what = {"json_schema": "JSON schema", "regex": "regex", "grammar": "grammar"}.get(
            spec.kind, spec.kind
        )
        raise InvalidRequestError(f"invalid {what}: {_reason(exc)}", param=spec.param) from None


def check(spec: StructuredSpec) -> None:
    """Raise InvalidRequestError if xgrammar refuses the spec."""
    to_grammar(spec)


def _reason(exc: Exception) -> str:
    """xgrammar's message without its C++ source location: '[time] /project/cpp/x.cc:12: Reason'."""
    text = str(exc).strip()
    head, sep, tail = text.partition(".cc:")
    if sep:
        text = tail.split(":", 1)[-1].strip() if ":" in tail else tail
    return text.splitlines()[0] if text else type(exc).__name__
