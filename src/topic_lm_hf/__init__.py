"""topic-lm-hf: topic-guided neural language models as Hugging Face transformers models."""

from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification)

from .collator import TopicContextCollator, make_bow
from .data import (build_vocabularies, check_vocabularies, documents_from_lists, load_documents,
                   load_vocabularies, record_vocabularies, save_vocabularies, synthetic_documents, tokenize_text)
from .evaluation import (PROTOCOLS, evaluate_perplexity, evaluate_steering, fit_lda_judge, topic_coherence,
                         topic_diversity)
from .evaluation.metrics import METRICS, load_metric, metric_path
from .evaluation.topic_eval import evaluate_topics
from .models import (LSTMLMConfig, LSTMLMForCausalLM, LSTMLMForSequenceClassification, LSTMLMModel, NCLMConfig,
                     NCLMForCausalLM, NCLMForSequenceClassification, NCLMModel, RGBNRNNConfig, RGBNRNNForCausalLM,
                     RGBNRNNForSequenceClassification, RGBNRNNModel, SenseTaggerConfig, SenseTaggerForTokenClassification,
                     TCNLMConfig, TCNLMForCausalLM, TCNLMForSequenceClassification, TCNLMModel, TopicRNNConfig,
                     TopicRNNForCausalLM, TopicRNNForSequenceClassification, TopicRNNModel)
from .pretraining import STEERING_RECIPE, pretrain_topic_model, steering_recipe
from .tasks import evaluate_retrieval, extract_document_features
from .trainer import TopicLMTrainer

__version__ = "0.1.0"

# Auto-class registration: importing the package makes every model loadable with the Auto classes.
# (config, base model, causal LM, sequence classifier or None) per family.
FAMILIES = ((LSTMLMConfig, LSTMLMModel, LSTMLMForCausalLM, LSTMLMForSequenceClassification),
            (TCNLMConfig, TCNLMModel, TCNLMForCausalLM, TCNLMForSequenceClassification),
            (TopicRNNConfig, TopicRNNModel, TopicRNNForCausalLM, TopicRNNForSequenceClassification),
            (NCLMConfig, NCLMModel, NCLMForCausalLM, NCLMForSequenceClassification),
            (RGBNRNNConfig, RGBNRNNModel, RGBNRNNForCausalLM, RGBNRNNForSequenceClassification))
# Every save_pretrained (Trainer checkpoints included) also writes the model's flat code files and an
# ``auto_map`` into config.json. The folder then loads with ``trust_remote_code=True`` where this package is not
# imported, and transformers' error there asks for exactly that instead of suggesting to upgrade transformers.
# Where the package is imported, its registered classes are used (transformers prefers them to remote code).
for _config, _base, _lm, _classifier in FAMILIES:
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _base, exist_ok=True)
    AutoModelForCausalLM.register(_config, _lm, exist_ok=True)
    for _cls, _auto in ((_config, "AutoConfig"), (_base, "AutoModel"), (_lm, "AutoModelForCausalLM"),
                        (_classifier, "AutoModelForSequenceClassification")):
        if _cls is not None:
            _cls.register_for_auto_class(_auto)
    if _classifier is not None:
        AutoModelForSequenceClassification.register(_config, _classifier, exist_ok=True)

# The word sense tagger (tasks/wsd_tagger.py trains and applies it).
AutoConfig.register(SenseTaggerConfig.model_type, SenseTaggerConfig, exist_ok=True)
AutoModelForTokenClassification.register(SenseTaggerConfig, SenseTaggerForTokenClassification, exist_ok=True)
SenseTaggerConfig.register_for_auto_class("AutoConfig")
SenseTaggerForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")

__all__ = [
    "TopicContextCollator", "make_bow", "build_vocabularies", "check_vocabularies", "documents_from_lists",
    "load_documents", "load_vocabularies", "record_vocabularies", "save_vocabularies", "synthetic_documents",
    "tokenize_text", "PROTOCOLS", "evaluate_perplexity", "evaluate_steering", "fit_lda_judge", "topic_coherence",
    "topic_diversity", "evaluate_topics", "METRICS", "load_metric", "metric_path",
    "LSTMLMConfig", "LSTMLMForCausalLM", "LSTMLMModel", "TCNLMConfig", "TCNLMModel", "TCNLMForCausalLM",
    "TopicRNNConfig", "TopicRNNModel", "TopicRNNForCausalLM", "TopicRNNForSequenceClassification", "TopicLMTrainer",
    "NCLMConfig", "NCLMModel", "NCLMForCausalLM", "LSTMLMForSequenceClassification", "TCNLMForSequenceClassification",
    "NCLMForSequenceClassification",
    "RGBNRNNConfig", "RGBNRNNModel", "RGBNRNNForCausalLM", "RGBNRNNForSequenceClassification",
    "pretrain_topic_model", "steering_recipe", "STEERING_RECIPE", "evaluate_retrieval", "extract_document_features",
    "SenseTaggerConfig", "SenseTaggerForTokenClassification",
]
