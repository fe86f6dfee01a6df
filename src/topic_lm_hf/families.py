"""The family registry: one record per model family, from which every list of families in the package is derived.

A :class:`Family` holds what the package needs to know about a family: its configuration and model classes (the
Auto classes register them), the paragraph its Hub card shows, its steering recipe (``topic-lm train``'s default
configuration values for a new topic model), its short name in the benchmark scripts, its label in printed output,
its named variants (the papers' variants the package implements, each the configuration values that make it: TCNLM's
naive mixture of experts, TopicRNN's cells, NCLM's LTA / ETA / LETA with or without SDT, GBN-RNN and rGBN-RNN), and
its sizes in its configuration's own fields: the demo's (``topic-lm demo``, ``scripts/benchmark_demo.py``) and the
tests' tiny ones. Whether it is a topic family is not declared but read from its causal LM's class
(:class:`TopicFamilyForCausalLM`). The demo, the tests and the scripts derive their lists of families, variants, labels
and sizes from the records (``tests/conftest.py``'s ``variants`` and ``tiny_model``, ``demo.demo_families``), so
that a registered family is tested and demonstrated without editing them.

Adding a family is writing its ``configuration_*`` / ``modeling_*`` files and one :func:`register_family` call::

    register_family(Family(MyConfig, MyModel, MyForCausalLM, MyForSequenceClassification, label="MyLM",
                           card=dict(name=..., paper=..., equation=..., departures=...),
                           variants={"my_lm": {}, "my_lm-other": {"some_field": "other"}},
                           demo_sizes=dict(DEMO_SIZES, num_topics=DEMO_TOPICS),
                           tiny_sizes={"embedding_size": 16, "hidden_size": 16, "num_topics": 4}))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Optional

from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          PretrainedConfig, PreTrainedModel)

from .models import (LSTMLMConfig, LSTMLMForCausalLM, LSTMLMForSequenceClassification, LSTMLMModel, NCLMConfig,
                     NCLMForCausalLM, NCLMForSequenceClassification, NCLMModel, RGBNRNNConfig, RGBNRNNForCausalLM,
                     RGBNRNNForSequenceClassification, RGBNRNNModel, TCNLMConfig, TCNLMForCausalLM,
                     TCNLMForSequenceClassification, TCNLMModel, TopicRNNConfig, TopicRNNForCausalLM,
                     TopicRNNForSequenceClassification, TopicRNNModel)
from .models.modeling_topic_family import TopicFamilyForCausalLM

# The shared topic output prior (TopicWordPriorMixin): part of every topic family's steering recipe, left out where
# the configuration class says it is unavailable (``output_prior_unavailable``).
SHARED_PRIOR = {"topic_output_bias": "beta", "topic_prior_weight_init": 1.0}

# The demo's size (``topic-lm demo``): small enough to learn something in about a minute of CPU each. Every family's
# ``demo_sizes`` spells it in its configuration's own fields (rGBN-RNN: one layer, sizes as per-layer lists), with its
# KL term annealed over 100 steps where it has an annealed one (TCNLM, TopicRNN).
DEMO_SIZES = dict(embedding_size=128, hidden_size=128, dropout=0.2)
DEMO_TOPICS = 20
# The tests' tiny LSTM (``tests/conftest.py``'s ``tiny_model`` builds every variant at its family's ``tiny_sizes``).
_TINY_LSTM = {"embedding_size": 16, "hidden_size": 16, "dropout": 0.0}


@dataclass(frozen=True)
class Family:
    """One model family of the package (see the module docstring)."""

    config_class: type[PretrainedConfig]
    base_model_class: type
    causal_lm_class: type
    classifier_class: Optional[type]
    card: dict  # the Hub card's paragraph: name, paper, equation, departures
    # configuration values that make its topics matter and steer (departures from its paper, one value each)
    steering_recipe: dict = field(default_factory=dict)
    benchmark_name: str = ""  # its name in the benchmark scripts' model tables (default: its model_type)
    # The papers' variants the package implements: variant name -> the configuration values that make it (on top of
    # the configuration class's defaults). Names are unique across the families; the first variant is the family's
    # representative, the paper's full model, where a test runs one variant per family. Default: one variant, the
    # configuration class's defaults, named by the model_type.
    variants: dict = field(default_factory=dict)
    label: str = ""  # its name in printed output: the demo's lines and tables (default: its model_type)
    # its configuration values at the demo's size (DEMO_SIZES, DEMO_TOPICS topics); none: the demo does not train it
    demo_sizes: dict = field(default_factory=dict)
    # its configuration values at the tests' tiny size (tests/conftest.py's tiny_model); a variant's go on top
    tiny_sizes: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.variants:
            object.__setattr__(self, "variants", {self.model_type: {}})
        if not self.label:
            object.__setattr__(self, "label", self.model_type)
        # read-only views: a recipe, a variant or sizes edited in place would change every later model of the family
        # (per-layer lists are kept as tuples, which the configuration classes take as they take lists)
        for name in ("steering_recipe", "demo_sizes", "tiny_sizes"):
            object.__setattr__(self, name, _read_only(getattr(self, name)))
        object.__setattr__(self, "variants", MappingProxyType({name: _read_only(values)
                                                               for name, values in self.variants.items()}))

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def is_topic_model(self) -> bool:
        return issubclass(self.causal_lm_class, TopicFamilyForCausalLM)

    @property
    def short_name(self) -> str:
        return self.benchmark_name or self.model_type

    @property
    def representative(self) -> str:
        """The name of the family's representative variant: its first one (the paper's full model)."""
        return next(iter(self.variants))


def _read_only(values: dict) -> MappingProxyType:
    return MappingProxyType({k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


FAMILIES: dict[str, Family] = {}  # model_type -> Family, in the order they were registered


def register_family(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` and register its classes with the Auto classes (``AutoConfig``,
    ``AutoModel``, ``AutoModelForCausalLM``, ``AutoModelForSequenceClassification``), also for remote code: every
    ``save_pretrained`` then writes the model's flat code files and an ``auto_map``, so that the folder loads with
    ``trust_remote_code=True`` where this package is not imported. Where it is imported, its registered classes
    are used (transformers prefers them to remote code)."""
    if family.steering_recipe and not family.is_topic_model:
        raise ValueError(f"{family.model_type}: a steering recipe is for a topic family "
                         f"({family.causal_lm_class.__name__} is not a TopicFamilyForCausalLM)")
    taken = {name: other.model_type for other in FAMILIES.values() if other.model_type != family.model_type
             for name in other.variants}
    clashes = [f"{name!r} (of {taken[name]})" for name in family.variants if name in taken]
    if clashes:
        raise ValueError(f"{family.model_type}: variant names are unique across the families; "
                         f"{', '.join(clashes)} are taken")
    _check_family(family)
    config = family.config_class
    AutoConfig.register(config.model_type, config, exist_ok=True)
    AutoModel.register(config, family.base_model_class, exist_ok=True)
    AutoModelForCausalLM.register(config, family.causal_lm_class, exist_ok=True)
    if family.classifier_class is not None:
        AutoModelForSequenceClassification.register(config, family.classifier_class, exist_ok=True)
    for cls, auto in ((config, "AutoConfig"), (family.base_model_class, "AutoModel"),
                      (family.causal_lm_class, "AutoModelForCausalLM"),
                      (family.classifier_class, "AutoModelForSequenceClassification")):
        if cls is not None:
            cls.register_for_auto_class(auto)
    FAMILIES[family.model_type] = family
    return family


def _check_family(family: Family) -> None:
    """Everything :func:`register_family` needs, checked before it registers anything (a failed registration leaves
    the registry and the Auto classes as they were): the classes, a model_type of its own, recipes and variants
    naming the configuration's fields, and so do its sizes."""
    config = family.config_class
    if not (isinstance(config, type) and issubclass(config, PretrainedConfig)) or not getattr(config, "model_type", ""):
        raise ValueError(f"config_class must be a PretrainedConfig subclass with a model_type, got {config!r}")
    for role in ("base_model_class", "causal_lm_class", "classifier_class"):
        cls = getattr(family, role)
        if cls is None and role == "classifier_class":
            continue
        if not (isinstance(cls, type) and issubclass(cls, PreTrainedModel)) or cls.config_class is not config:
            raise ValueError(f"{config.model_type}: {role} must be a PreTrainedModel subclass whose config_class is "
                             f"{config.__name__}, got {cls!r}")
    registered = FAMILIES.get(config.model_type)
    if registered is not None and registered != family:
        raise ValueError(f"model_type {config.model_type!r} is already the family of {registered.causal_lm_class.__name__}"
                         ": give the new family a model_type of its own")
    fields = config().to_dict()
    for what, values in [("steering_recipe", family.steering_recipe), ("demo_sizes", family.demo_sizes),
                         ("tiny_sizes", family.tiny_sizes),
                         *((f"variant {name!r}", v) for name, v in family.variants.items())]:
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"{config.model_type}: {what} names {unknown}, which {config.__name__} does not have")


def family_of(model_type: str) -> Family:
    """The registered family of ``model_type``; a ``ValueError`` that lists the families otherwise."""
    if model_type not in FAMILIES:
        raise ValueError(f"unknown model family {model_type!r}: the package's families are {list(FAMILIES)}")
    return FAMILIES[model_type]


def topic_families() -> list[Family]:
    """The registered families that have topics."""
    return [f for f in FAMILIES.values() if f.is_topic_model]


def variant_of(name: str) -> tuple[Family, dict]:
    """The family of variant ``name`` and the configuration values that make the variant; a ``ValueError`` that
    lists the variants otherwise."""
    for family in FAMILIES.values():
        if name in family.variants:
            return family, dict(family.variants[name])
    raise ValueError(f"unknown variant {name!r}: the families' variants are "
                     f"{[v for f in FAMILIES.values() for v in f.variants]}")


# ----------------------------------------------------------------------------------------------
# the package's five families
# ----------------------------------------------------------------------------------------------

register_family(Family(
    LSTMLMConfig, LSTMLMModel, LSTMLMForCausalLM, LSTMLMForSequenceClassification, benchmark_name="lstm",
    label="LSTM", variants={"lstm_lm": {}}, demo_sizes=DEMO_SIZES, tiny_sizes=_TINY_LSTM,
    card=dict(
        name="LSTM language model",
        paper="the baseline of every topic-guided LM paper (Lau, Baldwin & Cohn 2017; Wang et al. 2018)",
        equation="p(w_t | w_<t) = softmax(W h_t + b), h_t = LSTM(x_t, h_{t-1})",
        departures="none: it is the same-size baseline every topic model here is compared with.")))

register_family(Family(
    TCNLMConfig, TCNLMModel, TCNLMForCausalLM, TCNLMForSequenceClassification, benchmark_name="tcnlm",
    label="TCNLM", steering_recipe=dict(SHARED_PRIOR),
    demo_sizes=dict(DEMO_SIZES, num_topics=DEMO_TOPICS, kl_annealing_steps=100),
    tiny_sizes={**_TINY_LSTM, "num_topics": 4, "num_factors": 8, "encoder_hidden_size": 16, "topic_embedding_size": 8},
    # the paper's model and its naive mixture of experts (one LSTM per topic, mixed by the topic proportions)
    variants={"tcnlm": {}, "tcnlm-naive_moe": {"lm_type": "naive_moe"}},
    card=dict(
        name="TCNLM (topic compositional neural language model)",
        paper="Wang et al., AISTATS 2018, \"Topic Compositional Neural Language Model\"",
        equation="every LSTM weight is W(t) = W_a diag(W_b t) W_c, with t the document's topic proportions from a "
                 "neural topic model (a VAE over the bag of words)",
        departures="the KL term is annealed from 0 over `kl_annealing_steps` (without it the topic posterior "
                   "collapsed on APNEWS); the topic model's loss is normalised per `topic_loss_normalization`.")))

register_family(Family(
    TopicRNNConfig, TopicRNNModel, TopicRNNForCausalLM, TopicRNNForSequenceClassification,
    benchmark_name="topic_rnn", label="TopicRNN",
    demo_sizes=dict(DEMO_SIZES, num_topics=DEMO_TOPICS, kl_annealing_steps=100),
    tiny_sizes={**_TINY_LSTM, "num_topics": 4, "inference_hidden_size": 16},
    steering_recipe={**SHARED_PRIOR, "bow_loss_weight": 1.0, "theta_transform": "softmax"},
    # the paper's three cells (the LSTM first), and the LSTM with softmax topic proportions (the steering recipe's)
    variants={"topic_rnn-lstm": {"cell": "lstm"}, "topic_rnn-rnn": {"cell": "rnn"}, "topic_rnn-gru": {"cell": "gru"},
              "topic_rnn-softmax": {"cell": "lstm", "theta_transform": "softmax"}},
    card=dict(
        name="TopicRNN",
        paper="Dieng, Wang, Gao & Paisley, ICLR 2017, \"TopicRNN: A Recurrent Neural Network with Long-Range "
              "Semantic Dependency\"",
        equation="p(w_t | h_t, theta, l_t) = softmax(V h_t + (1 - l_t) B theta), with l_t the stop-word indicator, "
                 "marginalised at evaluation",
        departures="the cell (RNN, LSTM, GRU) is a configuration field; theta is inferred from the context the "
                   "collator gives (the preceding sentences under the causal protocols).")))

register_family(Family(
    NCLMConfig, NCLMModel, NCLMForCausalLM, NCLMForSequenceClassification, benchmark_name="nclm",
    label="NCLM", demo_sizes=dict(DEMO_SIZES, num_topics=DEMO_TOPICS),
    tiny_sizes={**_TINY_LSTM, "num_topics": 4, "encoder_hidden_size": 16, "etr_top_n": 5, "num_topic_samples": 2},
    steering_recipe={**SHARED_PRIOR, "diversity_weight": 1.0},
    # the paper's full model (LETA with sentence-level topics) first, then its ablations
    variants={"nclm-leta-sdt": {"variant": "leta", "sentence_topics": True},
              "nclm-lta": {"variant": "lta", "sentence_topics": False},
              "nclm-eta": {"variant": "eta", "sentence_topics": False},
              "nclm-leta": {"variant": "leta", "sentence_topics": False},
              "nclm-eta-sdt": {"variant": "eta", "sentence_topics": True}},
    card=dict(
        name="NCLM (neural composite language model)",
        paper="Chaudhary, Schütze & Gupta, ICML 2020, \"Explainable and Discourse Topic-aware Neural Language "
              "Understanding\"",
        equation="the LSTM reads [x_t; document topics] (LTA), the output reads them (ETA: explainable topic "
                 "words as an embedding), or both (LETA); SDT adds sentence-level topics",
        departures="see the package's notes on NCLM (the official code's choices where the paper is silent).")))

register_family(Family(
    RGBNRNNConfig, RGBNRNNModel, RGBNRNNForCausalLM, RGBNRNNForSequenceClassification, benchmark_name="rgbn",
    label="rGBN-RNN",
    demo_sizes=dict(embedding_size=DEMO_SIZES["embedding_size"], hidden_sizes=[DEMO_SIZES["hidden_size"]],
                    topic_sizes=[DEMO_TOPICS], dropout=DEMO_SIZES["dropout"]),
    # two topic layers of 4 and 2 topics, two LSTM layers of 16
    tiny_sizes={"embedding_size": 16, "topic_sizes": [4, 2], "hidden_sizes": [16, 16]},
    # sparser topics (PGBN's Gibbs sampler's pseudo-count; the paper's TLASGR code uses 0.1): pre-trained on APNEWS
    # they reached NPMI 0.060 against 0.031 with 0.1 (scripts/benchmark_steering.py)
    steering_recipe={**SHARED_PRIOR, "eta_phi": 0.01},
    # rGBN-RNN and the paper's GBN-RNN (no transitions between the sentences' topics), named as in the benchmarks
    variants={"rgbn": {"recurrent": True}, "gbn": {"recurrent": False}},
    card=dict(
        name="rGBN-RNN (recurrent gamma belief network guided RNN)",
        paper="Guo, Chen, Lu & Zhou, ICML 2020, \"Recurrent Hierarchical Topic-Guided RNN for Language "
              "Generation\"",
        equation="a multi-layer recurrent gamma belief network over the sentences of a document (Weibull "
                 "encoder) gates a stacked RNN, layer by layer; the topics Phi are sampled by TLASGR-MCMC",
        departures="Phi's sampler state is stored in the weights file (`phi`, `pi` buffers), so training resumes "
                   "exactly.")))

__all__ = ["Family", "FAMILIES", "DEMO_SIZES", "DEMO_TOPICS", "SHARED_PRIOR", "family_of", "register_family", "topic_families", "variant_of"]
