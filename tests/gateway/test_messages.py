"""Lane message encoding: round trips, versions and malformed entries."""

from __future__ import annotations

import json

import pytest

from gateway.messages import LaneRequest, LaneResult, MessageError, SamplingSpec


def _request() -> LaneRequest:
    return LaneRequest(request_id="r1", model="m", tier="standard", tenant="acme", prompt_token_ids=(1, 2, 3),
                       sampling=SamplingSpec(max_tokens=4, temperature=0.0, stop=("\n",), stop_token_ids=(7,)),
                       weight=2.0, ttft_target_s=1.5, traceparent="00-abc-def-01")


def test_request_round_trip_through_bytes():
    original = _request()
    fields = {k.encode(): v.encode() for k, v in original.encode().items()}  # as Redis returns them
    assert LaneRequest.decode(fields) == original


def test_result_round_trip():
    result = LaneResult(request_id="r1", token_ids=(5, 6), text="hi", offset=3, finished=True, finish_reason="stop",
                        num_prompt_tokens=3, num_output_tokens=5, worker="w1")
    assert LaneResult.decode(result.encode()) == result


def test_unknown_version_is_refused():
    fields = _request().encode()
    fields["v"] = "99"
    with pytest.raises(MessageError, match="version 99"):
        LaneRequest.decode(fields)


@pytest.mark.parametrize("fields", [{}, {"v": "1"}, {"v": "1", "body": "{not json"}, {"v": "x", "body": "{}"},
                                    {"v": "1", "body": json.dumps({"request_id": "r"})}])
def test_malformed_entries_raise_message_error(fields):
    with pytest.raises(MessageError):
        LaneRequest.decode(fields)


def test_unknown_result_kind_is_refused():
    fields = LaneResult(request_id="r").encode()
    body = json.loads(fields["body"])
    body["kind"] = "surprise"
    with pytest.raises(MessageError, match="surprise"):
        LaneResult.decode({"v": "1", "body": json.dumps(body)})
