"""`twinserve tune`: find the architecture and settings that serve a model best on this machine, within a latency
objective, by probing real servers until a budget is spent.

The parts are its modules: `runner` (the driver: measures the model, starts servers, runs each probe), `space`
(the candidates, pruned), `search` (successive halving, a pure policy), `subject` (what is tuned and how a
candidate reaches it), `summary` (what the evidence supports), `report` (the files written), `results` (those
read back), `verify` (`--verify URL`) and `command` (the CLI handler).

Nothing is re-exported here, so that importing one part does not import the others: `twinserve k8s` reads tune's
results (`results`) without loading the driver's servers and load generator.
"""

__all__: list[str] = []
