"""One listening socket per uvicorn worker process, so that the kernel spreads connections evenly over them.

uvicorn's supervisor binds one socket and hands every worker a copy: all workers accept from one queue, and the
worker that wakes first takes the connections waiting there (each worker takes a burst at once:
servers/asgi/accept.py). A client that opens its connections in a burst (a pool, a load balancer, wrk) can put all
of them on one worker while the others idle (sync met the same with gunicorn: servers/sync/balance.py). Where
Linux's `SO_REUSEPORT` is there, the socket the supervisor hands out is a `ReusePortListener` instead: bound in the
supervisor (which keeps the port and never listens, so it takes no connection), it is not copied to a worker but
bound again there, to the same address, as a socket of the worker's own. The kernel then picks a listening socket
for each new connection by a hash of its addresses. A worker that dies takes its queue with it (connections not yet
accepted are reset, as on any worker's crash); the supervisor's replacement binds its own. Other systems keep the
shared socket: macOS accepts the option but gives every connection to one socket.

The same was proposed for uvicorn itself (Kludex/uvicorn#2472, open) and done by SkyPilot (skypilot#10016).
"""

from __future__ import annotations

import socket
import sys
from typing import Any

from twinserve.servers.asgi.accept import listen_on

__all__ = ["ReusePortListener", "balanced_listener"]


class ReusePortListener(socket.socket):
    """A bound TCP socket with `SO_REUSEPORT` that, pickled to a spawned process, is bound there anew to the same
    address rather than passed on (see the module)."""

    def __reduce__(self) -> tuple[Any, ...]:
        host, port = self.getsockname()[:2]
        return _bound, (self.family, host, port)


def _bound(family: int, host: str, port: int) -> socket.socket:
    """A new `SO_REUSEPORT` socket bound to (host, port): one more listener of the group (uvicorn listens on it, and
    this worker accepts a burst from it at once: servers/asgi/accept.py)."""
    return listen_on(_bind(socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP), host, port))


def _bind(sock: socket.socket, host: str, port: int) -> socket.socket:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def balanced_listener(host: str, port: int) -> ReusePortListener | None:
    """The supervisor's socket for several workers, bound (port 0: the kernel's choice), not listening; None where
    the kernel does not spread connections over `SO_REUSEPORT` sockets (not Linux). An address in use raises
    OSError, as uvicorn's own bind would."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "SO_REUSEPORT"):
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = ReusePortListener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    _bind(listener, host, port)
    return listener
