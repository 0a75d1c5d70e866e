"""Observability shared by fairlane's processes: tracing (OpenTelemetry), metrics (Prometheus),
logs (JSON). Torch-free: a gateway replica imports it. docs/observability.md is the guide."""
