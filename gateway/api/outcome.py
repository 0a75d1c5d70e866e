"""How a request ended on the gateway: one ``RequestOutcome`` that quota settlement, the usage
record and telemetry all take (gateway/api/settle.py), so that the three always agree.

Whether the request *ran* decides the money: a request that ran is charged the tokens of the
prompts that ran plus its completion tokens; one that did not is refunded in full and recorded
with 0 tokens. A request that produced a completion token ran, whatever else happened to it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine import ErrorCode


class Status(enum.Enum):
    """Every way a request can end. ``usage_status`` is the string a usage record and the request
    metrics carry (several statuses share one: both cancellations are "cancelled")."""

    FINISHED = "finished"  # every choice ended (stop, length…): its finish reason is recorded
    CANCELLED_BEFORE_FIRST_TOKEN = "cancelled_before_first_token"  # the client left before a result
    CANCELLED_AFTER_FIRST_TOKEN = "cancelled_after_first_token"  # the client left mid-response
    TIMED_OUT = "timed_out"  # no result within request_timeout_s / stream_idle_timeout_s
    SLO_REFUSED = "slo_refused"  # it could not meet its TTFT target (the door check or the worker)
    WORKER_LOST = "worker_lost"  # its worker stopped and no live worker was left to resume it
    REDIS_LOST = "redis_lost"  # the lanes' Redis stopped answering, or restarted and lost it
    WORKER_REFUSED = "worker_refused"  # the worker refused it (bad input, its adapter deleted)
    ERROR = "error"  # failed in the gateway
    REFUSED = "refused"  # refused before admission (a check, a quota): nothing charged, nothing recorded

    @property
    def usage_status(self) -> str:
        return _USAGE_STATUS.get(self, "error")


_USAGE_STATUS = {
    Status.CANCELLED_BEFORE_FIRST_TOKEN: "cancelled",
    Status.CANCELLED_AFTER_FIRST_TOKEN: "cancelled",
    Status.TIMED_OUT: "timeout",
    Status.SLO_REFUSED: ErrorCode.SLO_UNATTAINABLE.value,
    Status.WORKER_LOST: ErrorCode.WORKER_LOST.value,
    Status.REDIS_LOST: ErrorCode.INTERRUPTED.value,
}
_RUN = (Status.FINISHED, Status.CANCELLED_AFTER_FIRST_TOKEN)  # ran even without a completion token


@dataclass(frozen=True)
class RequestOutcome:
    """A request's end. ``prompt_tokens``: those of the prompts that reached a worker;
    ``finish_reason``: a finished request's (its last choice's); ``error_code``: a refusal's (the
    metrics label of a request refused before admission); ``first_token_at``: monotonic seconds."""

    status: Status
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    error_code: str | None = None
    first_token_at: float | None = None
    quota_settled: bool = False  # the worker settled the quota with the last result (the charge above)
    ran: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ran", self.status in _RUN or self.completion_tokens > 0)

    @property
    def usage_status(self) -> str:
        """The usage record's status: a finished request's finish reason, else its status's."""
        if self.status is Status.FINISHED:
            return self.finish_reason or "unknown"
        if self.status is Status.REFUSED:
            return self.error_code or "refused"
        return self.status.usage_status

    @property
    def charged_prompt_tokens(self) -> int:
        """The prompt tokens charged and recorded: none for a request that did not run."""
        return self.prompt_tokens if self.ran else 0

    @property
    def charged_tokens(self) -> int:
        return self.charged_prompt_tokens + self.completion_tokens
