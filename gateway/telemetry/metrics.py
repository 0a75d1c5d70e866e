"""Every Prometheus metric of fairlane, defined once (docs/observability.md says what each tells).

Gateway replicas update the request metrics; engine workers the ``fairlane_engine_*`` and lane
queue metrics. ``fairlane serve`` runs with prometheus_client's multiprocess mode (its
PROMETHEUS_MULTIPROC_DIR, see multiproc.py): each process writes its own files and the gateway's
/metrics merges them, so one scrape covers the gateway and the workers it started. A separately
started worker serves its own /metrics (``worker_metrics_port``). Engine gauges carry a ``worker``
label and are summed over live processes only (``livesum``: a dead worker's gauges go with it,
its counters stay).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

# ---- gateway: requests ---------------------------------------------------------------------------
# "tenant" is the tenant's id with metrics_tenant_label, else "" (Prometheus reads an empty label as
# none): one series per tenant is the operator's choice (cardinality).
REQUESTS = Counter(
    "fairlane_requests",
    "Requests that passed authentication, by outcome: a finish reason "
    "(stop, length), cancelled, or the error code",
    ("tier", "status", "tenant"),
)
PROMPT_TOKENS = Counter(
    "fairlane_prompt_tokens", "Prompt tokens of requests that ran (as billed)", ("tier", "tenant")
)
OUTPUT_TOKENS = Counter(
    "fairlane_output_tokens", "Output tokens relayed to clients (as billed)", ("tier", "tenant")
)
TTFT = Histogram(
    "fairlane_ttft_seconds",
    "Time to first token from arrival at the gateway (lane time included)",
    ("tier",),
    buckets=TTFT_BUCKETS,
)
INTER_TOKEN = Histogram(
    "fairlane_inter_token_latency_seconds",
    "Time between output tokens as relayed (per result chunk, divided by its tokens)",
    ("tier",),
    buckets=ITL_BUCKETS,
)
E2E = Histogram(
    "fairlane_request_duration_seconds",
    "Arrival at the gateway to the last token (or the error)",
    ("tier",),
    buckets=E2E_BUCKETS,
)
QUOTA_REFUSALS = Counter(
    "fairlane_quota_refusals", "Requests refused by a quota, by the limit that refused", ("tier", "limit")
)
QUOTA_SETTLEMENTS = Counter(
    "fairlane_quota_settlements",
    "Admitted requests settled, by usage status and whether they were charged or refunded",
    ("status", "action"),
)
QUOTA_STORE_ERRORS = Counter(
    "fairlane_quota_store_errors",
    "Admissions that could not reach the quota Redis (refused fail-closed, or admitted unchecked fail-open)",
    ("mode",),
)
SHED = Counter(
    "fairlane_gateway_shed",
    "Requests a replica refused at once, overloaded (503 + retry-after, nothing charged), by the bound "
    "they met: admissions in flight, or the Redis connection pool",
    ("reason",),
)
RELAYED_RESULTS = Counter(
    "fairlane_relay_results",
    "Engine results the replica's result reader handed to requests, by the copy that came first: "
    "echo (the worker's datagram on this host, gateway/lanes/hints.py) or redis (the result stream)",
    ("source",),
)

# ---- gateway: the replica's event loop (gateway/telemetry/loop_lag.py) -------------------------------
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
LOOP_LAG = Histogram(
    "fairlane_event_loop_lag_seconds",
    "How late the gateway's event loop woke a task that asked to run (every 10 ms): what it adds to "
    "every request in flight",
    buckets=LAG_BUCKETS,
)
GC_PAUSE = Histogram(
    "fairlane_gc_pause_seconds",
    "Garbage collections of gateway processes, by generation",
    ("generation",),
    buckets=LAG_BUCKETS,
)

# ---- worker: lanes and engine (label worker: the worker id) ------------------------------------------
LANE_QUEUE = Histogram(
    "fairlane_lane_queue_seconds",
    "Time a request waited in its lane before a worker took it",
    ("tier",),
    buckets=QUEUE_BUCKETS,
)
EARLY_STARTS = Counter(
    "fairlane_lane_early_starts",
    "Requests a worker started on a gateway's hint before their lane entry reached it "
    "(gateway/lanes/hints.py), by outcome: bound (the entry came, what the step made was "
    "published) or dropped (aborted, nothing published)",
    ("worker", "outcome"),
)
EARLY_START_DROPPED_TOKENS = Counter(
    "fairlane_lane_early_start_dropped_tokens",
    "Prompt tokens the steps of aborted early starts ran through the model or found in the prefix "
    "cache: engine work (and admissions) no served request accounts for",
    ("worker",),
)
RUNNING = Gauge(
    "fairlane_engine_running_sequences",
    "Sequences in the running batch",
    ("worker",),
    multiprocess_mode="livesum",
)
WAITING = Gauge(
    "fairlane_engine_waiting_sequences",
    "Sequences waiting for admission (swapped ones included)",
    ("worker",),
    multiprocess_mode="livesum",
)
SWAPPED = Gauge(
    "fairlane_engine_swapped_sequences",
    "Waiting sequences whose KV cache is in host memory",
    ("worker",),
    multiprocess_mode="livesum",
)
KV_USED = Gauge(
    "fairlane_engine_kv_blocks_used",
    "KV cache blocks held by sequences",
    ("worker",),
    multiprocess_mode="livesum",
)
KV_FREE = Gauge(
    "fairlane_engine_kv_blocks_free",
    "KV cache blocks free (cached prefix blocks included)",
    ("worker",),
    multiprocess_mode="livesum",
)
KV_UTIL = Gauge(
    "fairlane_engine_kv_utilization",
    "Fraction of KV cache blocks held by sequences (0..1)",
    ("worker",),
    multiprocess_mode="livesum",
)
PREFIX_HITS = Counter(
    "fairlane_engine_prefix_cache_hit_tokens",
    "Prompt tokens taken from the prefix cache instead of computed",
    ("worker",),
)
COMPUTED = Counter(
    "fairlane_engine_computed_tokens",
    "Tokens run through the model: prefill (prompts, recomputation) and decode",
    ("worker", "kind"),
)
PREEMPTIONS = Counter(
    "fairlane_engine_preemptions",
    "Running sequences preempted, by mode (recompute or swap)",
    ("worker", "mode"),
)
ADMISSIONS = Counter(
    "fairlane_engine_admissions",
    "Sequences admitted into the running batch (readmissions "
    "after a preemption included): the preemption rate's denominator",
    ("worker",),
)
SLO_REFUSALS = Counter(
    "fairlane_engine_slo_refusals", "Requests the engine refused for their TTFT target", ("worker",)
)
EXPERTS_TOUCHED = Counter(
    "fairlane_engine_moe_experts_touched",
    "Distinct experts the engine's steps ran, per mixture-of-experts layer, summed over layers and "
    "steps (over fairlane_engine_step_seconds_count: experts run per step)",
    ("worker",),
)
WEIGHT_BYTES = Counter(
    "fairlane_engine_weight_bytes_read",
    "Bytes of model weights the engine's steps read: every dense weight each step, each expert of a "
    "mixture of experts once per step that runs it",
    ("worker",),
)
SPEC_DRAFT_TOKENS = Counter(
    "fairlane_engine_spec_draft_tokens",
    "Draft tokens speculative decoding proposed and the engine verified, by the sequences' tier",
    ("worker", "tier"),
)
SPEC_ACCEPTED_TOKENS = Counter(
    "fairlane_engine_spec_accepted_tokens",
    "Verified draft tokens kept (over fairlane_engine_spec_draft_tokens_total: the acceptance rate), "
    "by the sequences' tier",
    ("worker", "tier"),
)
SPEC_VERIFICATIONS = Counter(
    "fairlane_engine_spec_verifications",
    "Speculating sequences verified, summed over steps (one per sequence and step), by tier",
    ("worker", "tier"),
)
LORA_SLOT_LOADS = Counter(
    "fairlane_engine_lora_slot_loads", "LoRA adapters copied from host memory into a device slot", ("worker",)
)
LORA_SLOT_EVICTIONS = Counter(
    "fairlane_engine_lora_slot_evictions",
    "Resident LoRA adapters replaced in their slot to make room for another",
    ("worker",),
)
BATCH_SIZE = Histogram(
    "fairlane_engine_batch_size", "Sequences per engine step", ("worker",), buckets=BATCH_BUCKETS
)
STEP_TOKENS = Histogram(
    "fairlane_engine_step_tokens", "Tokens per engine step", ("worker",), buckets=TOKEN_BUCKETS
)
STEP_SECONDS = Histogram(
    "fairlane_engine_step_seconds", "Model forward time per engine step", ("worker",), buckets=STEP_BUCKETS
)


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class _Default:
    """This process's own metrics (the default registry), as one collector of a scrape registry."""

    def collect(self):
        return REGISTRY.collect()


def render(*extra) -> bytes:
    """The Prometheus text of every process's metrics (multiprocess mode) or of this one, plus
    ``extra`` collectors (values read at scrape time, e.g. lane depths)."""
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir():
        MultiProcessCollector(registry)
    else:
        registry.register(_Default())
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)
