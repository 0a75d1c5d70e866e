"""Redis key names of the lanes protocol, shared by gateways and workers (the one place they are spelled).

- ``lanes:{model}:{tier}``: one stream per model and tier; workers read it through the consumer
  group ``workers``, ACK and delete an entry when its request finishes (lanes never grow). An
  entry waits until a worker takes it (gateway/worker/take.lua), pending in that worker's list
  from then on; XLEN minus the group's pending count is what waits.
- ``lanes:{model}:{tier}:backlog``: sorted set of the tenants with entries waiting in the lane that
  a worker has read, scored by their virtual counter; ``lanes:{model}:{tier}:backlog:{tenant}``: a
  list of that tenant's waiting entries ("id cost"), oldest first. Under VTC workers take the
  least-served tenant's entry first, so a light tenant never waits behind a heavy tenant's backlog
  (other policies: one list, tenant ``*``, in order).
- ``lanes:{model}:{tier}:vtc``: hash tenant → virtual counter of the lane (the service given, as
  the engine's VTC counts it: the prompt when taken, each output token as published); field ``""``:
  the counter of the tenant served last, where a tenant that idled enters again.
- ``out:{request_id}``: the request's results, written by the worker each step; it expires
  ``result_ttl_s`` after its last write and the gateway deletes it once relayed. A replica reads
  the streams of all its requests in flight with one blocking XREAD (gateway/lanes/result_reader.py).
- ``relay:wake:{uuid}``: one per replica; an XADD to it ends that replica's blocking read when a
  request starts (so its stream joins the read at once); expires a minute after its last wake.
- ``cancel:{request_id}``: set by a gateway whose client went away; workers check it every step.
- ``workers:{model}``: sorted set of worker ids scored by their last heartbeat (unix seconds),
  so a gateway knows whether the model is served; workers prune ids that stopped beating.
- ``model:{model}`` (max_model_len) and ``worker:{model}:{worker_id}`` (KV blocks, the address of its
  early-start inbox; expires).
- ``load:{model}``: hash worker id → ``LoadReport`` (what its SLO-aware engine predicts TTFT
  from), refreshed every ~50 ms by workers whose policy is SLO-aware; read by the door check.
"""

from __future__ import annotations

GROUP = "workers"


def as_text(value: bytes | str) -> str:
    """A key, field or id as Redis returns it (bytes without decode_responses), as text."""
    return value.decode() if isinstance(value, bytes) else value


def lane_key(model: str, tier: str) -> str:
    return f"lanes:{model}:{tier}"


def lane_backlog_key(model: str, tier: str) -> str:
    return f"{lane_key(model, tier)}:backlog"


def lane_tenant_key(model: str, tier: str, tenant: str) -> str:
    """A tenant's waiting entries in its lane's backlog (take.lua spells it itself)."""
    return f"{lane_backlog_key(model, tier)}:{tenant}"


def lane_counters_key(model: str, tier: str) -> str:
    return f"{lane_key(model, tier)}:vtc"


def out_key(request_id: str) -> str:
    return f"out:{request_id}"


def cancel_key(request_id: str) -> str:
    return f"cancel:{request_id}"


def workers_key(model: str) -> str:
    return f"workers:{model}"


def model_info_key(model: str) -> str:
    """Hash written by workers: the model's max_model_len."""
    return f"model:{model}"


def worker_info_key(model: str, worker_id: str) -> str:
    """Hash of one worker's live state (free_blocks, total_blocks, running, live: JSON for the console,
    gateway/worker/live_stats.py; inbox: where early-start hints reach it); expires with the worker."""
    return f"worker:{model}:{worker_id}"


WORKER_LIVE_FIELD = "live"  # the field of a worker's info hash with its live statistics (JSON)
WORKER_INBOX_FIELD = "inbox"  # ... and with the address of its early-start inbox (gateway/lanes/hints.py)


def load_key(model: str) -> str:
    """Hash of the workers' LoadReport messages (field: worker id); see gateway/api/slo_gate.py."""
    return f"load:{model}"


def tier_priorities(tiers: list[str]) -> dict[str, int]:
    """Tier name → the engine's priority number (higher is more important; tiers are highest first)."""
    return {tier: len(tiers) - i for i, tier in enumerate(tiers)}


WORKER_ALIVE_S = 5.0  # a worker that has not beaten for this long is gone
WORKER_FORGOTTEN_S = 10 * WORKER_ALIVE_S  # its id and its published load are removed after this long
