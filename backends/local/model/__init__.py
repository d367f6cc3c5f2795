"""The decoder and its weight sources."""

from backends.local.model.llama import LlamaModel, ModelConfig
from backends.local.model.loader import BUILTIN_MODELS, LoadedModel, load_model

__all__ = ["LlamaModel", "ModelConfig", "LoadedModel", "load_model", "BUILTIN_MODELS"]
