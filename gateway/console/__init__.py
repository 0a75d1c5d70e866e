"""The operator's console at /console: server-rendered pages (Jinja2 + htmx, Chart.js), signed in
with the admin token. See docs/console.md."""

from gateway.console.routes import install

__all__ = ["install"]
