"""Named errors a caller of the engine can meet. The gateway maps each to one HTTP status."""

from engine.codes import ErrorCode


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""

    code: str = ErrorCode.ENGINE_ERROR

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(EngineError, ValueError):
    """The request is malformed or cannot fit the model; raised before anything is scheduled."""

    code: str = ErrorCode.INVALID_REQUEST


class ContextLengthExceededError(InvalidRequestError):
    """Prompt plus max_tokens do not fit the model's context window."""

    code = ErrorCode.CONTEXT_LENGTH_EXCEEDED


class DuplicateRequestError(InvalidRequestError):
    """A request id that is already running was added again."""

    code = ErrorCode.DUPLICATE_REQUEST


class SLOUnattainableError(EngineError):
    """The request cannot meet its latency target (TTFT) given the work ahead of it; it is refused
    before it starts. The gateway answers 503 with Retry-After: retry_after seconds."""

    code = ErrorCode.SLO_UNATTAINABLE

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
