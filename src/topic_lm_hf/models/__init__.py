"""Model families. Each family is a configuration file and a modeling file side by side (flat, so
that Hub remote code can copy them together with ``modeling_common.py``)."""

from .configuration_lstm_lm import LSTMLMConfig
from .modeling_lstm_lm import LSTMLMForCausalLM, LSTMLMModel

__all__ = ["LSTMLMConfig", "LSTMLMModel", "LSTMLMForCausalLM"]
