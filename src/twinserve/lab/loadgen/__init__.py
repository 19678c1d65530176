"""The lab's load generator: closed- or open-loop HTTP/1.1 load on a loopback server, measured honestly.

Closed loop: `concurrency` keep-alive connections, each sending its next request as soon as the last is answered.

Open loop: requests fall due at `rate` per second (Poisson or evenly spaced arrivals) whether or not the server keeps
up, and go out over a pool of connections that grows on demand up to `max_connections`. When the pool is exhausted a
request waits for a free connection, yet its `latency` still counts from the moment it fell due (the
coordinated-omission correction); its `service_time` counts from when a connection took it up.

Only requests that fall due inside the measured window count; those still in flight when it ends may finish, each
within `timeout_s` of falling due, after which it counts as a `timeout` (or, if it never got a connection, as
`unsent`). Event-loop timers tick in milliseconds,
so open-loop latency may carry up to about a millisecond of the scheduler's own slack; service time does not.

The client is a minimal HTTP/1.1 one, so that the generator, one thread, is rarely the limit: a bare asyncio protocol
driven by callbacks, with every request encoded up front, each next request sent from the callback that read the last
response, and responses timed from when the event loop learned they had arrived (`ArrivalClock`) rather than from
when their callback's turn came. When the generator may have been the limit, the result says so (`generator_limited`).

The package owns the entry points, `run_level` and `run_level_sync`; the parts are its modules: `spec` (the
`LoadSpec`), `http` (request encoding, response framing), `connection` (the asyncio protocol and connection slots),
`run` (the closed- and open-loop drivers) and `tally` (the histograms and the `LevelResult`). What a caller needs
of them is re-exported here.
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
