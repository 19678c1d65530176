"""A scikit-learn random forest trained at load on the iris data scikit-learn ships (no download)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from twinserve.model import Model

__all__ = ["Classifier", "IrisFeatures", "IrisPrediction"]

Label = Literal["setosa", "versicolor", "virginica"]
LABELS: tuple[Label, ...] = ("setosa", "versicolor", "virginica")


class IrisFeatures(BaseModel):
    """One flower, measured in centimetres."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sepal_length: float = Field(gt=0, le=100)
    sepal_width: float = Field(gt=0, le=100)
    petal_length: float = Field(gt=0, le=100)
    petal_width: float = Field(gt=0, le=100)


class IrisPrediction(BaseModel):
    label: Label
    class_id: int
    probabilities: list[float] = Field(min_length=len(LABELS), max_length=len(LABELS))  # V2: FP32 [-1, 3]


class Classifier(Model):
    """Iris species from four measurements; deterministic (fixed seed), CPU-light, batch-friendly."""

    name = "iris"

    def load(self) -> None:
        from sklearn.datasets import load_iris
        from sklearn.ensemble import RandomForestClassifier

        features, target = load_iris(return_X_y=True)
        self.forest = RandomForestClassifier(n_estimators=32, max_depth=6, random_state=0, n_jobs=1)
        self.forest.fit(features, target)

    def predict(self, batch: list[IrisFeatures]) -> list[IrisPrediction]:
        rows = np.array(
            [(f.sepal_length, f.sepal_width, f.petal_length, f.petal_width) for f in batch], dtype=np.float64
        )
        probabilities = self.forest.predict_proba(rows)
        class_ids = probabilities.argmax(axis=1)
        return [
            IrisPrediction(label=LABELS[c], class_id=int(c), probabilities=[round(float(p), 6) for p in row])
            for c, row in zip(class_ids, probabilities, strict=True)
        ]

    def examples(self) -> list[Any]:
        return [
            IrisFeatures(sepal_length=5.1, sepal_width=3.5, petal_length=1.4, petal_width=0.2),
            IrisFeatures(sepal_length=6.4, sepal_width=3.2, petal_length=4.5, petal_width=1.5),
            IrisFeatures(sepal_length=6.3, sepal_width=3.3, petal_length=6.0, petal_width=2.5),
        ]
