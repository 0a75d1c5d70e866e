"""Lane message encoding: round trips (the engine's own SamplingParams and SLOLoad inside), versions
and malformed entries."""

from __future__ import annotations

import json

import pytest

from engine import SamplingParams, SLOLoad
from gateway.lanes.messages import LaneRequest, LaneResult, LoadReport, MessageError


def _request() -> LaneRequest:
    return LaneRequest(
        request_id="r1",
        model="m",
        tier="standard",
        tenant="17",
        prompt_token_ids=(1, 2, 3),
        sampling=SamplingParams(max_tokens=4, temperature=0.0, stop=("\n",), stop_token_ids=(7,)),
        weight=2.0,
        ttft_target_s=1.5,
        traceparent="00-abc-def-01",
    )


def test_request_round_trip_through_bytes():
    original = _request()
    fields = {k.encode(): v.encode() for k, v in original.encode().items()}  # as Redis returns them
    decoded = LaneRequest.decode(fields)
    assert decoded == original and isinstance(decoded.sampling, SamplingParams)


def test_sampling_the_engine_refuses_is_a_malformed_entry():
    fields = _request().encode()
    body = json.loads(fields["body"])
    body["sampling"]["top_p"] = 0  # SamplingParams' own check: top_p in (0, 1]
    with pytest.raises(MessageError, match="top_p"):
        LaneRequest.decode({"v": "2", "body": json.dumps(body)})


def test_result_round_trip():
    result = LaneResult(
        request_id="r1",
        token_ids=(5, 6),
        text="hi",
        offset=3,
        done=True,
        finish_reason="stop",
        num_prompt_tokens=3,
        num_output_tokens=5,
        worker="w1",
    )
    assert LaneResult.decode(result.encode()) == result


def test_unknown_version_is_refused():
    fields = _request().encode()
    fields["v"] = "99"
    with pytest.raises(MessageError, match="version 99"):
        LaneRequest.decode(fields)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"v": "2"},
        {"v": "2", "body": "{not json"},
        {"v": "x", "body": "{}"},
        {"v": "2", "body": json.dumps({"request_id": "r"})},
    ],
)
def test_malformed_entries_raise_message_error(fields):
    with pytest.raises(MessageError):
        LaneRequest.decode(fields)


def test_a_results_last_flag_is_read_from_its_encoding_alone():
    assert LaneResult.is_last(LaneResult(request_id="r", token_ids=(1,), done=True).encode())
    assert not LaneResult.is_last(LaneResult(request_id="r", token_ids=(1,)).encode())
    assert not LaneResult.is_last({"v": "2", "body": "{not json"})  # unreadable: not a last result
    assert not LaneResult.is_last({})


def test_unknown_result_kind_is_refused():
    fields = LaneResult(request_id="r").encode()
    body = json.loads(fields["body"])
    body["kind"] = "surprise"
    with pytest.raises(MessageError, match="surprise"):
        LaneResult.decode({"v": "2", "body": json.dumps(body)})


def test_load_report_round_trips_and_refuses_what_it_cannot_read():
    load = SLOLoad(
        step_s=0.01,
        prefill_token_s=2e-4,
        decode_seq_s=1e-3,
        max_num_batched_tokens=512,
        max_num_seqs=64,
        running=3,
        slot_wait_s=0.0,
        waiting_tokens={3: 120, 1: 40},
        tiered=True,
    )
    report = LoadReport(worker="w1", load=load)
    assert LoadReport.decode(report.encode()) == report
    assert LoadReport.decode(report.encode().encode()) == report  # as bytes, the way Redis returns it
    future = json.loads(report.encode())
    future["v"] = 99
    partial = {"v": 1, "body": {"worker": "w", "at": 0, "load": {"step_s": 0.01}}}
    for raw in ("{", json.dumps(future), json.dumps({"v": 1, "body": {"worker": "w"}}), json.dumps(partial)):
        with pytest.raises(MessageError):
            LoadReport.decode(raw)


def test_an_slo_error_result_carries_its_retry_after():
    result = LaneResult(
        request_id="r", kind="error", done=True, error_code="slo_unattainable", retry_after_s=3.0
    )
    assert LaneResult.decode(result.encode()).retry_after_s == 3.0


def test_a_request_with_an_adapter_round_trips_and_a_bad_digest_is_malformed():
    from dataclasses import replace

    from gateway.lanes.messages import LaneAdapter

    original = replace(_request(), lora=LaneAdapter(id=3, name="support-bot", sha256="ab" * 32))
    decoded = LaneRequest.decode(original.encode())
    assert decoded == original and isinstance(decoded.lora, LaneAdapter)
    assert LaneRequest.decode(_request().encode()).lora is None
    for digest in ("../../etc", "AB" * 32, "ab" * 31):
        body = json.loads(original.encode()["body"])
        body["lora"]["sha256"] = digest
        with pytest.raises(MessageError, match="digest"):
            LaneRequest.decode({"v": "2", "body": json.dumps(body)})
