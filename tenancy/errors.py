"""Named errors raised by the tenancy services; the gateway maps each to one HTTP status."""

from __future__ import annotations


class TenancyError(Exception):
    """Base class; ``param`` names the offending field when there is one."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class NotFoundError(TenancyError):
    """The tenant, key or record does not exist."""


class ConflictError(TenancyError):
    """A unique name or id is already taken."""


class ValidationError(TenancyError):
    """A value is out of range or inconsistent with the rest of the entity."""
