"""Once every server has started, ``serve`` sets startup's objects aside from the cyclic
collector and collects its young generation less often (``cli.serve._settle_memory``)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import trio

from aggregator.cli import serve


async def test_after_startup_what_it_built_is_frozen_and_the_young_generation_is_larger():
    before = gc.get_threshold()
    hub = SimpleNamespace(startup_done=trio.Event())
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve._settle_memory, hub)
            await trio.sleep(0.01)
            assert gc.get_threshold() == before  # nothing happens before startup is done
            hub.startup_done.set()
        assert gc.get_threshold() == (serve._GC_YOUNG, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
