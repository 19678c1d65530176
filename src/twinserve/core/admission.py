"""Admission control, in one place: queue bounds, rate limits and deadlines.

`Admission` holds every rule a request meets before it is computed. The rules are pure decisions over state and a
clock reading passed in, so they are unit-tested directly; their state lives per process or in slots shared by
every process of the server (`core/shared.py`), which makes rate limits exact across worker processes.

- Queue bounds (`--max-queue`): 503 `queue_full` with Retry-After.
- Rate limits (`--rate-limit`, `--rate-burst`, `--rate-limit-per-key`): 429 `rate_limited` with Retry-After.
- Deadlines (default, `X-Request-Timeout-Ms`, capped by `--max-timeout-ms`): 504 `deadline_exceeded`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from twinserve.config import Config
from twinserve.core import shared
from twinserve.core.shared import LocalSlots, Slots
from twinserve.errors import ClientError, QueueFull, RateLimited

__all__ = [
    "PRIORITY_HEADER",
    "TIMEOUT_HEADER",
    "Admission",
    "QueueBound",
    "Rate",
    "TokenBucket",
    "deadline_from",
    "rate_limiter",
    "shared_slot_count",
]

TIMEOUT_HEADER = "X-Request-Timeout-Ms"
PRIORITY_HEADER = "X-Priority"
_RETRY_SOON = {"Retry-After": "1"}
#: Take-ups measured before the sync backlog trusts its estimate of the time between two of them.
_WARM_REQUESTS = 8
#: Weight of the newest interval in that moving average.
_SMOOTHING = 0.2


@dataclass(frozen=True)
class QueueBound:
    """At most `limit` waiting at once (instances, requests or streams: the caller counts), of which priority
    level p of `levels` may fill only its share, (levels - p + 1) / levels: the lowest level is refused first, and
    the highest (1) may fill the whole queue.

    Past its share a request is still let in while the measured wait ahead of it is at most its share of
    `max_wait` seconds: a closed-loop client refused at once comes straight back, so refusing a crowd that could
    be served within a second only spends the CPU on refusals that serving would have spent on answers. The bound
    on time is what keeps latency bounded then; the bound on count is what holds before any wait is measured.
    """

    limit: int
    levels: int = 1
    max_wait: float = 0.0

    def _share(self, priority: int) -> int:
        """The numerator of priority's share: level p of L may fill (L - p + 1) / L."""
        return self.levels - min(max(priority, 1), self.levels) + 1

    def limit_for(self, priority: int) -> int:
        return max(1, self.limit * self._share(priority) // self.levels)

    @cached_property
    def lowest_limit(self) -> int:
        """The lowest level's share: below it every level may put one more, so nothing can be refused."""
        return self.limit_for(self.levels)

    def wait_for(self, priority: int) -> float:
        """Seconds a request at `priority` may expect to wait past its count share and still be let in."""
        return self.max_wait * self._share(priority) / self.levels

    def admits(self, waiting: int, incoming: int, priority: int = 1, wait: float | None = None) -> bool:
        """Whether `check` lets `incoming` more in (the decision alone: no error, no message, for yes-or-no asks)."""
        limit = self.limit_for(priority)
        # A request larger than its level's share still goes in alone, into an empty queue: else it would be told
        # to retry for ever (--max-instances is held to the whole bound at start-up, not to each share).
        if waiting + incoming <= limit or not (waiting or incoming > self.limit):
            return True
        return bool(self.max_wait) and wait is not None and wait <= self.wait_for(priority)

    def check(self, waiting: int, incoming: int, holds: str, priority: int = 1, wait: float | None = None) -> None:
        """Raise QueueFull (503) if `incoming` more would take `waiting` past the bound of `priority`'s level and
        the expected `wait` (seconds, None when not yet measured) is past its share of `max_wait`; `holds` says
        what waits, for the message ("the queue holds 12 instances")."""
        error = self.refusal(waiting, incoming, holds, priority, wait)
        if error is not None:
            raise error

    def refusal(
        self, waiting: int, incoming: int, holds: str, priority: int = 1, wait: float | None = None
    ) -> QueueFull | None:
        """The QueueFull `check` raises, else None (for a caller that refuses in bulk: no exception to unwind)."""
        if self.admits(waiting, incoming, priority, wait):
            return None
        limit = self.limit_for(priority)
        share = "" if limit == self.limit else f", {limit} of it for priority {priority}"
        if self.max_wait and wait is not None:
            share += f"; the wait ahead, {wait * 1000:.0f} ms, is past --max-queue-wait-ms"
        return QueueFull(f"{holds} (--max-queue {self.limit}{share}); retry shortly", headers=_RETRY_SOON)


@dataclass(frozen=True)
class Rate:
    """A token bucket's rule: `per_second` tokens on average, at most `burst` at once, one per request."""

    per_second: float
    burst: float

    def take(self, tokens: float, updated: float, now: float) -> tuple[float, float]:
        """The bucket's tokens after refilling from `updated` to `now` and taking one request's token, and the
        seconds until a token is available (0.0: taken). A bucket never updated (`updated == 0`) is full."""
        tokens = self.burst if updated == 0.0 else min(self.burst, tokens + (now - updated) * self.per_second)
        if tokens >= 1:
            return tokens - 1, 0.0
        return tokens, (1 - tokens) / self.per_second


class TokenBucket:
    """A `Rate` over two slots (tokens, last update) of `slots`: this process's own, or the server's shared ones.
    Thread-safe (and process-safe over shared slots)."""

    def __init__(
        self,
        rate: float,
        burst: float,
        clock: Callable[[], float] = time.monotonic,
        slots: Slots | None = None,
        index: int = 0,
    ) -> None:
        self.rule = Rate(rate, burst)
        self._clock = clock
        self._slots = slots if slots is not None else LocalSlots(2)
        self._at = 2 * index
        #: Requests this process refused.
        self.rejected = 0

    @property
    def rate(self) -> float:
        return self.rule.per_second

    @property
    def burst(self) -> float:
        return self.rule.burst

    def acquire(self) -> None:
        """Take one token, or raise RateLimited (429) with the seconds until one is available."""
        at = self._at
        with self._slots.locked() as values:
            now = self._clock()
            values[at], wait = self.rule.take(values[at], values[at + 1], now)
            values[at + 1] = now
        if wait:
            self.rejected += 1
            raise RateLimited(
                f"rate limit of {self.rate:g} requests/s exceeded; retry in {wait:.2f} s",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )


def deadline_from(header: str | None, config: Config, default_ms: int | None = None) -> float | None:
    """The request's deadline on the monotonic clock, or None for no deadline; without a header, `default_ms`
    (a model's own `timeout_ms`) or else `config.timeout_ms`."""
    if header is None:
        timeout_ms = config.timeout_ms if default_ms is None else default_ms
    else:
        try:
            timeout_ms = int(header)
        except ValueError:
            timeout_ms = 0
        if timeout_ms <= 0:
            raise ClientError(f"{TIMEOUT_HEADER} must be a positive whole number of milliseconds, got {header!r}")
        timeout_ms = min(timeout_ms, config.max_timeout_ms)
    if timeout_ms is None:
        return None
    return time.monotonic() + timeout_ms / 1000


def shared_slot_count(config: Config, keys: int) -> int:
    """How many slots the server's rate limits share over `keys` API keys (0: none): two per bucket, the
    server-wide one first, then one per key."""
    buckets = int(config.rate_limit is not None)
    if config.rate_limit_per_key is not None:
        buckets += keys
    return 2 * buckets


def rate_limiter(config: Config, slots: Slots | None = None, index: int = 0) -> TokenBucket | None:
    """The server-wide bucket over shared `slots`, or without them this process's even share of the rate."""
    if config.rate_limit is None:
        return None
    burst = config.rate_burst if config.rate_burst is not None else max(1, math.ceil(config.rate_limit))
    return _bucket(config.rate_limit, burst, config, slots, index)


def _bucket(rate: float, burst: float, config: Config, slots: Slots | None, index: int) -> TokenBucket:
    if slots is not None:
        return TokenBucket(rate, max(1, burst), slots=slots, index=index)
    workers = config.effective_workers
    return TokenBucket(rate / workers, max(1, math.ceil(burst / workers)))


class Admission:
    """Every admission rule for the models one server process serves (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        key_ids: Sequence[str] = (),
        slots: Slots | None = None,
        key_priorities: Mapping[str, int] | None = None,
    ) -> None:
        self.config = config
        #: Key id -> the highest priority level (and the default) of that key's requests.
        self.key_priorities = dict(key_priorities or {})
        #: Requests waiting for a request thread (the sync front), and streams waiting for a model worker.
        self.backlog = QueueBound(config.max_queue, config.priority_levels, config.max_queue_wait_ms / 1000)
        #: The sync front's request threads: moving average of the seconds between two take-ups of a waiting
        #: request while others wait (None until measured), how many went into it, and when the last take-up
        #: that left others waiting was made. The backlog's expected wait is its length times this.
        self.drain_seconds: float | None = None
        #: Until then, the moving average of the seconds a request thread's app spends on one answered request,
        #: and how many went into it: over the threads, the drain of a pool that never had a backlog yet.
        self.thread_seconds: float | None = None
        self._threads_measured = 0
        self._drains_measured = 0
        self._taken_with_backlog: float | None = None
        ids = sorted(set(key_ids))  # every process numbers the keys' slots alike
        count = shared_slot_count(config, len(ids))
        if slots is None and count and config.effective_workers > 1:
            slots = shared.attach(count)
        self.limiter = rate_limiter(config, slots, 0)
        first = int(self.limiter is not None)
        self._keys: dict[str, TokenBucket] = {}
        if config.rate_limit_per_key is not None:
            rate = config.rate_limit_per_key
            burst = max(1, math.ceil(rate))
            self._keys = {kid: _bucket(rate, burst, config, slots, first + i) for i, kid in enumerate(ids)}

    def shed(self, backlog: int, priority: int = 1, spent: float = 0.0) -> None:
        """503 when more requests wait for a request thread than the queue bound allows `priority` (by count,
        and by the wait they make: `QueueBound`); `spent`: seconds the request has waited already (held unread),
        which count in its wait."""
        holds = f"{backlog} requests are waiting for a request thread"
        self.backlog.check(backlog, 0, holds, priority, self._wait(backlog, spent))

    def _wait(self, backlog: int, spent: float) -> float | None:
        wait = self.backlog_wait(backlog)
        return None if wait is None else wait + spent

    def backlog_crowded(self, backlog: int) -> bool:
        """Whether `shed` may refuse some level with `backlog` waiting (past the lowest level's count share)."""
        return backlog > self.backlog.lowest_limit

    def backlog_wait(self, backlog: int) -> float | None:
        """Seconds until the request threads take up a request with `backlog` waiting ahead of it, from the
        pool's measured drain, else from the app's time per request over the threads (None until measured)."""
        if self.drain_seconds is not None and self._drains_measured >= _WARM_REQUESTS:
            return backlog * self.drain_seconds
        if self.thread_seconds is None or self._threads_measured < _WARM_REQUESTS:
            return None
        return backlog * self.thread_seconds / max(1, self.config.threads)

    def served(self, seconds: float) -> None:
        """A request thread's app answered a request in `seconds` (the estimate before a drain is measured).
        Threads race on the average; a lost update only delays it by one sample."""
        self._threads_measured += 1
        average = self.thread_seconds
        self.thread_seconds = seconds if average is None else average + _SMOOTHING * (seconds - average)

    def taken_up(self, now: float, behind: int) -> None:
        """A request thread took a waiting request up at `now` (monotonic), leaving `behind` waiting (the sync
        front calls this under its backlog's lock).

        The wait is measured where it is made. While requests wait, every thread is busy, so the time between two
        take-ups is what one request ahead adds to the wait of those behind it: the app's time, and gunicorn's
        parse and write and the wait for the GIL, over the threads (the app's time alone would leave those out
        and read the wait too short). An interval that began with nothing waiting includes idle time, and is not
        counted."""
        last, self._taken_with_backlog = self._taken_with_backlog, (now if behind else None)
        if last is None:
            return
        interval = now - last
        self._drains_measured += 1
        average = self.drain_seconds
        self.drain_seconds = interval if average is None else average + _SMOOTHING * (interval - average)

    def priority(
        self,
        value: str | int | None,
        source: str = PRIORITY_HEADER,
        key_id: str | None = None,
        default: int | None = None,
    ) -> int:
        """The priority level of a request that asks for `value` (`X-Priority`, or V2 `parameters.priority`): a
        whole number from 1 (the highest) to `--priority-levels`, 400 otherwise; none means its API key's level,
        else `default` (the model's own `default_priority`), else `--default-priority`. A key's level is also the
        highest its requests get: they may ask for less."""
        ceiling = self.key_priorities.get(key_id, 1) if key_id is not None else 1
        if value is None:
            if key_id in self.key_priorities:
                return ceiling
            return self.config.default_priority if default is None else default
        levels = self.config.priority_levels
        try:
            level = value if isinstance(value, int) and not isinstance(value, bool) else int(str(value).strip())
        except ValueError:
            level = 0
        if not 1 <= level <= levels:
            raise ClientError(f"{source} must be a whole number from 1 (the highest) to {levels}, got {value!r}")
        return max(level, ceiling)

    def rate(self) -> None:
        """Take one request from the server-wide rate limit (429 past it)."""
        if self.limiter is not None:
            self.limiter.acquire()

    def charge(self, key_id: str) -> None:
        """Take one request from the rate limit of API key `key_id`, if it has one (429 past it)."""
        bucket = self._keys.get(key_id)
        if bucket is not None:
            bucket.acquire()

    def deadline(self, header: str | None, default_ms: int | None = None) -> float | None:
        """The request's deadline from its `X-Request-Timeout-Ms`, else `default_ms` (the model's own `timeout_ms`),
        else `--timeout-ms`; None for none."""
        return deadline_from(header, self.config, default_ms)

    def tighten(self, deadline: float | None, timeout_us: int | None) -> float | None:
        """The earlier of `deadline` and a V2 request's own `timeout` parameter (capped like the header)."""
        if timeout_us is None:
            return deadline
        own = time.monotonic() + min(timeout_us / 1e6, self.config.max_timeout_ms / 1000)
        return own if deadline is None else min(deadline, own)
