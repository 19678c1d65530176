"""Failed-authentication lockout per client address: a pure policy (addresses and a clock in, decisions out).

After `limit` failures from one address within `window_s`, that address is refused (429 + Retry-After) for
`window_s` before any key is compared, so a guesser makes at most `limit` guesses a window and learns nothing
while locked out. Memory is bounded (`max_tracked` addresses, least recently seen dropped first), and failures
are reported in aggregate per interval (`report()`), so a flood of guesses cannot flood the log.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FailureLockout", "FailureReport"]

#: Addresses named in a report, the most failing first.
TOP_ADDRESSES = 5


@dataclass(frozen=True)
class FailureReport:
    """What happened in one interval: failures, from how many addresses, lockouts and requests refused by them."""

    seconds: float
    failures: int
    addresses: int
    locked_out: int
    refused: int
    top: tuple[tuple[str, int], ...]


class _Address:
    __slots__ = ("failures", "locked_until")

    def __init__(self, limit: int) -> None:
        self.failures: deque[float] = deque(maxlen=limit)
        self.locked_until = 0.0


class FailureLockout:
    """Counts failed attempts per address and says whether, and for how long, an address is locked out.

    Thread-safe (the sync front calls it from its request threads); every call is O(1).
    """

    def __init__(
        self,
        limit: int,
        window_s: float = 60.0,
        *,
        max_tracked: int = 10_000,
        report_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1 or window_s <= 0 or max_tracked < 1:
            raise ValueError("a FailureLockout needs limit >= 1, window_s > 0 and max_tracked >= 1")
        self.limit = limit
        self.window_s = window_s
        self.max_tracked = max_tracked
        self.report_every_s = report_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._addresses: OrderedDict[str, _Address] = OrderedDict()
        # The current interval's counts, for `report`. Its start is None until its first failure or refusal; the
        # first one after a quiet spell is reported at once.
        self._since: float | None = None
        self._reported_at: float | None = None
        self._failures: Counter[str] = Counter()
        self._failed = 0
        self._locked_out = 0
        self._refused = 0

    def __len__(self) -> int:
        return len(self._addresses)

    def locked(self, address: str) -> float | None:
        """Seconds until `address` may try again, or None when it is not locked out (a refusal is counted)."""
        if address not in self._addresses:  # read without the lock: most requests come from addresses never wrong
            return None
        with self._lock:
            entry = self._addresses.get(address)
            if entry is None:
                return None
            now = self._clock()
            remaining = entry.locked_until - now
            if remaining <= 0:
                return None
            self._refused += 1
            if self._since is None:
                self._since = now
            return remaining

    def failed(self, address: str) -> None:
        """Count one failed attempt from `address`; the `limit`-th within the window locks it out."""
        with self._lock:
            now = self._clock()
            entry = self._addresses.get(address)
            if entry is None:
                entry = self._addresses[address] = _Address(self.limit)
                if len(self._addresses) > self.max_tracked:
                    self._addresses.popitem(last=False)  # the least recently seen
            else:
                self._addresses.move_to_end(address)
            failures = entry.failures
            while failures and now - failures[0] >= self.window_s:
                failures.popleft()
            failures.append(now)
            if len(failures) >= self.limit:
                entry.locked_until = now + self.window_s
                failures.clear()  # after the lockout, a fresh allowance of `limit` attempts
                self._locked_out += 1
            self._failed += 1
            if address in self._failures or len(self._failures) < self.max_tracked:
                self._failures[address] += 1
            if self._since is None:
                self._since = now

    def report(self) -> FailureReport | None:
        """The counts of the interval just ended, once per `report_every_s` (and for the first failure after a
        quiet spell at once); None when nothing is due."""
        if self._since is None:  # read without the lock: every authenticated request asks, nearly always in vain
            return None
        with self._lock:
            if self._since is None:
                return None
            now = self._clock()
            if self._reported_at is not None and now - self._reported_at < self.report_every_s:
                return None
            report = FailureReport(
                seconds=round(now - self._since, 3),
                failures=self._failed,
                addresses=len(self._failures),
                locked_out=self._locked_out,
                refused=self._refused,
                top=tuple(self._failures.most_common(TOP_ADDRESSES)),
            )
            self._reported_at = now
            self._since = None
            self._failures.clear()
            self._failed = self._locked_out = self._refused = 0
            return report
