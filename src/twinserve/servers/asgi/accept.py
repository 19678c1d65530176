"""A burst of new connections accepted together, not one per turn of the event loop.

libuv, under uvloop, accepts one connection per turn of its loop (libuv#3696), and a loop busy with a crowd turns
slowly: a new client's connection then waits in the kernel's accept queue behind the crowd's. So each connection
the loop accepts takes up to `ACCEPT_BATCH` more waiting on the same listening socket with it, each handed to the
loop through `loop.connect_accepted_socket` (asyncio's documented API) with the protocol uvicorn gives its own.
Only the listening sockets this process bound (`listen_on`) are read so; any other is left to the loop alone.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

__all__ = ["ACCEPT_BATCH", "accept_waiting", "listen_on"]

logger = logging.getLogger("uvicorn.error")

#: Connections taken from the accept queue with each one uvloop accepts (sync's poller takes 64 a pass).
ACCEPT_BATCH = 64

#: This process's listening sockets (a uvicorn worker has one).
_listening: list[socket.socket] = []


def listen_on(sock: socket.socket) -> socket.socket:
    """Register `sock`, a listening socket this process serves, for `accept_waiting`; returns it."""
    _listening.append(sock)
    return sock


def accept_waiting(loop: asyncio.AbstractEventLoop, protocol: Callable[[], asyncio.Protocol]) -> int:
    """Accept the connections waiting on this process's listening sockets (up to `ACCEPT_BATCH`), each served by a
    new `protocol()`; the number accepted. Called as each connection is made: with nothing waiting it costs one
    `accept` that fails at once."""
    accepted = 0
    for listener in list(_listening):
        if listener.fileno() == -1:  # closed as its server stopped
            _listening.remove(listener)
            continue
        if listener.gettimeout() != 0.0:  # serving: the loop's own accept has it so already
            listener.setblocking(False)
        while accepted < ACCEPT_BATCH:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # out of file descriptors, say: uvloop's own accept goes on
                break
            conn.setblocking(False)
            accepted += 1
            loop.create_task(_serve(loop, protocol, conn))
    return accepted


async def _serve(
    loop: asyncio.AbstractEventLoop, protocol: Callable[[], asyncio.Protocol], conn: socket.socket
) -> None:
    try:
        await loop.connect_accepted_socket(protocol, conn)
    except OSError as exc:  # the client went before the loop took its socket
        logger.debug("an accepted connection could not be served: %s", exc)
        conn.close()
