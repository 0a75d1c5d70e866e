"""Early-start hints on real sockets: what a gateway sends is what a worker's inbox reads, and a send
never blocks or raises (a missing inbox, a full one, an entry too large)."""

from __future__ import annotations

import uuid

import pytest

from gateway.lanes import hints

pytestmark = pytest.mark.skipif(not hints.supported(), reason="abstract Unix sockets: Linux only")


@pytest.fixture
def inbox():
    box = hints.open_inbox()
    assert box is not None
    yield box
    box.close()


def test_a_start_hint_carries_the_entry_byte_for_byte(inbox):
    fields = {"v": "2", "body": '{"request_id":"r1","prompt":"caf\u00e9\\n"}'}
    sender = hints.Sender()
    assert sender.send(inbox.address, hints.start_hint("lanes:m:standard", "r1", fields))
    assert sender.send(inbox.address, hints.drop_hint("r1"))
    start, drop = inbox.receive()
    hint = hints.parse_start(start)
    assert hint == hints.StartHint("lanes:m:standard", "r1", b"2", fields["body"].encode())
    assert hints.parse_drop(start) is None and hints.parse_start(drop) is None
    assert hints.parse_drop(drop) == "r1"
    assert inbox.receive() == []
    sender.close()


def test_a_hint_names_the_gateways_inbox_and_an_echo_carries_a_result_byte_for_byte(inbox):
    entry = {"v": "2", "body": '{"request_id":"r1"}'}
    result = {"v": "2", "body": '{"request_id":"r1","text":"caf\u00e9\\n","done":true}'}
    sender = hints.Sender()
    assert sender.send(inbox.address, hints.start_hint("lanes:m:standard", "r1", entry, "fairlane-gateway-x"))
    assert sender.send(inbox.address, hints.result_echo("r1", 7, result))
    start, echo = inbox.receive()
    assert hints.parse_start(start).reply_to == "fairlane-gateway-x"
    assert hints.parse_echo(echo) == hints.ResultEcho("r1", 7, {b"v": b"2", b"body": result["body"].encode()})
    assert hints.parse_echo(start) is None and hints.parse_start(echo) is None
    sender.close()


def test_malformed_datagrams_are_not_hints():
    assert hints.parse_start(b"Slane-without-fields") is None
    assert hints.parse_start(b"S\xff\nr\n2\n\n{}") is None  # not UTF-8
    assert hints.parse_start(b"X") is None and hints.parse_drop(b"") is None
    assert hints.parse_echo(b"Rr1\nseven\n2\n{}") is None  # no position
    assert hints.parse_echo(b"Rr1\n2") is None


def test_a_missing_inbox_is_not_tried_again_for_a_while():
    sender = hints.Sender()
    gone = f"fairlane-worker-{uuid.uuid4().hex}"
    assert not sender.send(gone, b"Sx")
    assert gone in sender._unreachable
    box = hints.Inbox()
    try:  # an inbox that appears at another address is reached at once
        assert sender.send(box.address, b"Sx") and box.receive() == [b"Sx"]
    finally:
        box.close()


def test_sends_to_a_full_inbox_are_dropped_without_waiting(inbox):
    sender = hints.Sender()
    payload = b"S" + b"x" * 50_000
    sent = sum(sender.send(inbox.address, payload) for _ in range(200))  # far more than the buffer
    assert 0 < sent < 200
    assert len(inbox.receive()) == sent
    assert sender.send(inbox.address, payload)  # read: room again, the address was not given up


def test_an_entry_too_large_for_a_datagram_is_not_hinted(inbox):
    sender = hints.Sender()
    assert not sender.send(inbox.address, b"S" + b"x" * hints.MAX_HINT_BYTES)
    assert inbox.receive() == []
