"""The types of the settings whose values are checked one by one, before any check across settings (`Config`).

A list setting from the environment or one flag value is comma-separated (`TWINSERVE_API_KEYS=k1,k2`), and a
repeated flag's values may be too. Each check here needs the value alone: an API key's characters, a host
pattern's spelling, a proxy's address or network, a device's name; whether torch and the GPU are there is asked at
start-up (core.device).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from pydantic_settings import NoDecode

from twinserve.api_keys import check_key

__all__ = ["ApiKeyList", "CommaList", "DeviceName", "HostList", "ProxyList"]


def _split_commas(value: Any) -> Any:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return value
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def _check_keys(keys: list[str]) -> list[str]:
    for key in keys:
        check_key(key)
    return keys


def _check_hosts(patterns: list[str]) -> list[str]:
    for pattern in patterns:
        # A URL where a host belongs would silently allow a host named "http": refuse it.
        if any(c in pattern for c in "/@?#") or not all("!" <= c <= "~" for c in pattern):
            raise ValueError(f"{pattern!r} is not a host name or address (no scheme, path or spaces)")
    return patterns


def _check_proxies(entries: list[str]) -> list[str]:
    for entry in entries:
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"{entry!r} is neither an IP address, a network (10.0.0.0/8) nor '*'") from None
    return entries


def _check_device(device: str) -> str:
    if not re.fullmatch(r"cpu|auto|cuda(:\d+)?", device):
        raise ValueError(f"expected cpu, cuda, cuda:N or auto, got {device!r}")
    return device


#: A list of strings, comma-separated in the environment and in each flag value (NoDecode: not read as JSON).
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split_commas)]
#: API keys: visible ASCII without spaces (the message never names the key).
ApiKeyList = Annotated[CommaList, AfterValidator(_check_keys)]
#: Host header patterns: a name or an address, no scheme, path or spaces.
HostList = Annotated[CommaList, AfterValidator(_check_hosts)]
#: Trusted proxies: IP addresses, networks (10.0.0.0/8), or `*`.
ProxyList = Annotated[CommaList, AfterValidator(_check_proxies)]
#: Where models compute: cpu, cuda, cuda:N or auto.
DeviceName = Annotated[str, AfterValidator(_check_device)]
