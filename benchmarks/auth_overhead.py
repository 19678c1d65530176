"""What API keys (and CORS) cost per request: the same async server without and with them, in one run.

Starts `twinserve serve --arch async --workers 1` three times (no keys; `--api-key`; `--api-key` and
`--cors-origins`), then drives their predict endpoint with wrk in alternating rounds (the same body and headers,
the key included, for all: a server without keys ignores it; each variant first in turn), so drift on a shared
machine hits each alike. Also times the check itself in this process.
Prints the median req/s and P50/P99 of each and the ratios to the server without keys.

    python benchmarks/auth_overhead.py [--rounds 5] [--seconds 5] [--connections 32]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

from common import Server, example_request, require_wrk, wrk

KEY = "benchmark-key-0123456789abcdef"
ORIGIN = "https://app.example"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="twinserve.examples.tabular:Classifier")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    require_wrk()
    variants = {
        "no keys": [],
        "api key": ["--api-key", KEY],
        "api key + CORS": ["--api-key", KEY, "--cors-origins", ORIGIN],
    }
    servers = {name: Server([args.model], "async", "--workers", "1", *flags) for name, flags in variants.items()}
    headers = {"X-API-Key": KEY, "Origin": ORIGIN}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    try:
        for server in servers.values():
            server.start()
        targets = {name: example_request(server, headers) for name, server in servers.items()}
        for name, (url, body) in targets.items():
            warm = wrk(url, body, args.connections, 1, headers)
            if warm["errors"]:
                raise SystemExit(f"{name}: {warm['errors']} errors in the warm-up; is the key accepted?")
        order = list(targets)
        for round_ in range(args.rounds):
            for name in order[round_ % len(order) :] + order[: round_ % len(order)]:  # each goes first in turn
                url, body = targets[name]
                results[name].append(wrk(url, body, args.connections, args.seconds, headers))
    finally:
        for server in servers.values():
            server.stop()
    from starlette.datastructures import Headers

    from twinserve.service.auth import Authenticator

    raw = [(b"x-api-key", KEY.encode()), (b"content-type", b"application/json"), (b"origin", ORIGIN.encode())]
    check, request_headers = Authenticator([KEY]).authenticate, Headers(raw=raw)
    per_call = min(timeit.repeat(lambda: check(request_headers), number=20_000, repeat=5)) / 20_000
    print(f"Service.authenticate, one key, in process: {per_call * 1e6:.2f} us per request")
    base = statistics.median(r["rps"] for r in results["no keys"])
    print(f"{'variant':<16} {'req/s':>9} {'ratio':>7} {'P50 ms':>8} {'P99 ms':>8} {'errors':>7}")
    for name, runs in results.items():
        rps = statistics.median(r["rps"] for r in runs)
        p50 = statistics.median(r["p50"] for r in runs)
        p99 = statistics.median(r["p99"] for r in runs)
        errors = sum(r["errors"] for r in runs)
        print(f"{name:<16} {rps:>9.0f} {rps / base:>7.3f} {p50:>8.2f} {p99:>8.2f} {errors:>7.0f}")


if __name__ == "__main__":
    main()
