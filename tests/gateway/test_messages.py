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


def test_worker_load_round_trips_and_refuses_what_it_cannot_read():
    from gateway.messages import WorkerLoad

    load = WorkerLoad(worker="w1", step_s=0.01, prefill_token_s=2e-4, decode_seq_s=1e-3, max_num_batched_tokens=512,
                      max_num_seqs=64, running=3, slot_wait_s=0.0, waiting_tokens={3: 120, 1: 40}, tiered=True)
    assert WorkerLoad.decode(load.encode()) == load
    assert WorkerLoad.decode(load.encode().encode()) == load  # as bytes, the way Redis returns it
    future = json.loads(load.encode())
    future["v"] = 99
    for raw in ("{", json.dumps(future), json.dumps({"v": 1, "body": {"worker": "w"}})):
        with pytest.raises(MessageError):
            WorkerLoad.decode(raw)


def test_an_slo_error_result_carries_its_retry_after():
    result = LaneResult(request_id="r", kind="error", finished=True, error_code="slo_unattainable", retry_after_s=3.0)
    assert LaneResult.decode(result.encode()).retry_after_s == 3.0
