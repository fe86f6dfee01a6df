"""topic-lm-hf: topic-guided neural language models as Hugging Face transformers models."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .collator import TopicContextCollator, make_bow
from .data import (build_vocabularies, check_vocabularies, documents_from_lists, load_documents,
                   load_vocabularies, record_vocabularies, save_vocabularies, synthetic_documents, tokenize_text)
from .evaluation import (PROTOCOLS, evaluate_perplexity, evaluate_steering, fit_lda_judge, topic_coherence,
                         topic_diversity)
from .evaluation.topic_eval import evaluate_topics
from .models import (LSTMLMConfig, LSTMLMForCausalLM, LSTMLMModel, NCLMConfig, NCLMForCausalLM, NCLMModel,
                     TCNLMConfig, TCNLMForCausalLM, TCNLMModel, TopicRNNConfig, TopicRNNForCausalLM, TopicRNNForSequenceClassification, TopicRNNModel)
from .models import RGBNRNNConfig, RGBNRNNForCausalLM, RGBNRNNModel
from .pretraining import pretrain_topic_model
from .trainer import TopicLMTrainer

__version__ = "0.1.0"

# Auto-class registration: importing the package makes every model loadable with the Auto classes.
for _config, _base, _lm in ((LSTMLMConfig, LSTMLMModel, LSTMLMForCausalLM), (TCNLMConfig, TCNLMModel, TCNLMForCausalLM),
                            (TopicRNNConfig, TopicRNNModel, TopicRNNForCausalLM), (NCLMConfig, NCLMModel, NCLMForCausalLM)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _base, exist_ok=True)
    AutoModelForCausalLM.register(_config, _lm, exist_ok=True)
AutoModelForSequenceClassification.register(TopicRNNConfig, TopicRNNForSequenceClassification, exist_ok=True)

# Every save_pretrained (Trainer checkpoints included) also writes the model's flat code files and an
# ``auto_map`` into config.json. The folder then loads with ``trust_remote_code=True`` where this package is not
# imported, and transformers' error there asks for exactly that instead of suggesting to upgrade transformers.
# Where the package is imported, its registered classes are used (transformers prefers them to remote code).
for _cls, _auto in ((LSTMLMConfig, "AutoConfig"), (TCNLMConfig, "AutoConfig"), (TopicRNNConfig, "AutoConfig"),
                    (NCLMConfig, "AutoConfig"), (LSTMLMModel, "AutoModel"), (TCNLMModel, "AutoModel"),
                    (TopicRNNModel, "AutoModel"), (NCLMModel, "AutoModel"), (LSTMLMForCausalLM, "AutoModelForCausalLM"),
                    (TCNLMForCausalLM, "AutoModelForCausalLM"), (TopicRNNForCausalLM, "AutoModelForCausalLM"),
                    (NCLMForCausalLM, "AutoModelForCausalLM"),
                    (TopicRNNForSequenceClassification, "AutoModelForSequenceClassification")):
    _cls.register_for_auto_class(_auto)

# GBN-RNN / rGBN-RNN
AutoConfig.register(RGBNRNNConfig.model_type, RGBNRNNConfig, exist_ok=True)
AutoModel.register(RGBNRNNConfig, RGBNRNNModel, exist_ok=True)
AutoModelForCausalLM.register(RGBNRNNConfig, RGBNRNNForCausalLM, exist_ok=True)
for _cls, _auto in ((RGBNRNNConfig, "AutoConfig"), (RGBNRNNModel, "AutoModel"),
                    (RGBNRNNForCausalLM, "AutoModelForCausalLM")):
    _cls.register_for_auto_class(_auto)

__all__ = [
    "TopicContextCollator", "make_bow", "build_vocabularies", "check_vocabularies", "documents_from_lists",
    "load_documents", "load_vocabularies", "record_vocabularies", "save_vocabularies", "synthetic_documents",
    "tokenize_text", "PROTOCOLS", "evaluate_perplexity", "evaluate_steering", "fit_lda_judge", "topic_coherence",
    "topic_diversity", "evaluate_topics",
    "LSTMLMConfig", "LSTMLMForCausalLM", "LSTMLMModel", "TCNLMConfig", "TCNLMModel", "TCNLMForCausalLM",
    "TopicRNNConfig", "TopicRNNModel", "TopicRNNForCausalLM", "TopicRNNForSequenceClassification", "TopicLMTrainer",
    "NCLMConfig", "NCLMModel", "NCLMForCausalLM",
    "pretrain_topic_model",
]
__all__ += ["RGBNRNNConfig", "RGBNRNNModel", "RGBNRNNForCausalLM"]
