"""A structured request's constraint (the engine's StructuredSpec inside SamplingParams) crosses the lane."""

from __future__ import annotations

import json

import pytest

from engine import SamplingParams, StructuredSpec
from gateway.lanes.messages import LaneRequest, MessageError

SCHEMA = {
    "type": "object",
    "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
    "required": ["b", "a"],
}


def _request(spec: StructuredSpec) -> LaneRequest:
    return LaneRequest(
        request_id="r1",
        model="m",
        tier="standard",
        tenant="1",
        prompt_token_ids=(1, 2),
        sampling=SamplingParams(max_tokens=8, structured=spec),
    )


@pytest.mark.parametrize(
    "spec",
    [
        StructuredSpec.json_schema(SCHEMA),
        StructuredSpec("json_object"),
        StructuredSpec("regex", r"\d+"),
        StructuredSpec("grammar", 'root ::= "a"'),
    ],
)
def test_round_trip(spec):
    original = _request(spec)
    fields = {k.encode(): v.encode() for k, v in original.encode().items()}
    decoded = LaneRequest.decode(fields)
    assert decoded == original and isinstance(decoded.sampling.structured, StructuredSpec)
    assert decoded.sampling.structured.value == spec.value  # the schema's text, property order kept


def test_a_malformed_constraint_is_a_malformed_entry():
    body = json.loads(_request(StructuredSpec("regex", "x")).encode()["body"])
    body["sampling"]["structured"] = {"kind": "xml", "value": "<a/>"}
    with pytest.raises(MessageError, match="xml"):
        LaneRequest.decode({"v": "2", "body": json.dumps(body)})
