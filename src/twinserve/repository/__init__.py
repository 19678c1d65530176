"""Many models on one server: a model repository on disk, its versions and their states (docs/repository.md)."""

from twinserve.repository.layout import ModelFolder, VersionFolder, read_model, read_repository
from twinserve.repository.registry import ModelRegistry, ServedVersion

__all__ = ["ModelFolder", "ModelRegistry", "ServedVersion", "VersionFolder", "read_model", "read_repository"]
