"""One client connection of the sync worker, as its poller keeps it (servers/sync/worker.py)."""

from __future__ import annotations

import selectors
import socket
from typing import Any

from twinserve.servers.http1 import Limits
from twinserve.servers.sync.http import RequestReader

__all__ = ["Connection", "pass_order"]


class Connection:
    """One client connection: its socket, what its parser has read, and when the poller gives up on it."""

    __slots__ = ("busy", "deadline", "level", "owed", "peer", "reader", "sock")

    def __init__(self, sock: socket.socket, peer: Any, limits: Limits) -> None:
        self.sock = sock
        self.peer = peer
        self.reader = RequestReader(limits)
        #: When the poller closes it (a head not in, an idle keep-alive) or gives up on its body; 0: none.
        self.deadline = 0.0
        #: The level of its last request: the poller reads connections at higher levels first (`pass_order`).
        self.level = 1
        #: A request thread holds it (its socket is the thread's until it hands it back).
        self.busy = False
        #: The answer to a request its parser refused behind requests read whole: sent once they are answered, then
        #: the connection closes (nothing past the error is read).
        self.owed: bytes | None = None


def pass_order(event: tuple[selectors.SelectorKey, int]) -> tuple[int, int]:
    """A pass's events in turn: wake-ups and listeners first, then connections, the highest level first (a high
    priority beside a crowd is read before the crowd's requests)."""
    data = event[0].data
    return (1, data.level) if isinstance(data, Connection) else (0, 0)
