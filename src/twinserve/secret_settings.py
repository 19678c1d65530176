"""Which settings hold a secret: what twinserve never writes into a file, a manifest or a command line it prints
(`twinserve tune`'s settings file, results and report, `twinserve k8s`'s manifests and Dockerfile).

API keys and the admin key always; a Redis URL when it carries a credential (a user or password before the host,
or a query value: redis-py reads `password`, `username` and TLS settings from the query too). A URL without one is
an address, and is written like any setting.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from twinserve.config import Config

__all__ = ["ALWAYS_SECRET", "secret_fields", "url_has_credential"]

#: Fields whose value is a secret whatever it is.
ALWAYS_SECRET = frozenset({"api_keys", "admin_api_key"})


def url_has_credential(url: str) -> bool:
    """Whether `url` carries a credential (userinfo or a query); an unparseable one is treated as if it did."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return True
    return "@" in parts.netloc or bool(parts.query)


def secret_fields(config: Config) -> frozenset[str]:
    """The fields of `config` that hold a secret now."""
    return ALWAYS_SECRET | ({"redis_url"} if url_has_credential(config.redis_url) else frozenset())
