"""A request's structured-output constraint: OpenAI's ``response_format`` or one of vLLM's
extensions (``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``), as the
engine's StructuredSpec (a choice is a grammar of its literal strings).

Checked here, before tokenizing and before the quota: the fields' shapes (OpenAI's
``json_schema.name`` rule, a schema that is a JSON object). Whether the grammar library accepts the
schema, pattern or grammar is checked by the worker when it takes the request (the gateway loads no
grammar library: xgrammar needs torch); a refusal there is a 400 naming xgrammar's reason, and the
quota is refunded in full.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine import InvalidRequestError, StructuredSpec
from gateway.api.errors import InvalidRequest

SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
FORMAT_TYPES = ("text", "json_object", "json_schema")


def structured_spec(
    *,
    response_format: dict[str, Any] | None,
    guided_json: Any = None,
    guided_regex: str | None = None,
    guided_grammar: str | None = None,
    guided_choice: list[str] | None = None,
) -> StructuredSpec | None:
    """The one constraint a request sets, or None; a 400 naming the field for a malformed one."""
    given = []
    if response_format is not None:
        spec = _response_format(response_format)
        if spec is not None:
            given.append(("response_format", spec))
    if guided_json is not None:
        given.append(
            (
                "guided_json",
                _spec("guided_json", "json_schema", _schema_text(guided_json, "guided_json", text_ok=True)),
            )
        )
    if guided_regex is not None:
        given.append(("guided_regex", _spec("guided_regex", "regex", guided_regex)))
    if guided_grammar is not None:
        given.append(("guided_grammar", _spec("guided_grammar", "grammar", guided_grammar)))
    if guided_choice is not None:
        given.append(("guided_choice", _choice(guided_choice)))
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise InvalidRequest(
            f"Only one output constraint per request: {names} were given.", param=given[1][0]
        )
    return given[0][1] if given else None


def _response_format(rf: dict[str, Any]) -> StructuredSpec | None:
    kind = rf.get("type")
    if kind not in FORMAT_TYPES:
        raise InvalidRequest(
            f"response_format.type must be one of {', '.join(FORMAT_TYPES)}; got {kind!r}.",
            param="response_format.type",
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredSpec("json_object")
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise InvalidRequest(
            "response_format.json_schema must be an object with a name and a schema.",
            param="response_format.json_schema",
        )
    name = js.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise InvalidRequest(
            "response_format.json_schema.name must be 1-64 letters, digits, '_' or '-'.",
            param="response_format.json_schema.name",
        )
    if "strict" in js and js["strict"] is not None and not isinstance(js["strict"], bool):
        raise InvalidRequest(
            "response_format.json_schema.strict must be a boolean.",
            param="response_format.json_schema.strict",
        )
    if "schema" not in js:
        raise InvalidRequest(
            "response_format.json_schema.schema is required.", param="response_format.json_schema.schema"
        )
    text = _schema_text(js["schema"], "response_format.json_schema.schema")
    return _spec("response_format.json_schema.schema", "json_schema", text)


def _choice(choices: list[str]) -> StructuredSpec:
    if not choices or any(not c for c in choices):
        raise InvalidRequest("guided_choice must be a list of non-empty strings.", param="guided_choice")
    # JSON string literals are GBNF string literals (the same escapes), so any text is quoted exactly.
    return StructuredSpec(
        "grammar", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    )


def _schema_text(schema: Any, param: str, *, text_ok: bool = False) -> str:
    if isinstance(schema, str) and text_ok:  # vLLM's guided_json takes the schema as JSON text too
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise InvalidRequest(f"{param} is not valid JSON: {exc}", param=param) from None
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param} must be a JSON Schema object.", param=param)
    return json.dumps(schema, ensure_ascii=False)


def _spec(param: str, kind: str, value: Any) -> StructuredSpec:
    if not isinstance(value, str):
        raise InvalidRequest(f"{param} must be a string.", param=param)
    try:
        return StructuredSpec(kind, value)
    except InvalidRequestError as exc:
        raise InvalidRequest(exc.message, param=param) from None
