"""GPT-2 model, checkpoints, data and tiny-model training for the fpsim experiments."""

from .checkpoint import load_gpt2, save_gpt2
from .model import GPT2, GPT2Config

__all__ = ["GPT2", "GPT2Config", "load_gpt2", "save_gpt2"]
