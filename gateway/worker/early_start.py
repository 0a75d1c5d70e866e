"""Early starts (gateway/lanes/hints.py): while the worker waits on its lanes, a gateway on its
host hints a request as its admission queues it, and the idle worker runs that request's first
engine step at once. The step is bound to the request's lane entry when the worker's read returns
that entry, byte for byte, and published then; otherwise it is aborted (its blocks freed, its
prompt tokens counted as dropped). Nothing of an early step is published before its entry comes.

``EarlyStarts`` is the part of ``gateway.worker.loop.Worker`` that does this: the Worker keeps the
engine, the in-flight table and the publish these methods use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine import EngineError, RequestOutput
from engine.lora import AdapterNotFoundError
from gateway.lanes import hints
from gateway.lanes.messages import LaneRequest, MessageError
from gateway.telemetry import metrics, path_marks
from gateway.worker.lane_io import LaneEntry

# A hint is acted on only this soon after its request was made (an older one is stale: its entry
# came and went), and only for a prompt of hints.MAX_PROMPT_TOKENS at most.
EARLY_MAX_AGE_S = 0.5
STARTED_REMEMBERED = 4096  # request ids whose hints are known to be stale


@dataclass
class EarlyStart:
    """A hinted request the engine runs before its lane entry reached this worker."""

    lane: str
    version: bytes
    body: bytes
    request: LaneRequest
    taken_at: float  # unix seconds
    reply_to: str = ""  # the hinting gateway's inbox for the request's result echoes
    outputs: list[RequestOutput] = field(default_factory=list)  # its step's, published once it is bound
    prompt_tokens: int = 0  # of its prompt, what its step ran through the model or found cached
    entry: LaneEntry | None = None  # its own entry, once it came


class EarlyStarts:
    """The Worker's early starts; ``_early`` is the one in the engine now, if any."""

    _early: EarlyStart | None
    _started: dict[str, None]  # request ids started on this worker, the last STARTED_REMEMBERED

    def _on_hints(self, payloads: list[bytes]) -> None:
        """Datagrams that reached the inbox while the worker waited on its lanes: the first fresh
        start hint runs its first engine step now (the engine is empty: the worker only waits
        then), a drop hint for it aborts it."""
        path_marks.mark("worker_hint")
        for payload in reversed(payloads):  # the newest first: older ones may be stale
            dropped = hints.parse_drop(payload)
            if dropped is not None:
                if self._early is not None and self._early.request.request_id == dropped:
                    self._drop_early()
                continue
            hint = hints.parse_start(payload)
            if hint is not None and self._early is None and hint.request_id not in self._started:
                self._start_early(hint)

    def _start_early(self, hint: hints.StartHint) -> None:
        if hint.lane not in self.priorities or self.engine.has_unfinished():
            return
        try:
            request = LaneRequest.decode({"v": hint.version, "body": hint.body})
        except MessageError:
            return
        taken_at = time.time()
        waited = taken_at - request.enqueued_at
        if len(request.prompt_token_ids) > hints.MAX_PROMPT_TOKENS or not 0 <= waited < EARLY_MAX_AGE_S:
            return  # a long prefill is not risked on a request that may not come; an old hint is stale
        try:
            self.engine.add(self._engine_request(hint.lane, request, waited))
        except (AdapterNotFoundError, EngineError):
            return  # its entry, when it comes, is refused the usual way
        self._early = EarlyStart(hint.lane, hint.version, hint.body, request, taken_at, hint.reply_to)
        stats = self.engine.stats
        before = stats.prefill_tokens + stats.prefix_hit_tokens
        path_marks.mark("early_step_in")
        self._early.outputs = self.engine.step()  # no interrupt: the lanes' connection is in a read
        path_marks.mark("early_step_out")
        self._early.prompt_tokens = stats.prefill_tokens + stats.prefix_hit_tokens - before

    def _match_early(self, woke: list[LaneEntry]) -> None:
        """Bind the early start to its entry among those that woke the worker (the same request,
        byte for byte), or abort it: its entry did not come with them."""
        early = self._early
        if early is None:
            return
        for entry in woke:
            if (
                not entry.claimed
                and entry.lane == early.lane
                and entry.fields.get(b"body") == early.body
                and entry.fields.get(b"v") == early.version
            ):
                early.entry = entry
                return
        self._drop_early()

    def _drop_early(self) -> None:
        """Abort the early start: nothing of it was published."""
        early, self._early = self._early, None
        if early is not None:
            self.engine.abort(early.request.request_id)  # frees its blocks (False: it had finished)
            metrics.EARLY_STARTS.labels(self.worker_id, "dropped").inc()
            metrics.EARLY_START_DROPPED_TOKENS.labels(self.worker_id).inc(early.prompt_tokens)
            self.metrics.update()

    def _publish_early(self) -> None:
        """Publish what the early start's step produced, now that its entry runs on this worker."""
        early, self._early = self._early, None
        if early is None:
            return
        if early.request.request_id not in self.inflight:  # its entry was not started here
            self._early = early
            self._drop_early()
            return
        metrics.EARLY_STARTS.labels(self.worker_id, "bound").inc()
        self._publish(early.outputs)
        self.metrics.update()  # the step's, once its tokens are out (as after any step)
