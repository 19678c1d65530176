"""A burst of new connections accepted together, not one per turn of the event loop.

libuv, under uvloop, accepts one connection per turn of its loop and leaves the next to the following turn's poll
(libuv#3696, "don't accept() connections in a loop"). A busy loop turns slowly: beside 500 kept-alive connections
each sending cheap requests, one turn took about 45 ms on two cores, so a burst of new connections waited in the
kernel's accept queue, one taken a turn. Measured 2026-12-05 (async, one worker, 500 wrk connections sending
requests answered 400): 500 connections took 7.5 s to be accepted, and a connection opened 2 s into the crowd had
its first request answered after 4.7-8.1 s, its next ones in 1 ms; sync's poller, which accepts up to 64 a pass,
answered it in 6 ms.

So each connection uvloop accepts takes up to `ACCEPT_BATCH` more from the same listening socket with it, each
handed to the loop through `loop.connect_accepted_socket` (asyncio's documented API) with the same protocol uvicorn
gives its own. The listening sockets are the ones `servers/asgi/server.py` binds in this process (`listen_on`); a
socket handed down by uvicorn's supervisor some other way is left to uvloop alone.
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
