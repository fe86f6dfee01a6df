"""The shared topic output prior (``topic_output_bias="beta"``): lambda * log(V_c p(w | t)) on the topic words, for
every topic family, against a naive loop over the vocabulary, as the family's own topic-word distribution, added to
the logits of the same model without it, cached generation as uncached, and saved with the model."""

import math

import pytest
import torch
from conftest import topic_family_model, variants

from topic_lm_hf import AutoModelForCausalLM, NCLMConfig, TCNLMConfig
from topic_lm_hf.families import topic_families

# one variant per topic family, and TopicRNN with topic proportions (softmax theta) besides its Gaussian theta
FAMILIES = variants(topic_only=True, representative=True) + ["topic_rnn-softmax"]


def _with_prior(family, tok, topic_tok, weight=0.7):
    """The same weights twice: without the prior, and with it at lambda = ``weight``."""
    plain = topic_family_model(family, tok, topic_tok)
    prior = topic_family_model(family, tok, topic_tok, topic_output_bias="beta", topic_prior_weight_init=weight)
    missing, unexpected = prior.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["topic_prior_weight"] and not unexpected
    return plain, prior


def _representation(model, topic_ids):
    """The topic representation t that ``topic_ids`` give the family's LM."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[2, 4]] * len(topic_ids)), topic_ids=topic_ids)
    return out.topic_representation if not hasattr(model.model, "document_topics") else out.topic_mixture


@pytest.mark.parametrize("family", FAMILIES)
def test_the_prior_is_lambda_log_ratio_at_topic_words_and_zero_elsewhere(tiny_vocabularies, family):
    tok, topic_tok = tiny_vocabularies
    _, model = _with_prior(family, tok, topic_tok)
    t = _representation(model, [[1], [2]])
    with torch.no_grad():
        log_probs = model.topic_word_log_probs(t)
        prior = model.topic_word_prior(t)
    ids = model.config.topic_word_ids
    n_words = sum(i >= 0 for i in ids)
    expected = torch.zeros(2, model.config.vocab_size)
    for topic_index, lm_id in enumerate(ids):  # the naive loop over the topic vocabulary
        if lm_id >= 0:
            expected[:, lm_id] = 0.7 * (log_probs[:, topic_index] + math.log(n_words))
    torch.testing.assert_close(prior, expected)
    assert float(prior[:, tok.convert_tokens_to_ids("the")].abs().max()) == 0.0  # a stop word


@pytest.mark.parametrize("family", FAMILIES)
def test_the_expert_is_the_familys_own_topic_word_distribution(tiny_vocabularies, family):
    tok, topic_tok = tiny_vocabularies
    _, model = _with_prior(family, tok, topic_tok)
    t = _representation(model, [[1]])
    with torch.no_grad():
        probs = model.topic_word_log_probs(t).exp()[0]
    if family == "topic_rnn-lstm":  # theta = steering_scale * e_1: softmax(B theta) over the topic words
        B = model.topic_head.weight.detach()[:, 1] * model.config.steering_scale
        usable = torch.tensor([i >= 0 for i in model.config.topic_word_ids])
        expected = torch.softmax(B.masked_fill(~usable, float("-inf")), -1)
    elif family == "rgbn":  # theta^1 = e_1: column 1 of Phi^1
        expected = model.model.phi(1).float()[:, 1]
        expected = expected / expected.sum()
    else:  # TCNLM: beta_1; NCLM: the decoder at h = e_1; TopicRNN with topic proportions: softmax(B[:, 1])
        expected = model.topic_word_distributions()[1].float()
    torch.testing.assert_close(probs, expected, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("family", ["tcnlm", "nclm-leta-sdt", "rgbn"])
def test_the_logits_are_those_of_the_same_model_without_the_prior_plus_the_prior(tiny_vocabularies, family):
    tok, topic_tok = tiny_vocabularies
    plain, model = _with_prior(family, tok, topic_tok)
    ids = tok(["the court ruled", "police said the"], return_tensors="pt", padding=True)
    with torch.no_grad():
        base = plain(**ids, topic_ids=[[1], [3]])
        out = model(**ids, topic_ids=[[1], [3]])
    t = out.topic_mixture if family == "nclm-leta-sdt" else out.topic_representation
    with torch.no_grad():
        torch.testing.assert_close(out.logits, base.logits + model.topic_word_prior(t).unsqueeze(1))


def test_topic_rnn_with_lambda_zero_is_the_paper_model_and_the_prior_moves_topic_words(tiny_vocabularies):
    tok, topic_tok = tiny_vocabularies
    plain, model = _with_prior("topic_rnn-lstm", tok, topic_tok, weight=0.0)
    ids = tok(["the court ruled"], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**ids, topic_ids=[2]).logits, plain(**ids, topic_ids=[2]).logits)
        model.topic_prior_weight.fill_(2.0)
        steered = model(**ids, topic_ids=[2]).logits[0, -1]
        base = plain(**ids, topic_ids=[2]).logits[0, -1]
    word = tok.convert_tokens_to_ids(model.get_topics(top_n=1, topic_tokenizer=topic_tok)[2][0])
    assert steered[word] > base[word]  # topic 2's most probable word gains


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_with_the_prior_cached_equals_uncached_and_it_is_saved(tiny_vocabularies, family, tmp_path):
    tok, topic_tok = tiny_vocabularies
    _, model = _with_prior(family, tok, topic_tok, weight=1.3)
    tok.padding_side = "left"
    prompt = tok(["the court", "police said the"], return_tensors="pt", padding=True)
    kwargs = dict(topic_ids=[[1], [2]], max_new_tokens=5, min_new_tokens=5, do_sample=False)
    cached = model.generate(**prompt, **kwargs)
    assert torch.equal(model.generate(**prompt, **kwargs, use_cache=False), cached)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert float(loaded.topic_prior_weight.detach()) == pytest.approx(1.3)
    assert loaded.config.topic_output_bias == "beta"
    assert torch.equal(loaded.generate(**prompt, **kwargs), cached)


@pytest.mark.parametrize("config_class,extra", [
    (f.config_class, {"rgbn_rnn": {"topic_sizes": [4], "hidden_sizes": [8]}}.get(f.model_type, {}))
    for f in topic_families()])
def test_one_option_name_checked_the_same_way_in_every_family(config_class, extra):
    with pytest.raises(ValueError, match="topic_output_bias must be one of"):
        config_class(topic_output_bias="phi", **extra)
    with pytest.raises(ValueError, match="topic_prior_weight_init must be a finite number"):
        config_class(topic_output_bias="beta", topic_prior_weight_init=float("nan"), **extra)
    with pytest.raises(ValueError, match=r"topic_prior_weight_trainable must be True \(lambda learns\) or False"):
        config_class(topic_output_bias="beta", topic_prior_weight_trainable="no", **extra)
    config = config_class(topic_output_bias="beta", topic_prior_weight_init=1, **extra)
    assert config.topic_output_bias == "beta" and config.topic_prior_weight_init == 1.0
    assert config.topic_prior_weight_trainable is True


def test_nclm_eta_has_no_proportions_for_the_prior():
    with pytest.raises(ValueError, match="variant='lta' or 'leta'"):
        NCLMConfig(variant="eta", topic_output_bias="beta")


def test_tcnlm_naive_moe_has_no_output_for_the_prior_and_the_recipe_asks_the_same_question():
    from topic_lm_hf import steering_recipe

    with pytest.raises(ValueError, match="topic_output_bias needs lm_type='tcnlm', got 'naive_moe'"):
        TCNLMConfig(lm_type="naive_moe", topic_output_bias="beta")
    # steering_recipe leaves the prior out exactly where the configuration class refuses it
    for config_class, model_type, settings in [(TCNLMConfig, "tcnlm", {"lm_type": "naive_moe"}),
                                               (NCLMConfig, "nclm", {"variant": "eta"}),
                                               (NCLMConfig, "nclm", {"variant": "leta"}), (TCNLMConfig, "tcnlm", {})]:
        recipe = steering_recipe(model_type, **settings)
        assert ("topic_output_bias" in recipe) == (config_class.output_prior_unavailable(**settings) is None)
        config_class(**settings, **recipe)  # the recipe always builds
