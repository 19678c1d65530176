"""The I/O workload of `benchmarks/workloads.py`: each instance waits 50 ms (a remote feature fetch, the seed's
S16 case, without a store to run), then the built-in iris forest scores the batch. A server keeps the model's
cores free while requests wait, so its ceiling is Little's law: connections / 50 ms."""

from __future__ import annotations

import asyncio
import time

from twinserve.examples.tabular import Classifier, IrisFeatures

WAIT_S = 0.05


class WaitThenForest(Classifier):
    name = "wait-then-forest"

    def preprocess(self, instance: IrisFeatures) -> IrisFeatures:
        time.sleep(WAIT_S)  # the sync front: a request thread waits
        return instance

    async def apreprocess(self, instance: IrisFeatures) -> IrisFeatures:
        await asyncio.sleep(WAIT_S)  # the async fronts: the event loop serves others meanwhile
        return instance
