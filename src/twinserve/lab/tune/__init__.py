"""`twinserve tune`: find the architecture and settings that serve a model best on this machine, within a latency
objective, by probing real servers until a budget is spent.

The parts are its modules: `runner` (the driver), `space` (the candidates, pruned), `search` (successive halving),
`subject`, `summary`, `report`, `results`, `verify` and `command`. Nothing is re-exported here, so that
`twinserve k8s` can read tune's `results` without loading the driver's servers and load generator.
"""

__all__: list[str] = []
