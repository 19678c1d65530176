"""servers/asgi/accept.py: the connections waiting behind one that uvloop accepted are taken at once."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
import uvloop

from twinserve.servers.asgi import accept

#: The protocols made for the connections accepted.
MADE: list[asyncio.Protocol] = []
#: Set as each one is made (the loop's of the run that waits for them).
ARRIVED: list[asyncio.Event] = []


class Made(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        MADE.append(self)
        for arrived in ARRIVED:
            arrived.set()
        transport.close()


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return accept.listen_on(sock)


def _accept_all() -> list[int]:
    """`accept_waiting` until it finds nothing waiting, then the loop's turns that make the transports."""

    before = list(MADE)

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        counts = [accept.accept_waiting(loop, Made)]
        while counts[-1]:
            counts.append(accept.accept_waiting(loop, Made))
        arrived = asyncio.Event()
        ARRIVED[:] = [arrived]
        try:
            async with asyncio.timeout(5):
                while True:  # each accepted connection's transport, made on the loop
                    arrived.clear()
                    if len(MADE) >= len(before) + sum(counts):
                        return counts
                    await arrived.wait()
        except TimeoutError:
            raise AssertionError("the accepted connections were not served") from None
        finally:
            ARRIVED.clear()

    return uvloop.run(main())


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    MADE.clear()
    sock = _listener()
    yield sock
    sock.close()
    _accept_all()  # a closed listener is dropped as it is found


def test_every_waiting_connection_is_accepted_a_batch_at_a_time(listener: socket.socket) -> None:
    clients = [socket.create_connection(listener.getsockname()) for _ in range(accept.ACCEPT_BATCH + 5)]
    assert _accept_all() == [accept.ACCEPT_BATCH, 5, 0]  # the last: one accept that fails at once
    assert len(MADE) == accept.ACCEPT_BATCH + 5
    for client in clients:
        client.close()


def test_a_listener_closed_by_the_servers_stop_leaves_the_others_accepting(listener: socket.socket) -> None:
    listener.close()  # what uvloop's server does to it as uvicorn stops
    other = _listener()
    client = socket.create_connection(other.getsockname())
    assert _accept_all() == [1, 0]
    client.close()
    other.close()
