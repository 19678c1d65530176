"""One listening socket per uvicorn worker process, so that the kernel spreads connections evenly over them.

uvicorn's supervisor hands every worker a copy of one socket: the worker that wakes first takes the connections
waiting there, so a burst of connections (a pool, a load balancer, wrk) can land on one worker while the others
idle. On Linux the supervisor's socket is a `ReusePortListener` instead: bound in the supervisor (which never
listens on it), it is bound anew to the same address in each worker, and the kernel picks a listening socket for
each new connection by a hash of its addresses. Elsewhere the shared socket stays. The same was proposed for
uvicorn itself (Kludex/uvicorn#2472, open).
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
    """A new `SO_REUSEPORT` socket bound to (host, port): one more listener of the group, which uvicorn listens on
    (and this worker accepts bursts from: servers/asgi/accept.py)."""
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
