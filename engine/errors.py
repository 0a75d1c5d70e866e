"""Named errors a caller of the engine can meet. The gateway maps each to one HTTP status."""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""

    code = "engine_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(EngineError, ValueError):
    """The request is malformed or cannot fit the model; raised before anything is scheduled."""

    code = "invalid_request"


class ContextLengthExceededError(InvalidRequestError):
    """Prompt plus max_tokens do not fit the model's context window."""

    code = "context_length_exceeded"


class DuplicateRequestError(InvalidRequestError):
    """A request id that is already running was added again."""

    code = "duplicate_request"


class SLOUnattainableError(EngineError):
    """The request cannot meet its latency target (TTFT) given the work ahead of it; it is refused
    before it starts. The gateway answers 503 with Retry-After: retry_after seconds."""

    code = "slo_unattainable"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float,
        predicted_ttft_s: float | None = None,
        param: str | None = None,
    ):
        super().__init__(message, param=param)
        self.retry_after = retry_after
        self.predicted_ttft_s = predicted_ttft_s
