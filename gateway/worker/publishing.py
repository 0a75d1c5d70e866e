"""The Worker's results: a step's outputs published with the outbox (dropped, refused and aborted
requests), finished entries ACKed, quotas settled, the load refreshed and cancel marks read, in one
MULTI/EXEC (gateway/worker/lane_io.py), and the requests found cancelled aborted."""

from __future__ import annotations

import logging
from dataclasses import replace

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engine import RequestOutput
from gateway.lanes.messages import LaneResult
from gateway.telemetry import path_marks
from gateway.worker.results import output_result

log = logging.getLogger(__name__)
REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


class Publishing:
    """The Worker's publish path; ``_outbox`` and ``_outbox_done`` hold what goes out with the next
    publish besides a step's outputs."""

    _outbox: list[LaneResult]
    _outbox_done: list[tuple[str, str]]  # (lane, entry id) to ACK

    def _publish(self, outputs: list[RequestOutput], *, watch_cancels: bool = True) -> None:
        """Publish a step's outputs and the outbox, ACK what ended, refresh the load, and abort what
        was cancelled (``watch_cancels``): one MULTI/EXEC, and one more for the aborts when there are any."""
        results, done = self._outbox, self._outbox_done
        self._outbox, self._outbox_done = [], []
        served: dict[tuple[str, str], float] = {}  # (lane, tenant) -> output service, VTC-weighted
        settlements: list[tuple[bytes, int]] = []
        echoes: list[tuple[int, str, int]] = []  # (position in results, gateway inbox, position in stream)
        w_out = self.engine.config.vtc_output_weight
        with self.lock:
            for out in outputs:
                running = self.inflight.get(out.request_id)
                if running is None:  # aborted since it was scheduled
                    continue
                if running.trace is not None:
                    running.trace.output(out)
                    if out.done:
                        running.trace.finish(
                            out, status=out.finish_reason or "error", num_output_tokens=out.num_output_tokens
                        )
                offsets = running.offset, running.offset_of(out.index)
                no_text = self.engine.tokenizer is None
                settles = out.done and out.error is None and running.settlement is not None
                if settles:
                    settlements.append((running.settlement, out.num_prompt_tokens + out.num_output_tokens))
                if running.reply_to:  # only its last result is echoed: the relay ends with it
                    if out.done:
                        echoes.append((len(results), running.reply_to, running.published))
                    running.published += 1
                results.append(
                    output_result(self.worker_id, out, *offsets, text_of_ids=no_text, quota_settled=settles)
                )
                running.advance(out.index, len(out.new_token_ids))
                key = (running.lane, running.tenant)
                served[key] = served.get(key, 0.0) + w_out * len(out.new_token_ids) / running.weight
                if out.done:
                    done.append((running.lane, running.entry_id))
                    del self.inflight[out.request_id]
            watched = list(self.inflight) if watch_cancels else []
        path_marks.mark("publish_in")
        try:
            load = self._load()
            cancelled = self.lane_io.publish(
                results,
                done=done,
                load=load,
                watch=watched,
                served=served,
                settlements=settlements,
                echoes=echoes,
            )
        except REDIS_DOWN:
            if watch_cancels:
                raise
            with self.lock:  # their streams may get them twice: positions no longer known, no echoes
                for result in results:
                    if (running := self.inflight.get(result.request_id)) is not None:
                        running.reply_to = ""
            # with the step's own results; their gateways settle what this publish would have
            unsettled = [replace(r, quota_settled=False) if r.quota_settled else r for r in results]
            self._outbox[:0], self._outbox_done[:0] = unsettled, done
            log.warning("a nested step's results wait for the step's publish: Redis is unavailable")
            return
        path_marks.mark("publish_out")
        for request_id, flagged in zip(watched, cancelled):
            if flagged:
                self._cancel(request_id)
        self._flush()

    def _flush(self) -> None:
        """Publish the outbox (dropped, refused and aborted requests) now, in one MULTI/EXEC."""
        if self._outbox or self._outbox_done:
            results, done = self._outbox, self._outbox_done
            self._outbox, self._outbox_done = [], []
            self.lane_io.publish(results, done=done)

    def _cancel(self, request_id: str) -> None:
        """Abort a cancelled request; its last result waits in the outbox."""
        events = self.engine.take_events(request_id)
        self.engine.abort(request_id)  # frees its blocks now
        with self.lock:
            running = self.inflight.pop(request_id)
        if running.trace is not None:
            running.trace.events(events)
            running.trace.aborted()
        self._outbox.append(
            LaneResult(
                request_id=request_id,
                done=True,
                finish_reason="abort",
                offset=running.offset,
                worker=self.worker_id,
            )
        )
        self._outbox_done.append((running.lane, running.entry_id))
