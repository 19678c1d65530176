"""Many models on one server: a model repository on disk, its versions and their states (docs/repository.md)."""

from twinserve.repository.layout import ModelFolder, VersionFolder, read_model, read_repository
from twinserve.repository.registry import ModelRegistry, ServedVersion
from twinserve.repository.traffic import Shadow, TrafficPolicy

__all__ = [
    "ModelFolder",
    "ModelRegistry",
    "ServedVersion",
    "Shadow",
    "TrafficPolicy",
    "VersionFolder",
    "read_model",
    "read_repository",
]
