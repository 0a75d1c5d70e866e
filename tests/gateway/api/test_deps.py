"""The OpenAI routes' dependencies run on the event loop: FastAPI hands a plain ``def`` dependency
to its thread pool on every request (a thread wake-up and a hand-back for an attribute read)."""

from __future__ import annotations

import inspect

import pytest
from fastapi.routing import APIRoute

from gateway.api.routes import completions, models

OPENAI_ROUTES = [r for r in (*completions.router.routes, *models.router.routes) if isinstance(r, APIRoute)]


def _dependencies(dependant):
    for sub in dependant.dependencies:
        yield sub
        yield from _dependencies(sub)


def _runs_on_the_loop(call) -> bool:
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(type(call).__call__)


@pytest.mark.parametrize("route", OPENAI_ROUTES, ids=lambda r: r.path)
def test_no_dependency_of_an_openai_route_goes_to_the_thread_pool(route):
    calls = [sub.call for sub in _dependencies(route.dependant)]
    assert calls  # the route has dependencies to check
    blocking = [getattr(c, "__qualname__", repr(c)) for c in calls if not _runs_on_the_loop(c)]
    assert blocking == [], f"{route.path}: {blocking} run in the thread pool"
