"""The usual ways to serve a model without twinserve, written plainly, for `benchmarks/peers.py`."""
