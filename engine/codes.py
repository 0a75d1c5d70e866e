"""The vocabularies both sides of a lane speak: error codes and finish reasons, spelled once.

Plain Python (no torch): the gateway imports these through ``engine``'s public names. Both are
``str`` enums, so a member equals its string on the wire, in JSON and in usage records.
"""

from __future__ import annotations

import enum


class FinishReason(str, enum.Enum):
    """Why a choice ended."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # cancelled (the client went away)
    SLO_UNATTAINABLE = "slo_unattainable"  # refused before it started: it would miss its TTFT target


class ErrorCode(str, enum.Enum):
    """The ``code`` of an error a request can end with, in an OpenAI error body and a lane result."""

    ENGINE_ERROR = "engine_error"  # an engine error without a code of its own
    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    DUPLICATE_REQUEST = "duplicate_request"
    SLO_UNATTAINABLE = "slo_unattainable"  # it cannot meet its TTFT target now (retry after a while)
    MODEL_NOT_FOUND = "model_not_found"  # the model, or the request's adapter, does not exist
    INTERRUPTED = "interrupted"  # the lanes' Redis stopped answering, or lost the request
    TIMEOUT = "timeout"  # no result came back within the wait limit
    WORKER_LOST = "worker_lost"  # the worker running it stopped and no live worker resumed it

    def __str__(self) -> str:
        return self.value
