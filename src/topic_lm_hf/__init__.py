"""topic-lm-hf: topic-guided neural language models as Hugging Face transformers models."""

from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM,  # noqa: F401 (importable from here too)
                          AutoModelForSequenceClassification, AutoModelForTokenClassification)

from .collator import TopicContextCollator, make_bow
from .data import (build_vocabularies, check_vocabularies, documents_from_lists, load_documents,
                   load_vocabularies, record_vocabularies, save_vocabularies, synthetic_documents, tokenize_text)
from .evaluation import evaluate_perplexity, evaluate_steering, fit_lda_judge, topic_coherence, topic_diversity
from .evaluation.metrics import METRICS, load_metric, metric_path
from .evaluation.topic_eval import evaluate_topics
from .models import (LSTMLMConfig, LSTMLMForCausalLM, LSTMLMForSequenceClassification, LSTMLMModel, NCLMConfig,
                     NCLMForCausalLM, NCLMForSequenceClassification, NCLMModel, RGBNRNNConfig, RGBNRNNForCausalLM,
                     RGBNRNNForSequenceClassification, RGBNRNNModel, SenseTaggerConfig, SenseTaggerForTokenClassification,
                     TCNLMConfig, TCNLMForCausalLM, TCNLMForSequenceClassification, TCNLMModel, TopicRNNConfig,
                     TopicRNNForCausalLM, TopicRNNForSequenceClassification, TopicRNNModel)
from .pretraining import STEERING_RECIPE, pretrain_topic_model, steering_recipe
from .protocols import PROTOCOLS, Protocol
from .tasks import evaluate_retrieval, extract_document_features
from .trainer import TopicLMTrainer

__version__ = "0.1.0"

# Auto-class registration: importing the package makes every model loadable with the Auto classes (one record per
# family in families.FAMILIES; register_family adds one).
from .families import FAMILIES, Family, register_family  # noqa: E402

# The word sense tagger (tasks/wsd_tagger.py trains and applies it).
AutoConfig.register(SenseTaggerConfig.model_type, SenseTaggerConfig, exist_ok=True)
AutoModelForTokenClassification.register(SenseTaggerConfig, SenseTaggerForTokenClassification, exist_ok=True)
SenseTaggerConfig.register_for_auto_class("AutoConfig")
SenseTaggerForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")

__all__ = [
    "TopicContextCollator", "make_bow", "build_vocabularies", "check_vocabularies", "documents_from_lists",
    "load_documents", "load_vocabularies", "record_vocabularies", "save_vocabularies", "synthetic_documents",
    "tokenize_text", "PROTOCOLS", "Protocol", "evaluate_perplexity", "evaluate_steering", "fit_lda_judge", "topic_coherence",
    "topic_diversity", "evaluate_topics", "METRICS", "load_metric", "metric_path",
    "LSTMLMConfig", "LSTMLMForCausalLM", "LSTMLMModel", "TCNLMConfig", "TCNLMModel", "TCNLMForCausalLM",
    "TopicRNNConfig", "TopicRNNModel", "TopicRNNForCausalLM", "TopicRNNForSequenceClassification", "TopicLMTrainer",
    "NCLMConfig", "NCLMModel", "NCLMForCausalLM", "LSTMLMForSequenceClassification", "TCNLMForSequenceClassification",
    "NCLMForSequenceClassification",
    "RGBNRNNConfig", "RGBNRNNModel", "RGBNRNNForCausalLM", "RGBNRNNForSequenceClassification",
    "pretrain_topic_model", "steering_recipe", "STEERING_RECIPE", "evaluate_retrieval", "extract_document_features",
    "SenseTaggerConfig", "SenseTaggerForTokenClassification", "FAMILIES", "Family", "register_family",
]
