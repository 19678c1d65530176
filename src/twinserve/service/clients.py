"""Who is on the other end: the client's address, through the proxies `--forwarded-allow-ips` trusts.

The auth-failure lockout counts per client address, so behind a reverse proxy it needs the client's, not the
proxy's (else one guesser locks every client out). A proxy appends the address it received from to
`X-Forwarded-For`; reading that list from the right, the first address that is not a trusted proxy is the
client (anything further left was written by the client and proves nothing). With no trusted peer the
header is ignored: anyone can send one.

uvicorn does the same for the async and hybrid architectures before the app sees the request (its
`ProxyHeadersMiddleware`, trusting `FORWARDED_ALLOW_IPS`, 127.0.0.1 and ::1 by default); gunicorn leaves
`REMOTE_ADDR` as the socket's peer. Applying this on both fronts gives every architecture the same answer: once
uvicorn has put the client in the scope, the client is not a trusted proxy and this changes nothing.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence

__all__ = ["ForwardedFor"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ForwardedFor:
    """The client address of a request from `peer` carrying an `X-Forwarded-For` header."""

    def __init__(self, trusted: Sequence[str]) -> None:
        self.any = "*" in trusted
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(t, strict=False) for t in trusted if t != "*")
        # Peers are few and come back: each address is parsed once.
        self.trusts = functools.lru_cache(maxsize=4096)(self._trusts)

    def _trusts(self, address: str) -> bool:
        if self.any:
            return True
        try:
            ip = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def client(self, peer: str | None, header: str | None) -> str | None:
        """The client's address: `peer`, or the rightmost untrusted hop of `header` when `peer` is trusted."""
        if peer is None or not header or not self.trusts(peer):
            return peer
        hops = [hop.strip() for hop in header.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self.trusts(hop):
                return hop
        return hops[0] if hops else peer  # every hop a trusted proxy: the first one is as far as anyone can tell
