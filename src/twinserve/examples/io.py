"""The seed's "data fetch + inference" case (S16, S17): features from Redis per instance, then a small model.

Each instance names an entity; `preprocess` fetches its feature vector from Redis (the usual online feature
store) through a pooled client: redis-py's connection pool on the blocking path (sync front),
`redis.asyncio`'s pool on the coroutine path (async front). A logistic regression then scores the batch.

Load demo features with `python -m twinserve.examples.io --redis-url redis://127.0.0.1:6379/0`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import numpy as np
import redis
import redis.asyncio
from pydantic import BaseModel, ConfigDict, Field

from twinserve.errors import DependencyUnavailable, ValidationFailed
from twinserve.model import Model

__all__ = ["N_FEATURES", "EntityRequest", "FeatureLookup", "Score", "feature_key", "populate", "redact_url"]

N_FEATURES = 8
KEY_PREFIX = "twinserve:features:"
FIELDS = [f"f{i}" for i in range(N_FEATURES)]
#: Seconds to connect to, or hear back from, the store before the request is answered 503.
STORE_TIMEOUT_S = 2.0


@contextmanager
def _store(url: str) -> Iterator[None]:
    """An unreachable store is the server's trouble, not the model's: 503 naming it, not a 500."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise DependencyUnavailable(f"the feature store (redis at {redact_url(url)}) is unreachable: {exc}") from None


def redact_url(url: str) -> str:
    """`url` without a credential, for messages and logs: the user and password hidden (`***@host`), every query
    value hidden (redis-py also reads `password`, `username` and TLS settings from the query: names are kept,
    values are not), the fragment dropped. Scheme, host, port and path (the database) stay."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:  # a bad port or bracket: nothing of it is shown, it might be anything
        return "<unparseable URL>"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc = f"{netloc}:{port}"
    if "@" in parts.netloc:
        netloc = f"***@{netloc}"
    query = "&".join(f"{quote(name)}=***" for name, _ in parse_qsl(parts.query, keep_blank_values=True))
    # Written out rather than urlunsplit, which turns `unix:///path` into `unix:/path`.
    return f"{parts.scheme}://{netloc}{quote(parts.path)}" + (f"?{query}" if query else "")


def feature_key(entity_id: str) -> str:
    return KEY_PREFIX + entity_id


def entity_features(index: int) -> list[float]:
    """Deterministic demo features for entity `user:<index>`."""
    rng = np.random.default_rng(index)
    return [round(float(v), 6) for v in rng.normal(size=N_FEATURES)]


def populate(redis_url: str, entities: int = 1000) -> int:
    """Store demo features for `user:0` .. `user:<entities-1>`; returns how many were written."""
    client = redis.Redis.from_url(redis_url)
    try:
        with client.pipeline(transaction=False) as pipe:
            for index in range(entities):
                pipe.hset(
                    feature_key(f"user:{index}"),
                    mapping=dict(zip(FIELDS, entity_features(index), strict=True)),
                )
            pipe.execute()
    finally:
        client.close()
    return entities


class EntityRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entity_id: str = Field(min_length=1, max_length=256, pattern=r"^[\w:.\-]+$")


@dataclass(frozen=True)
class Features:
    entity_id: str
    values: list[float]


class Score(BaseModel):
    entity_id: str
    score: float


class FeatureLookup(Model):
    """Score an entity from its stored features; unknown entities are a 422 naming the id."""

    name = "feature-lookup"

    def load(self) -> None:
        from sklearn.linear_model import LogisticRegression

        url = self.redis_url = self.config.redis_url
        self.redis = redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=STORE_TIMEOUT_S, socket_connect_timeout=STORE_TIMEOUT_S
        )
        self.aredis = redis.asyncio.Redis.from_url(
            url, decode_responses=True, socket_timeout=STORE_TIMEOUT_S, socket_connect_timeout=STORE_TIMEOUT_S
        )
        self.redis.ping()  # fail at start-up, not on the first request, if the store is unreachable
        rng = np.random.default_rng(0)
        x = rng.normal(size=(512, N_FEATURES))
        y = (x @ np.linspace(-1.0, 1.0, N_FEATURES) > 0).astype(int)
        self.scorer = LogisticRegression(random_state=0).fit(x, y)

    def _features(self, entity_id: str, values: Sequence[bytes | str | None]) -> Features:
        if any(v is None for v in values):
            raise ValidationFailed(f"no features stored for entity {entity_id!r}")
        return Features(entity_id, [float(v) for v in values])  # type: ignore[arg-type]

    def preprocess(self, instance: EntityRequest) -> Features:
        with _store(self.redis_url):
            values = self.redis.hmget(feature_key(instance.entity_id), FIELDS)
        return self._features(instance.entity_id, values)

    async def apreprocess(self, instance: EntityRequest) -> Features:
        with _store(self.redis_url):
            values = await self.aredis.hmget(feature_key(instance.entity_id), FIELDS)
        return self._features(instance.entity_id, values)

    def predict(self, batch: list[Features]) -> list[Score]:
        probabilities = self.scorer.predict_proba(np.array([f.values for f in batch]))[:, 1]
        return [
            Score(entity_id=f.entity_id, score=round(float(p), 6)) for f, p in zip(batch, probabilities, strict=True)
        ]

    def examples(self) -> list[Any]:
        return [EntityRequest(entity_id="user:1"), EntityRequest(entity_id="user:2")]


def main() -> None:
    parser = argparse.ArgumentParser(description="Load demo features for the FeatureLookup example into Redis.")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--entities", type=int, default=1000)
    args = parser.parse_args()
    print(f"stored features for {populate(args.redis_url, args.entities)} entities")


if __name__ == "__main__":
    main()
