"""The I/O example's 503 names its feature store without a credential (issue #20, case 9)."""

from __future__ import annotations

import pytest
import redis

from twinserve.errors import DependencyUnavailable
from twinserve.examples import io
from twinserve.examples.io import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://user:s3cret@cache.internal:6380/2", "redis://***@cache.internal:6380/2"),
        ("redis://:s3cret@cache/0", "redis://***@cache/0"),
        ("redis://s3cret@cache/0", "redis://***@cache/0"),  # a lone userinfo may be a password (redis-py: it is)
        ("redis://cache/0?password=s3cret&db=1", "redis://cache/0?password=***&db=***"),
        (
            "rediss://u:s3cret@cache?username=u&ssl_password=s3cret#s3cret",
            "rediss://***@cache?username=***&ssl_password=***",
        ),
        ("unix:///run/redis.sock?password=s3cret", "unix:///run/redis.sock?password=***"),
        ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
        ("redis://u%3As3cret%40x@cache/0", "redis://***@cache/0"),  # percent-encoded separators
        ("redis://s3cret@cache:notaport/0", "<unparseable URL>"),
    ],
)
def test_redact_url_hides_every_credential(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "s3cret" not in redact_url(url)


def test_unreachable_store_answer_names_no_secret() -> None:
    url = "redis://admin:pw-in-netloc@cache.internal:6379/0?password=pw-in-query"
    with pytest.raises(DependencyUnavailable) as unavailable, io._store(url):
        raise redis.ConnectionError("Error 111 connecting to cache.internal:6379. Connection refused.")
    message = unavailable.value.message
    assert "pw-in" not in message and "admin" not in message
    assert "redis://***@cache.internal:6379/0?password=***" in message
