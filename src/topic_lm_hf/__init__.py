"""topic-lm-hf: topic-guided neural language models as Hugging Face transformers models."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .collator import TopicContextCollator, make_bow
from .data import (build_vocabularies, check_vocabularies, documents_from_lists, load_documents,
                   load_vocabularies, save_vocabularies, synthetic_documents, tokenize_text)
from .evaluation import PROTOCOLS, evaluate_perplexity
from .models import LSTMLMConfig, LSTMLMForCausalLM, LSTMLMModel
from .trainer import TopicLMTrainer

__version__ = "0.1.0"

# Auto-class registration: importing the package makes every model loadable with the Auto classes.
AutoConfig.register(LSTMLMConfig.model_type, LSTMLMConfig, exist_ok=True)
AutoModel.register(LSTMLMConfig, LSTMLMModel, exist_ok=True)
AutoModelForCausalLM.register(LSTMLMConfig, LSTMLMForCausalLM, exist_ok=True)

__all__ = [
    "TopicContextCollator", "make_bow", "build_vocabularies", "check_vocabularies", "documents_from_lists",
    "load_documents", "load_vocabularies", "save_vocabularies", "synthetic_documents", "tokenize_text",
    "PROTOCOLS", "evaluate_perplexity", "LSTMLMConfig", "LSTMLMForCausalLM", "LSTMLMModel", "TopicLMTrainer",
]
