"""Named errors a client can meet, each mapped to one HTTP status and the OpenAI error body.

Every error response of the gateway leaves through here:
``{"error": {"message", "type", "param", "code"}}``. Validation failures are described in our
own words (the field path and what was wrong), never as pydantic's internals.
"""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import EngineError, ErrorCode
from tenancy import ConflictError, NotFoundError, TenancyError

log = logging.getLogger(__name__)
SLO_UNATTAINABLE = ErrorCode.SLO_UNATTAINABLE.value  # the code of a request refused for its TTFT target
INVALID_JSON = "We could not parse the JSON body of your request."
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a response nobody is listening to any more
NO_WORKER_RETRY_S = 5  # retry-after when no worker serves the model (workers start in seconds)
REDIS_DOWN_RETRY_S = 2  # retry-after when the lanes' Redis does not answer


class GatewayError(Exception):
    """Base: subclasses fix the HTTP status and OpenAI error type."""

    status_code = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.code
        self.headers = headers or {}


class InvalidRequest(GatewayError):
    status_code, error_type, code = 400, "invalid_request_error", "invalid_request"


class AuthenticationFailed(GatewayError):
    status_code, error_type, code = 401, "authentication_error", "invalid_api_key"


class PermissionDenied(GatewayError):
    status_code, error_type, code = 403, "permission_error", "permission_denied"


class NotFound(GatewayError):
    status_code, error_type, code = 404, "invalid_request_error", "not_found"


class Conflict(GatewayError):
    status_code, error_type, code = 409, "invalid_request_error", "conflict"


class PayloadTooLarge(GatewayError):
    status_code, error_type, code = 413, "invalid_request_error", "payload_too_large"


class UnprocessableEntity(GatewayError):
    status_code, error_type, code = 422, "invalid_request_error", "invalid_value"


class ClientClosedRequest(GatewayError):
    """499: the client left before the response started (nobody reads this error)."""

    status_code, error_type, code = CLIENT_CLOSED_REQUEST, "invalid_request_error", "client_closed_request"


class RateLimited(GatewayError):
    status_code, error_type, code = 429, "rate_limit_error", "rate_limit_exceeded"


class InsufficientQuota(RateLimited):
    """429 for a spent daily or monthly token budget (OpenAI's ``insufficient_quota``)."""

    error_type, code = "insufficient_quota", "insufficient_quota"


class ServiceUnavailable(GatewayError):
    status_code, error_type, code = 503, "server_error", "service_unavailable"


class SLOUnattainable(ServiceUnavailable):
    """503: the request cannot meet its time-to-first-token target now, so it was refused before it
    started (never a late answer); ``retry-after`` says when the backlog should allow it."""

    code = SLO_UNATTAINABLE

    def __init__(self, message: str, *, retry_after_s: float, headers: dict[str, str] | None = None) -> None:
        self.retry_after_s = max(1, math.ceil(retry_after_s))
        super().__init__(message, headers={**(headers or {}), "retry-after": str(self.retry_after_s)})


class GatewayTimeout(GatewayError):
    status_code, error_type, code = 504, "server_error", ErrorCode.TIMEOUT.value


# The messages of errors raised in more than one place, or worth reading side by side.
def refused_by_engine_checks(exc: EngineError, *, prefix: str = "") -> InvalidRequest:
    """400 for a request the engine's own checks refuse (engine/prompt_checks.py, SamplingParams),
    found before anything is charged; ``prefix`` names one prompt of several ("Prompt 1: ")."""
    return InvalidRequest(prefix + exc.message, param=exc.param, code=str(exc.code))


def no_worker(model: str) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"No engine worker is serving {model!r} right now; retry shortly.",
        headers={"retry-after": str(NO_WORKER_RETRY_S)},
    )


def engine_timeout(detail: Exception) -> GatewayTimeout:
    return GatewayTimeout(f"The engine did not answer in time: {detail}.")


def queue_lost(detail: object) -> ServiceUnavailable:
    """503: the lanes' Redis stopped answering, or restarted and lost the request."""
    return ServiceUnavailable(
        f"The request was interrupted: the request queue became unavailable ({detail}). Retry it.",
        code=ErrorCode.INTERRUPTED.value,
        headers={"retry-after": str(REDIS_DOWN_RETRY_S)},
    )


def worker_lost(model: str) -> ServiceUnavailable:
    """503: the worker running the request stopped and no live worker was left to resume it."""
    return ServiceUnavailable(
        f"The engine worker running this request on {model!r} stopped and no other worker took it "
        "over; retry shortly.",
        code=ErrorCode.WORKER_LOST.value,
        headers={"retry-after": str(NO_WORKER_RETRY_S)},
    )


def slo_unattainable(target_s: float, predicted_s: float) -> SLOUnattainable:
    return SLOUnattainable(
        f"This request cannot meet its time-to-first-token target of {target_s:.3g} s right now (predicted "
        f"{predicted_s:.3g} s with the work queued ahead of it), so it was not started; retry later.",
        retry_after_s=predicted_s - target_s,
    )


def quota_unavailable(detail: str, headers: dict[str, str] | None = None) -> ServiceUnavailable:
    return ServiceUnavailable(detail, code="quota_unavailable", headers=headers)


_ERROR_DESCRIPTIONS = {
    400: "Invalid request",
    401: "Missing or invalid API key (on /admin: admin token)",
    403: "Not allowed (tier, disabled tenant)",
    404: "Unknown model, tenant, key or route",
    409: "Conflict (the name is taken)",
    413: "Body too large",
    422: "Invalid field value",
    429: "Rate limit or quota exceeded",
    499: "Client closed the request",
    503: "No worker, queue unavailable, or latency target unattainable",
    504: "The engine did not answer in time",
}


def _error_model():
    """The OpenAI error body as a pydantic model (one class: OpenAPI names it once)."""
    from pydantic import BaseModel

    class ErrorDetail(BaseModel):
        message: str
        type: str
        param: str | None = None
        code: str | None = None

    class ErrorResponse(BaseModel):
        error: ErrorDetail

    return ErrorResponse


_ERROR_MODEL = _error_model()


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """The OpenAPI ``responses`` of the error statuses a route can answer, with the OpenAI body."""
    return {
        status: {"model": _ERROR_MODEL, "description": _ERROR_DESCRIPTIONS[status]} for status in statuses
    }


ERROR_RESPONSES = error_responses(400, 401, 403, 404, 413, 422, 429, 499, 503, 504)  # /v1 generation routes
MODEL_ERROR_RESPONSES = error_responses(401, 403, 404, 422)  # /v1/models
ADMIN_ERROR_RESPONSES = error_responses(400, 401, 404, 409, 413, 422)  # /admin


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(error: GatewayError) -> JSONResponse:
    body = error_body(error.message, error.error_type, error.param, error.code)
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _describe_validation(exc: RequestValidationError) -> GatewayError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    # Union members appear in the path as tags ("function-after[_utf8(), str]", "list[int]", "str"):
    # not fields.
    loc = [
        str(part)
        for part in first.get("loc", ())
        if part not in ("body", "query", "path", "header")
        and not (isinstance(part, str) and ("[" in part or part in _TYPE_TAGS))
    ]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind in ("json_invalid", "json_type") or (kind == "missing" and param is None):  # missing: no body
        return InvalidRequest(INVALID_JSON, code="invalid_json")
    if kind == "missing":
        message = f"Missing required parameter: '{param}'."
    elif kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: '{param}'."
    else:
        # pydantic's msg is one plain sentence ("Input should be a valid integer"); keep only that.
        detail = str(first.get("msg", "invalid value")).split("\n")[0].removeprefix("Value error, ")
        message = f"Invalid value for '{param}': {detail}." if param else f"Invalid request body: {detail}."
    if len(errors) > 1:
        message += f" ({len(errors) - 1} more error(s) in the request.)"
    return UnprocessableEntity(message, param=param)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception the app can raise to the OpenAI error shape."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(_request: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(TenancyError)
    async def _tenancy_error(_request: Request, exc: TenancyError) -> JSONResponse:
        cls = {NotFoundError: NotFound, ConflictError: Conflict}.get(type(exc), UnprocessableEntity)
        return error_response(cls(exc.message, param=exc.param))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        by_status = {404: NotFound, 401: AuthenticationFailed, 403: PermissionDenied, 413: PayloadTooLarge}
        cls = by_status.get(exc.status_code)
        if cls is None:
            error = (
                InvalidRequest(str(exc.detail)) if exc.status_code < 500 else GatewayError(str(exc.detail))
            )
            error.status_code = exc.status_code
        else:
            error = cls(str(exc.detail) if exc.status_code != 404 else "Not found.")
        return error_response(error)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    @app.exception_handler(RedisResponseError)
    async def _redis_down(_request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, RedisAuthenticationError):  # not an outage: it lasts until the URL is fixed
            log.error(
                "redis unavailable: authentication to Redis failed (check the Redis URL's user and "
                "password): %s",
                exc,
            )
        elif isinstance(exc, RedisResponseError):  # e.g. a database number the server does not have
            log.error("redis unavailable: Redis refused a command: %s", exc)
        else:
            log.error("redis unavailable: %s", exc)
        return error_response(
            ServiceUnavailable(
                "The request queue is unavailable; retry shortly.",
                headers={"retry-after": str(REDIS_DOWN_RETRY_S)},
            )
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(GatewayError("The server had an error while processing your request."))
