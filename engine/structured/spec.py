"""What a structured request constrains its output to. Plain Python (no xgrammar, no torch): the spec
travels in SamplingParams through the gateway and the lane message; engine/structured/grammar.py
turns it into a grammar."""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.errors import InvalidRequestError

KINDS = ("json_object", "json_schema", "regex", "grammar")
PARAM = "response_format"  # the request field a bad JSON spec is reported against (OpenAI's name)
# The request field of the other kinds: vLLM's extension names, as the gateway takes them.
PARAMS = {"json_object": PARAM, "json_schema": PARAM, "regex": "guided_regex", "grammar": "guided_grammar"}


@dataclass(frozen=True)
class StructuredSpec:
    """A constraint on the output.

    kind: ``json_object`` (any JSON object; ``value`` is empty), ``json_schema`` (``value`` is the
    schema as JSON text), ``regex`` (``value`` is the pattern, matched against the whole output) or
    ``grammar`` (``value`` is an EBNF grammar in xgrammar's GBNF dialect, start rule ``root``).
    Hashable: the compiled grammar is cached by spec. The spec's shape is checked here; whether the
    grammar library accepts the value is checked by the engine (engine.structured.check).
    """

    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(
                f"unknown structured output kind {self.kind!r}; one of {', '.join(KINDS)}", param=PARAM
            )
        param = self.param
        if not isinstance(self.value, str):
            raise InvalidRequestError(
                f"a {self.kind} constraint is text, got {type(self.value).__name__}", param=param
            )
        if self.kind == "json_object" and self.value:
            raise InvalidRequestError("a json_object constraint takes no value", param=param)
        if self.kind != "json_object" and not self.value.strip():
            raise InvalidRequestError(f"the {self.kind} constraint is empty", param=param)
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.value)
            except ValueError as exc:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}", param=param) from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError("a JSON schema is an object (or true/false)", param=param)

    @property
    def param(self) -> str:
        """The request field this constraint came in (response_format, guided_regex, guided_grammar)."""
        return PARAMS[self.kind]

    @classmethod
    def json_schema(cls, schema: dict | bool | str) -> StructuredSpec:
        """A JSON-schema constraint from a schema (a dict, or its JSON text). Property order is kept:
        the output lists properties in the schema's order."""
        return cls(
            "json_schema", schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
        )

    @classmethod
    def coerce(cls, value: object) -> StructuredSpec | None:
        """A spec from itself, None, or its dict form (as a lane message carries it)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            try:
                return cls(**value)
            except TypeError as exc:
                raise InvalidRequestError(f"malformed structured output spec: {exc}", param=PARAM) from None
        raise InvalidRequestError("structured must be a StructuredSpec", param="structured")
