"""Built-in example models, so `twinserve serve` and `twinserve bench` need no files of the user's.

- `twinserve.examples.tabular:Classifier`: a scikit-learn random forest on the iris data scikit-learn ships.
- `twinserve.examples.embed:MiniLM`: sentence embeddings from all-MiniLM-L6-v2 (extra `torch`).
- `twinserve.examples.io:FeatureLookup`: features fetched from Redis per instance, then a small model scores them.
- `twinserve.examples.tokens:Tokens`: a streaming model that answers word by word (`:stream`).
"""
