"""The serving GC policy: startup's objects frozen out of collections, undone at shutdown."""

from __future__ import annotations

import gc
import weakref

from gateway.telemetry import gc_policy


def test_freeze_moves_live_objects_out_of_collections_and_thaw_restores():
    before = gc.get_threshold()
    kept = [{"startup": i} for i in range(1000)]  # long-lived containers, as a replica's imports
    previous = gc_policy.freeze()
    try:
        assert previous == before
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold()[0] >= gc_policy.GEN0_THRESHOLD
    finally:
        gc_policy.thaw(previous)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_a_replica_collects_its_young_garbage_before_freezing():
    class Node:
        pass

    young = Node()
    young.me = young  # a cycle: only a collection frees it
    ref = weakref.ref(young)
    del young
    previous = gc_policy.freeze(generation=1)  # as the gateway's lifespan calls it
    try:
        assert ref() is None  # collected, not frozen for the life of the process
    finally:
        gc_policy.thaw(previous)
