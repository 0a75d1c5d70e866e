"""Named errors a client can meet, each mapped to one HTTP status and the OpenAI error body.

Every error response of the gateway leaves through here:
``{"error": {"message", "type", "param", "code"}}``. Validation failures are described in our
own words (the field path and what was wrong), never as pydantic's internals.
"""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tenancy import ConflictError, NotFoundError, TenancyError

log = logging.getLogger(__name__)


class GatewayError(Exception):
    """Base: subclasses fix the HTTP status and OpenAI error type."""

    status_code = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
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


class RateLimited(GatewayError):
    status_code, error_type, code = 429, "rate_limit_error", "rate_limit_exceeded"


class ServiceUnavailable(GatewayError):
    status_code, error_type, code = 503, "server_error", "service_unavailable"


class SLOUnattainable(ServiceUnavailable):
    """503: the request cannot meet its time-to-first-token target now, so it was refused before it
    started (never a late answer); ``retry-after`` says when the backlog should allow it."""

    code = "slo_unattainable"

    def __init__(self, message: str, *, retry_after_s: float, headers: dict[str, str] | None = None) -> None:
        self.retry_after_s = max(1, math.ceil(retry_after_s))
        super().__init__(message, headers={**(headers or {}), "retry-after": str(self.retry_after_s)})


class GatewayTimeout(GatewayError):
    status_code, error_type, code = 504, "server_error", "timeout"


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(error: GatewayError) -> JSONResponse:
    body = error_body(error.message, error.error_type, error.param, error.code)
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


def _describe_validation(exc: RequestValidationError) -> GatewayError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind in ("json_invalid", "json_type"):
        return InvalidRequest("We could not parse the JSON body of your request.", code="invalid_json")
    if kind == "missing":
        message = f"Missing required parameter: '{param}'."
    elif kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: '{param}'."
    else:
        # pydantic's msg is one plain sentence ("Input should be a valid integer"); keep only that.
        detail = str(first.get("msg", "invalid value")).split("\n")[0]
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
            error = InvalidRequest(str(exc.detail)) if exc.status_code < 500 else GatewayError(str(exc.detail))
            error.status_code = exc.status_code
        else:
            error = cls(str(exc.detail) if exc.status_code != 404 else "Not found.")
        return error_response(error)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def _redis_down(_request: Request, exc: Exception) -> JSONResponse:
        log.error("redis unavailable: %s", exc)
        return error_response(ServiceUnavailable("The request queue is unavailable; retry shortly.",
                                                 headers={"retry-after": "2"}))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(GatewayError("The server had an error while processing your request."))
