"""The family registry (``topic_lm_hf.families``): every list of families in the package is derived from it, and a
new family is a subclass of the shared pieces, a handful of methods and one record.

The toy family below is a sixth topic family written the way the guide asks: its config subclasses the LSTM LM's,
its body is the LSTM LM's body plus a one-layer topic encoder and a topic-word matrix, and its causal LM subclasses
:class:`TopicFamilyForCausalLM` and implements only ``topic_word_scores``, ``topic_word_distributions``,
``infer_topics``, ``topic_model_parameters``, ``topic_model_loss``, ``topic_word_log_probs``, a ``forward`` that
declares its keywords and runs the template, and two of the template's stages (``language_model_features`` and
``loss_terms``). Once
registered, the Auto classes build it, ``topic-lm``'s recipe, the Hub card, topic-model pre-training, the
collator and the shared model tester's checks (padding, state equivalence, cached generation) all work with it."""


import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin

import model_tester
from conftest import TINY_CORPUS
import topic_lm_hf
from topic_lm_hf import TopicContextCollator, pretrain_topic_model, steering_recipe
from topic_lm_hf.demo import demo_families
from topic_lm_hf.families import FAMILIES, SHARED_PRIOR, Family, register_family
from topic_lm_hf.models import LSTMLMConfig
from topic_lm_hf.models.configuration_common import TopicConfigMixin
from topic_lm_hf.models.modeling_conditioning import normalize_topic_kwargs, topic_ids_to_mixture
from topic_lm_hf.models.modeling_generation import TopicGenerationMixin
from topic_lm_hf.models.modeling_lstm_lm import LSTMLMModel
from topic_lm_hf.models.modeling_recurrent import RecurrentPreTrainedModel
from topic_lm_hf.models.modeling_topic_family import LanguageModelPass, LossTerm, TopicFamilyForCausalLM


class ToyTopicConfig(TopicConfigMixin, LSTMLMConfig):
    model_type = "toy_topic_lm"

    def __init__(self, topic_vocab_size=100, num_topics=4, topic_word_ids=None, topic_output_bias="beta",
                 topic_prior_weight_init=1.0, topic_prior_weight_trainable=True, kl_annealing_steps=0, **kwargs):
        self.topic_vocab_size, self.num_topics = topic_vocab_size, num_topics
        self.topic_word_ids = topic_word_ids
        self.topic_output_bias, self.topic_prior_weight_init = topic_output_bias, topic_prior_weight_init
        self.topic_prior_weight_trainable = topic_prior_weight_trainable
        self.kl_annealing_steps = kl_annealing_steps
        super().__init__(**kwargs)


class ToyTopicPreTrainedModel(RecurrentPreTrainedModel):
    config_class = ToyTopicConfig
    conditioning_inputs = ("context_bow", "topic_ids", "topic_mixture")
    training_context = "others"


class ToyTopicModel(LSTMLMModel, ToyTopicPreTrainedModel):
    """The LSTM LM's body, plus t = softmax(encoder(bag of words)) and the topics' word logits beta."""

    config_class = ToyTopicConfig

    def __init__(self, config):
        super().__init__(config)
        self.encoder = nn.Linear(config.topic_vocab_size, config.num_topics)
        self.beta = nn.Parameter(torch.randn(config.num_topics, config.topic_vocab_size) * 0.5)


class ToyTopicForCausalLM(TopicFamilyForCausalLM, ToyTopicPreTrainedModel, TopicGenerationMixin, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.model = ToyTopicModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self._init_topic_word_prior()
        self.post_init()

    # the topic API: five methods
    def topic_word_scores(self, layer: int) -> torch.Tensor:
        return self.model.beta

    def topic_word_distributions(self, *, layer=None) -> torch.Tensor:
        self.check_layer(layer)
        return torch.softmax(self.model.beta.float(), -1)

    def infer_topics(self, context_bow, *, layer=None) -> torch.Tensor:
        self.check_layer(layer)
        bow = normalize_topic_kwargs(self.config.num_topics, self.config.topic_vocab_size,
                                     context_bow=context_bow)["context_bow"].to(self.device)
        return torch.softmax(self.model.encoder(bow.log1p()), -1)

    def topic_model_parameters(self) -> list[nn.Parameter]:
        return [*self.model.encoder.parameters(), self.model.beta]

    def topic_model_loss(self, context_bow, **inputs) -> torch.Tensor:
        bow = context_bow.to(self.device).float()
        log_p = self.topic_word_log_probs(self.infer_topics(bow))
        return -(bow * log_p).sum() / bow.sum().clamp_min(1)

    def topic_word_log_probs(self, t: torch.Tensor) -> torch.Tensor:
        return (t.float() @ self.topic_word_distributions()).clamp_min(1e-10).log()

    # forward declares the keywords the family reads (generate checks its keywords against this signature) and
    # runs the template; the template's stages: the features under t, and the topic model's term
    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, state=None, labels=None,
                use_cache=None, context_bow=None, topic_ids=None, topic_mixture=None, topic_representation=None,
                return_dict=None, **kwargs):
        return super().forward(input_ids, attention_mask, inputs_embeds, state, labels, use_cache,
                               topic_representation=topic_representation, return_dict=return_dict,
                               context_bow=context_bow, topic_ids=topic_ids, topic_mixture=topic_mixture, **kwargs)

    def language_model_features(self, topics, topic_representation, *, input_ids, attention_mask, inputs_embeds,
                                state, labels, use_cache, output_hidden_states, logits_to_keep, **inputs):
        base = self.model(input_ids, attention_mask, inputs_embeds, state, use_cache)
        b = base.last_hidden_state.shape[0]
        t = topic_representation
        if t is None:
            if "topic_ids" in topics:
                t = topic_ids_to_mixture(topics["topic_ids"], self.config.num_topics)
            elif "topic_mixture" in topics:
                t = topics["topic_mixture"]
            elif "context_bow" in topics:
                t = self.infer_topics(topics["context_bow"])
            else:
                t = torch.full((b, self.config.num_topics), 1 / self.config.num_topics)
        t = t.to(self.device)
        return LanguageModelPass(base.last_hidden_state, base.state, topic_mixture=t, topic_representation=t,
                                 details=dict(context_bow=topics.get("context_bow")))

    def loss_terms(self, run, labels):
        bow = run.details["context_bow"]
        return [] if bow is None else [LossTerm(self.topic_model_loss(bow))]


RECIPE = {**SHARED_PRIOR, "topic_prior_weight_init": 0.5}


@pytest.fixture
def toy_family():
    """The toy family registered (one record) for the test, and taken out of the registry after it."""
    family = register_family(Family(ToyTopicConfig, ToyTopicModel, ToyTopicForCausalLM, None,
                                    card=dict(name="Toy topic LM", paper="none", equation="softmax(W h + lambda "
                                              "log(V_c beta^T t))", departures="none"),
                                    steering_recipe=RECIPE, benchmark_name="toy"))
    yield family
    FAMILIES.pop(family.model_type)


def test_the_registry_lists_the_five_families_and_derives_the_recipes_and_cards():
    assert list(FAMILIES) == ["lstm_lm", "tcnlm", "topic_rnn", "nclm", "rgbn_rnn"]
    assert [f.model_type for f in topic_lm_hf.families.topic_families()] == ["tcnlm", "topic_rnn", "nclm",
                                                                             "rgbn_rnn"]
    assert set(topic_lm_hf.STEERING_RECIPE) == {"tcnlm", "topic_rnn", "nclm", "rgbn_rnn"}
    assert steering_recipe("lstm_lm") == {}
    with pytest.raises(ValueError, match="unknown model family 'tcnml'"):
        topic_lm_hf.families.family_of("tcnml")


def test_every_family_names_its_papers_variants_and_each_is_a_configuration():
    """A variant is a name and the configuration values that make it: the configuration class takes them, and the
    first variant (the family's representative) is the paper's full model."""
    assert {name: list(f.variants) for name, f in FAMILIES.items()} == {
        "lstm_lm": ["lstm_lm"], "tcnlm": ["tcnlm", "tcnlm-naive_moe"],
        "topic_rnn": ["topic_rnn-lstm", "topic_rnn-rnn", "topic_rnn-gru", "topic_rnn-softmax"],
        "nclm": ["nclm-leta-sdt", "nclm-lta", "nclm-eta", "nclm-leta", "nclm-eta-sdt"], "rgbn_rnn": ["rgbn", "gbn"]}
    assert [f.representative for f in FAMILIES.values()] == ["lstm_lm", "tcnlm", "topic_rnn-lstm", "nclm-leta-sdt",
                                                              "rgbn"]
    for family in FAMILIES.values():
        for name, values in family.variants.items():
            assert topic_lm_hf.families.variant_of(name) == (family, values)
            config = family.config_class(**values)
            assert {k: getattr(config, k) for k in values} == values, name
    with pytest.raises(ValueError, match="unknown variant 'nclm-xyz'"):
        topic_lm_hf.families.variant_of("nclm-xyz")


def test_every_family_has_its_label_and_sizes_its_configuration_takes():
    """A family's label is its name in printed output (the demo's lines and tables); its demo and tiny sizes are
    configuration values of its own configuration class (per-layer sizes kept as tuples, taken as lists)."""
    assert {name: f.label for name, f in FAMILIES.items()} == {
        "lstm_lm": "LSTM", "tcnlm": "TCNLM", "topic_rnn": "TopicRNN", "nclm": "NCLM", "rgbn_rnn": "rGBN-RNN"}
    assert demo_families() == ["tcnlm", "topic_rnn", "nclm", "rgbn_rnn"]
    for family in FAMILIES.values():
        for sizes in (family.demo_sizes, family.tiny_sizes):
            assert sizes, family.model_type
            config = family.config_class(**sizes)
            assert {k: getattr(config, k) for k in sizes} == {
                k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()}, family.model_type


def test_a_family_without_named_variants_has_one_and_variant_names_are_unique(toy_family):
    assert toy_family.variants == {"toy_topic_lm": {}} and toy_family.representative == "toy_topic_lm"
    # no label: its model_type; no demo sizes: the demo does not train it
    assert toy_family.label == "toy_topic_lm" and "toy_topic_lm" not in demo_families()
    clash = Family(ToyTopicConfig, ToyTopicModel, ToyTopicForCausalLM, None, card={}, variants={"tcnlm": {}})
    with pytest.raises(ValueError, match=r"variant names are unique across the families; 'tcnlm' \(of tcnlm\)"):
        register_family(clash)


def test_a_toy_sixth_family_is_one_record_and_a_few_methods(toy_family, tiny_vocabularies):
    tok, topic_tok = tiny_vocabularies
    assert FAMILIES["toy_topic_lm"] is toy_family and toy_family.is_topic_model
    # the Auto classes, topic-lm train's recipe and the Hub card come from the record
    config = AutoConfig.for_model("toy_topic_lm", **topic_lm_hf.models.configuration_common.config_kwargs_from_tokenizers(
        tok, topic_tok, num_topics=3, embedding_size=8, hidden_size=8, dropout=0.0))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert type(model) is ToyTopicForCausalLM
    assert steering_recipe("toy_topic_lm") == RECIPE
    from topic_lm_hf.hub import card_tags, family_card

    assert family_card("toy_topic_lm")["name"] == "Toy topic LM" and "topic-model" in card_tags(config)
    # the shared topic API: get_topics with one signature, the layer checked once
    topics = model.get_topics(top_n=2, topic_tokenizer=topic_tok)
    assert len(topics) == 3 and all(len(words) == 2 and "<unk>" not in words for words in topics)
    with pytest.raises(ValueError, match=r"layer must be an integer in \[1, 1\]"):
        model.get_topics(layer=2, topic_tokenizer=topic_tok)
    # the collator and topic-model pre-training read what it declares
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining")
    rows = collator.prepare(topic_lm_hf.documents_from_lists(TINY_CORPUS * 2))  # "others": each sentence's context
    before = model.model.beta.detach().clone()
    result = pretrain_topic_model(model, rows, collator, steps=5, batch_size=4)
    assert result.steps == 5 and result.losses[0] > 0 and not torch.equal(before, model.model.beta)
    # generation with topics, guided
    model.eval()
    out = model.generate(torch.tensor([[tok.bos_token_id]]), topic_ids=[1], topic_guidance_scale=2.0,
                         max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (1, 4)


@pytest.mark.parametrize("check", ["padding-left", "padding-right", "state-left", "state-right", "generation"])
def test_the_shared_model_tester_runs_on_the_toy_family(toy_family, check, request, monkeypatch):
    monkeypatch.setitem(model_tester.FAMILIES, "toy", model_tester.Family(
        ToyTopicConfig, ToyTopicForCausalLM, ToyTopicModel, dict(num_topics=3, embedding_size=8, hidden_size=8,
                                                                 dropout=0.0), state_size=2,
        conditions=model_tester._topic_conditions(simplex=True), reads=("context_bow",)))
    tester = model_tester.ModelTester("toy", model_tester.load_contract_data(request))
    kind, _, side = check.partition("-")
    if kind == "padding":
        tester.check_padded_rows_equal_unpadded_rows(side)
    elif kind == "state":
        tester.check_state_equivalence(side)
    else:
        for condition in ("prior", "context_bow", "topic_ids", "topic_mixture-shared"):
            tester.check_generation(condition, "greedy")


def test_a_registration_that_cannot_be_made_changes_nothing_and_recipes_are_read_only():
    """register_family checks the whole record before it registers anything: a record that re-uses a package
    family's model_type (it used to re-point lstm_lm in the Auto registry, and every saved LSTM then failed to load),
    a record with a None class, or a recipe or sizes naming a field its configuration lacks, is refused and leaves the
    registry and the Auto classes as they were. A family's recipe, variants and sizes cannot be edited in place."""
    from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM

    class Impostor(LSTMLMForCausalLM):
        pass

    before = (dict(FAMILIES), AutoModelForCausalLM._model_mapping[LSTMLMConfig])
    with pytest.raises(ValueError, match="'lstm_lm' is already the family of LSTMLMForCausalLM"):
        register_family(Family(LSTMLMConfig, FAMILIES["lstm_lm"].base_model_class, Impostor, None, card={},
                               variants={"impostor": {}}))
    with pytest.raises(ValueError, match="causal_lm_class must be a PreTrainedModel subclass"):
        register_family(Family(ToyTopicConfig, ToyTopicModel, None, None, card={}))
    with pytest.raises(ValueError, match=r"steering_recipe names \['no_such_field'\]"):
        register_family(Family(ToyTopicConfig, ToyTopicModel, ToyTopicForCausalLM, None, card={},
                               steering_recipe={"no_such_field": 1}))
    with pytest.raises(ValueError, match=r"demo_sizes names \['hidden_sizes'\]"):
        register_family(Family(ToyTopicConfig, ToyTopicModel, ToyTopicForCausalLM, None, card={},
                               demo_sizes={"hidden_sizes": [8]}))
    assert (dict(FAMILIES), AutoModelForCausalLM._model_mapping[LSTMLMConfig]) == before
    with pytest.raises(TypeError):
        FAMILIES["tcnlm"].steering_recipe["bow_loss_weight"] = 5.0
    with pytest.raises(TypeError):
        FAMILIES["tcnlm"].variants["tcnlm"]["num_topics"] = 5
    with pytest.raises(TypeError):
        FAMILIES["tcnlm"].demo_sizes["num_topics"] = 5
    with pytest.raises(TypeError):
        FAMILIES["lstm_lm"].tiny_sizes["hidden_size"] = 5
    with pytest.raises(AttributeError):
        FAMILIES["rgbn_rnn"].tiny_sizes["hidden_sizes"].append(16)  # per-layer sizes are tuples
