"""The lab's load generator: closed- or open-loop HTTP/1.1 load on a loopback server, measured honestly.

Closed loop: `concurrency` keep-alive connections, each sending its next request once the last is answered. Open
loop: requests fall due at `rate` per second whether or not the server keeps up, over a pool of connections that
grows up to `max_connections`; a request's `latency` counts from when it fell due (the coordinated-omission
correction), its `service_time` from when a connection took it. Only requests due inside the measured window count;
open-loop latency may carry the event-loop timers' millisecond slack, service time does not.
The client is a minimal callback-driven asyncio protocol so the generator is rarely the limit, and it says so when
it may have been (`generator_limited`). Entry points `run_level` and `run_level_sync`; the parts are re-exported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from twinserve.lab.loadgen.run import LevelRun
from twinserve.lab.loadgen.spec import LoadSpec
from twinserve.lab.loadgen.tally import TRANSPORT_ERROR_KINDS, LevelResult

__all__ = ["TRANSPORT_ERROR_KINDS", "LevelResult", "LoadSpec", "run_level", "run_level_sync"]


async def run_level(spec: LoadSpec) -> LevelResult:
    """Drive one level on the running event loop; returns once the window and its stragglers are done."""
    return await LevelRun(spec).run()


def run_level_sync(spec: LoadSpec) -> LevelResult:
    """`run_level` on an event loop of its own (uvloop when installed)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(run_level(spec))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
