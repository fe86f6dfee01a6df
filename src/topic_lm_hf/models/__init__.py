"""Model families. Each family is a configuration file and a modeling file side by side, flat, so that
Hub remote code copies them with the shared files they import: ``configuration_common.py`` (configuration
side), ``modeling_recurrent.py`` (outputs, running recurrent layers, the recurrent base),
``modeling_conditioning.py`` (topic conditioning and generation) and ``modeling_document.py`` (the
document representation and classifier head)."""

from .configuration_lstm_lm import LSTMLMConfig
from .configuration_nclm import NCLMConfig
from .configuration_rgbn_rnn import RGBNRNNConfig
from .configuration_sense_tagger import SenseTaggerConfig
from .configuration_tcnlm import TCNLMConfig
from .configuration_topic_rnn import TopicRNNConfig
from .modeling_lstm_lm import LSTMLMForCausalLM, LSTMLMForSequenceClassification, LSTMLMModel
from .modeling_nclm import NCLMForCausalLM, NCLMForSequenceClassification, NCLMModel
from .modeling_rgbn_rnn import RGBNRNNForCausalLM, RGBNRNNForSequenceClassification, RGBNRNNModel
from .modeling_sense_tagger import SenseTaggerForTokenClassification
from .modeling_tcnlm import TCNLMForCausalLM, TCNLMForSequenceClassification, TCNLMModel
from .modeling_topic_rnn import TopicRNNForCausalLM, TopicRNNForSequenceClassification, TopicRNNModel

__all__ = ["LSTMLMConfig", "LSTMLMModel", "LSTMLMForCausalLM", "TCNLMConfig", "TCNLMModel", "TCNLMForCausalLM",
           "TopicRNNConfig", "TopicRNNModel", "TopicRNNForCausalLM", "TopicRNNForSequenceClassification",
           "NCLMConfig", "NCLMModel", "NCLMForCausalLM",
           "LSTMLMForSequenceClassification", "TCNLMForSequenceClassification", "NCLMForSequenceClassification",
           "RGBNRNNConfig", "RGBNRNNModel", "RGBNRNNForCausalLM", "RGBNRNNForSequenceClassification",
           "SenseTaggerConfig", "SenseTaggerForTokenClassification"]
