"""What answered requests are counted in: the metric children of each kind of answer, and the aggregate refusal
log (observability/refusals.py), for the requests the app answered (`Service.finish`), for those the HTTP server
refused from their head, before the app (fronts/early.py), and for those it could not read (`unparsed`: 400
`malformed_http`, 414, 431, answered by the server before any route).

The children are found once per kind of answer, not per request: `labels()` costs a lock and a tuple per call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from twinserve.observability.metrics import REJECTION_REASONS, metrics
from twinserve.observability.refusals import SHED_CODES, UNPARSED, RefusalLog
from twinserve.observability.sums import Writes
from twinserve.observability.tally import Tally
from twinserve.repository import ModelRegistry

__all__ = ["AnswerKey", "EarlyKey", "RequestCounts"]

#: An answered request's kind, as its metrics tell it: model, endpoint, status, error code, priority, version.
AnswerKey = tuple[str, str, int, str | None, int, str | None]
#: A kind of refusal before the app: model, version, endpoint, priority, status, error code.
EarlyKey = tuple[str, str | None, str, int, int, str]


class _Counted(NamedTuple):
    """The metric children one kind of answered request is counted in."""

    counters: tuple[Any, ...]  # each counts it once
    histograms: tuple[Any, ...]  # each observes its seconds
    failed: Any | None  # counts its seconds as failed (an error status)


class RequestCounts:
    """The metrics and the refusal log of one process's requests, over the models of `registry`."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry
        #: Per kind of answered request, the metric children it is counted in (`_count_as`).
        self._counted: dict[AnswerKey, _Counted] = {}
        self._refusals = RefusalLog()
        self._early: dict[EarlyKey, tuple[Any, ...]] = {}
        self._early_tally: Tally[EarlyKey] = Tally(self._count_early)
        self._unparsed_log = RefusalLog(message=UNPARSED)
        self._unparsed_tally: Tally[tuple[int, str]] = Tally(self._count_unparsed)

    def answered(self, key: AnswerKey, seconds: float) -> Writes:
        """The metric writes of a request answered as `key` says after `seconds`, for the caller to hand to the
        process's sums (`MetricSums.ended`); a refusal is noted in the refusal log."""
        counted = self._counted.get(key) or self._count_as(key)
        writes = Writes()
        for counter in counted.counters:
            writes.inc(counter)
        for histogram in counted.histograms:
            writes.observe(histogram, seconds)
        if counted.failed is not None:
            writes.inc(counted.failed, seconds)
        error_code = key[3]
        if error_code in SHED_CODES:
            self._refusals.refused(key[0], error_code)
        return writes

    def _count_as(self, key: AnswerKey) -> _Counted:
        """The metric children a request answered as `key` says is counted in, found once per kind of answer
        (`labels()` costs a lock and a tuple per call)."""
        model, endpoint, status, error_code, priority, version = key
        m = metrics()
        counters = [m.requests.labels(model, endpoint, str(status))]
        histograms = [m.request_seconds.labels(model, endpoint)]
        reason = REJECTION_REASONS.get(error_code) if error_code is not None else None
        if reason is not None:
            counters.append(m.rejected.labels(model, reason))
        if model:
            outcome = "ok" if status < 300 else "refused" if reason is not None else "error"
            counters.append(m.by_priority.labels(model, str(priority), outcome))
            if version is not None:
                counters.append(m.by_version.labels(model, version, outcome))
                if not self._registry.strict:  # a repository: versions side by side (MODEL arguments have one)
                    histograms.append(m.version_seconds.labels(model, version))
        failed = m.failed_seconds.labels(model, endpoint) if status >= 400 else None
        counted = self._counted[key] = _Counted(tuple(counters), tuple(histograms), failed)
        return counted

    def refused_early(self, key: EarlyKey) -> None:
        """Count a request refused before the app as `answered` counts a refusal (requests, rejections, the
        priority and version outcomes, the aggregate refusal log) and in `twinserve_early_refusals_total`. The
        metrics and the refusal log are written in sums, at most every 50 ms (observability/tally.py): a flood
        refuses thousands a second, and a metric write each cost a tenth of the refusal."""
        self._early_tally.add(key)

    def unparsed(self, status: int, error_code: str) -> None:
        """Count a request the HTTP server answered itself as it could not read it (its request line, a header, its
        framing, or a head past the limits): in `twinserve_requests_total` with no model or endpoint, in
        `twinserve_unparsed_requests_total`, and in one log line an interval. In sums, as the early refusals: a
        flood of broken requests is as cheap to count as a flood of refusals."""
        self._unparsed_tally.add((status, error_code))

    def flush(self) -> None:
        """Write the early refusals and unparsed requests counted since the last sum now (before a scrape)."""
        self._early_tally.flush()
        self._unparsed_tally.flush()

    def _count_unparsed(self, counts: dict[tuple[int, str], float], seconds: float) -> None:
        m = metrics()
        for (status, error_code), n in counts.items():
            self._unparsed_log.refused("", error_code, int(n))
            m.requests.labels("", "", str(status)).inc(n)
            m.unparsed.labels(error_code).inc(n)

    def _count_early(self, counts: dict[EarlyKey, float], seconds: float) -> None:
        for key, n in counts.items():
            self._refusals.refused(key[0], key[5], int(n))
            counters = self._early.get(key)
            if counters is None:
                model, version, endpoint, priority, status, error_code = key
                m = metrics()
                counters = (
                    m.requests.labels(model, endpoint, str(status)),
                    m.rejected.labels(model, REJECTION_REASONS[error_code]),
                    m.by_priority.labels(model, str(priority), "refused"),
                    m.early_refusals.labels(model),
                )
                if version is not None:  # refused once its version was known (not by the sync backlog)
                    counters += (m.by_version.labels(model, version, "refused"),)
                self._early[key] = counters
            for counter in counters:
                counter.inc(n)
