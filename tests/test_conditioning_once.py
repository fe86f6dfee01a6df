"""The topic keywords are validated once: every topic family's causal-LM ``forward`` calls
``normalize_topic_kwargs`` exactly once (through ``resolve_conditioning``) whatever conditioning it is given, in
evaluation and in training with labels (where the bag-of-words terms run); a forward given the resolved
``topic_representation`` of an earlier step validates nothing; and ``generate()`` validates its conditioning once,
before the first step, and never again (the first step takes what generate validated, the later ones the cached
representation)."""

import sys

import pytest
import torch
from conftest import topic_family_model, variants

from topic_lm_hf.models import modeling_conditioning

FAMILIES = variants(topic_only=True)  # every variant of every topic family


@pytest.fixture
def validations(monkeypatch):
    """A list that gets one entry per call of ``normalize_topic_kwargs``, from whichever module of the package
    calls it (each imports the function by name, so every such module is patched)."""
    calls = []
    original = modeling_conditioning.normalize_topic_kwargs

    def counting(*args, **kwargs):  # records which keywords each call validates
        calls.append([name for name in ("context_bow", "topic_ids", "topic_mixture") if kwargs.get(name) is not None])
        return original(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("topic_lm_hf") and getattr(module, "normalize_topic_kwargs", None) is original:
            monkeypatch.setattr(module, "normalize_topic_kwargs", counting)
    return calls


def _model(family, vocabularies):
    tok, topic_tok = vocabularies
    # TopicRNN's bag-of-words likelihood term is off in the paper's recipe: on here, so that its path runs.
    overrides = {"bow_loss_weight": 1.0} if family.startswith("topic_rnn") else {}
    return topic_family_model(family, tok, topic_tok, **overrides)


def _conditionings(model):
    """Every kind of conditioning the family takes, for a batch of two rows."""
    V_c = model.config.topic_vocab_size
    bow = torch.zeros(2, V_c)
    bow[:, 1:4] = 1.0
    kinds = {"context_bow": dict(context_bow=bow), "topic_ids": dict(topic_ids=[[1], [0, 2]])}
    if model.config.model_type == "rgbn_rnn":  # rGBN-RNN: raw topic weights of every layer
        kinds["topic_mixture"] = dict(topic_mixture=torch.rand(2, sum(model.config.topic_sizes)))
    else:
        K = model.config.num_topics
        kinds["topic_mixture"] = dict(topic_mixture=torch.full((K,), 1.0 / K))  # on the simplex, for every family
    return kinds


def _batch(vocabularies):
    tok = vocabularies[0]
    tok.padding_side = "right"
    batch = tok(["the court ruled on the tax case", "police said the fire"], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return dict(batch), labels


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_validates_each_conditioning_once(tiny_vocabularies, validations, family):
    model = _model(family, tiny_vocabularies)
    batch, labels = _batch(tiny_vocabularies)
    for kind, conditioning in _conditionings(model).items():
        for training in (False, True):
            model.train(training)
            validations.clear()
            with torch.set_grad_enabled(training):
                out = model(**batch, **conditioning, labels=labels if training else None)
            assert len(validations) == 1, (kind, training, validations)
            # rGBN-RNN checks its own topic weights beside the call (which then validates that no other keyword is
            # given)
            own = model.config.model_type == "rgbn_rnn" and kind == "topic_mixture"
            assert validations[0] == ([] if own else [kind]), (kind, training, validations)
            if training:
                assert out.loss is not None and torch.isfinite(out.loss)
    model.eval()
    validations.clear()
    model(**batch)  # no conditioning: nothing to validate but the absence of a conflict, once
    assert len(validations) == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_a_forward_given_the_resolved_representation_validates_nothing(tiny_vocabularies, validations, family):
    model = _model(family, tiny_vocabularies)
    batch, _ = _batch(tiny_vocabularies)
    with torch.no_grad():
        first = model(**batch, topic_ids=[1], use_cache=True)
        resolved = {"topic_representation": first.topic_representation}
        if family.startswith("nclm"):  # NCLM carries its ETR topic vectors with c_doc
            resolved["topic_embeddings"] = first.topic_embeddings
        validations.clear()
        model(input_ids=batch["input_ids"][:, -1:], state=first.state, **resolved)
    assert validations == []


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_validates_the_conditioning_once(tiny_vocabularies, validations, family):
    model = _model(family, tiny_vocabularies)
    tok = tiny_vocabularies[0]
    tok.padding_side = "left"
    prompt = tok(["the court", "police said the"], return_tensors="pt", padding=True)
    validations.clear()
    model.generate(**prompt, topic_ids=[1], max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert validations == [["topic_ids"]]  # before the first step; the steps validate nothing
    validations.clear()
    model.generate(**prompt, topic_ids=[1], max_new_tokens=5, min_new_tokens=5, num_beams=2)
    assert validations == [["topic_ids"]]  # the beams expand what generate validated, unvalidated again
    # Topic guidance runs the model once more per step under its prior, which is given no conditioning: those runs
    # have nothing to validate and validate nothing, so guided generation also validates once in all (measured).
    validations.clear()
    model.generate(**prompt, topic_ids=[1], max_new_tokens=5, min_new_tokens=5, do_sample=False,
                   topic_guidance_scale=2.0)
    assert validations == [["topic_ids"]]
