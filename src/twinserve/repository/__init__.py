"""Many models on one server: a model repository on disk, its versions and their states (docs/repository.md)."""

from twinserve.repository.layout import ModelFolder, VersionFolder, read_model, read_repository
from twinserve.repository.registry import ModelRegistry, ServedVersion
from twinserve.repository.residency import COLD, EVICTED, Residency
from twinserve.repository.traffic import Shadow, TrafficPolicy

__all__ = [
    "COLD",
    "EVICTED",
    "ModelFolder",
    "ModelRegistry",
    "Residency",
    "ServedVersion",
    "Shadow",
    "TrafficPolicy",
    "VersionFolder",
    "read_model",
    "read_repository",
]
