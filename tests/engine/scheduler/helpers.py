"""Hand-built scheduler states for the policy tests: plain Python, no model."""

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.request import SamplingParams, Sequence
from engine.scheduler import Scheduler

_ids = iter(range(10**6))


def make(policy: str, num_blocks=64, block_size=4, clock=None, **cfg) -> Scheduler:
    config = SchedulerConfig(block_size=block_size, watermark=0, policy=policy, **cfg)
    return Scheduler(config, BlockManager(num_blocks, block_size), clock=clock)


def seq(
    rid: str, n: int, *, tenant="default", priority=0, weight=1.0, arrival=None, max_tokens=16, **kw
) -> Sequence:
    base = 1000 * (next(_ids) + 1)
    return Sequence(
        rid,
        list(range(base, base + n)),
        n,
        SamplingParams(max_tokens=max_tokens),
        tenant=tenant,
        priority=priority,
        weight=weight,
        arrival_time=float(next(_ids)) if arrival is None else arrival,
        **kw,
    )


def run_step(s: Scheduler):
    """Pretend the model ran: advance, and append a token to every sequence that sampled."""
    plan = s.schedule()
    samplers = [it.seq for it in plan.scheduled if it.samples]
    s.finish_step(plan)
    for q in samplers:
        q.token_ids.append(7)
    return plan


def ids(items) -> list[str]:
    return [getattr(it, "seq", it).request_id for it in items]
