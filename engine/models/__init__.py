"""Model forwards. Only the Llama family for now."""

from engine.models.llama import LlamaModel

SUPPORTED_ARCHITECTURES = {"llama": LlamaModel}

__all__ = ["LlamaModel", "SUPPORTED_ARCHITECTURES"]
