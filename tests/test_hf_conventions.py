"""transformers conventions every family keeps: loading with ``output_loading_info``, no cache without
``use_cache``, continuing a generation from ``past_key_values``, and rGBN-RNN's dtype, device and greedy decoding."""

import pytest
import torch

from topic_lm_hf import build_vocabularies, synthetic_documents
from topic_lm_hf.families import variant_of

from conftest import tiny_model, variants

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vocabularies():
    return build_vocabularies(synthetic_documents(30, seed=0), min_freq=1)


@pytest.mark.parametrize("family", variants(representative=True))
def test_a_classifier_loads_with_output_loading_info(tmp_path, vocabularies, family):
    tok, topic_tok = vocabularies
    record, _ = variant_of(family)
    tiny_model(family, tok, topic_tok).save_pretrained(tmp_path)
    model, info = record.classifier_class.from_pretrained(tmp_path, num_labels=3, output_loading_info=True)
    assert isinstance(model, record.classifier_class) and isinstance(info, dict)
    assert any(key.startswith("classifier.") for key in info["missing_keys"])
    assert not any(p.requires_grad for p in model.model.parameters())  # the body is frozen, as without the info
    lm, info = record.causal_lm_class.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(lm, record.causal_lm_class) and not info["missing_keys"]


def test_rgbn_from_a_state_dict_keeps_the_requested_or_default_dtype(vocabularies):
    from topic_lm_hf import RGBNRNNForCausalLM

    tok, topic_tok = vocabularies
    model = tiny_model("rgbn", tok, topic_tok)
    state_dict = model.state_dict()
    assert next(iter(state_dict.values())).dtype == torch.float64  # the sampler state comes first
    for dtype, expected in ((None, torch.float32), ("auto", torch.float32), (torch.bfloat16, torch.bfloat16)):
        kwargs = {} if dtype is None else {"dtype": dtype}
        loaded = RGBNRNNForCausalLM.from_pretrained(None, config=model.config, state_dict=state_dict, **kwargs)
        assert loaded.dtype == expected and loaded.lm_head.weight.dtype == expected, dtype
        assert {b.dtype for n, b in loaded.model.named_buffers() if n.startswith(("phi", "pi"))} == {torch.float64}
        torch.testing.assert_close(loaded.model.phi_1, model.model.phi_1)


@pytest.mark.parametrize("family", ["rgbn", "gbn"])
def test_rgbn_built_on_the_meta_device_initialises_its_topics(vocabularies, family):
    """Built on the meta device, moved with to_empty and initialised, Phi, Pi and the sampler state are the
    configuration's initial values (not uninitialised memory), and the model computes."""
    tok, topic_tok = vocabularies
    reference = tiny_model(family, tok, topic_tok)
    with torch.device("meta"):
        model = type(reference)(reference.config)
    model = model.to_empty(device="cpu")
    model.init_weights()
    buffers = dict(model.model.named_buffers())
    for name, value in reference.model.named_buffers():
        if name.startswith(("phi", "pi")) or name == "tlasgr_step_count":
            torch.testing.assert_close(buffers[name], value, msg=name)
    assert any(name.startswith("pi_") for name in buffers) == (family == "rgbn")
    ids = torch.tensor([tok("the court said the tax")["input_ids"]])
    with torch.no_grad():
        assert torch.isfinite(model.eval()(input_ids=ids).logits).all()


def _prompt(tok):
    return torch.tensor([tok("the court said the tax")["input_ids"]])


def _conditioning(family):
    return {"topic_ids": [1]} if variant_of(family)[0].is_topic_model else {}


@pytest.mark.parametrize("family", variants(representative=True))
def test_without_use_cache_no_cache_is_returned(vocabularies, family):
    tok, topic_tok = vocabularies
    model = tiny_model(family, tok, topic_tok).eval()
    ids = _prompt(tok)
    with torch.no_grad():
        assert model(input_ids=ids, use_cache=False).state is None
        assert model(input_ids=ids, use_cache=True).state is not None
    kwargs = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, return_dict_in_generate=True,
                  **_conditioning(family))
    uncached = model.generate(ids, use_cache=False, **kwargs)
    cached = model.generate(ids, use_cache=True, **kwargs)
    assert uncached.past_key_values is None and cached.past_key_values is not None
    assert torch.equal(uncached.sequences, cached.sequences)  # the topics still condition every step


@pytest.mark.parametrize("family", variants(representative=True))
def test_past_key_values_continues_as_state_does(vocabularies, family):
    tok, topic_tok = vocabularies
    model = tiny_model(family, tok, topic_tok).eval()
    ids = _prompt(tok)
    with torch.no_grad():
        state = model(input_ids=ids[:, :-1], use_cache=True, **_conditioning(family)).state
        by_state = model(input_ids=ids[:, -1:], state=state, **_conditioning(family)).logits
        by_alias = model(input_ids=ids[:, -1:], past_key_values=state, **_conditioning(family)).logits
    torch.testing.assert_close(by_alias, by_state, rtol=0, atol=0)
    with pytest.raises(ValueError, match="give it once, as state="):
        model(input_ids=ids[:, -1:], state=state, past_key_values=state)

    first = model.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                           **_conditioning(family))
    go_on = dict(max_new_tokens=2, min_new_tokens=2, do_sample=False)
    by_state = model.generate(first.sequences[:, -1:], state=first.past_key_values, **go_on)
    by_alias = model.generate(first.sequences[:, -1:], past_key_values=first.past_key_values, **go_on)
    assert torch.equal(by_alias, by_state)
    cache = first.past_key_values
    if hasattr(cache, "conditioning"):  # a topic model's cache also holds its resolved topics: forward reads them
        with torch.no_grad():
            last = first.sequences[:, -1:]
            torch.testing.assert_close(model(input_ids=last, past_key_values=cache).logits,
                                       model(input_ids=last, state=cache.state, **cache.conditioning).logits,
                                       rtol=0, atol=0)
    with pytest.raises(ValueError, match="give it once, as state="):
        model.generate(first.sequences[:, -1:], state=first.past_key_values, past_key_values=first.past_key_values,
                       **go_on)


@pytest.mark.parametrize("family", ["rgbn", "gbn"])
def test_rgbn_greedy_decoding_without_topics_is_deterministic(vocabularies, family):
    """Without conditioning theta comes from the prior: its mean unless generation samples."""
    tok, topic_tok = vocabularies
    model = tiny_model(family, tok, topic_tok).eval()
    ids = _prompt(tok)
    runs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        runs.append(model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                   return_dict_in_generate=True, output_scores=True))
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert all(torch.equal(a, b) for a, b in zip(runs[0].scores, runs[1].scores))
    greedy = [model.prepare_generation_conditioning(2, do_sample=False)["topic_mixture"] for _ in range(2)]
    assert torch.equal(*greedy) and torch.equal(greedy[0][0], greedy[0][1])
    drawn = [model.prepare_generation_conditioning(2, do_sample=True)["topic_mixture"] for _ in range(2)]
    assert not torch.equal(*drawn)


def test_a_generation_cache_of_another_family_is_refused(vocabularies):
    """A cache returned by one family's generate is refused by another (NCLM used to read TCNLM's topic vector and
    generate from it), in generate and in forward; the same family continues as before."""
    tok, topic_tok = vocabularies
    tcnlm, nclm = tiny_model("tcnlm", tok, topic_tok).eval(), tiny_model("nclm-leta", tok, topic_tok).eval()
    ids = _prompt(tok)
    first = tcnlm.generate(ids, topic_ids=[1], max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
    cache = first.past_key_values
    with pytest.raises(ValueError, match="comes from a tcnlm model's generation"):
        nclm.generate(first.sequences[:, -1:], past_key_values=cache, max_new_tokens=2)
    with pytest.raises(ValueError, match="comes from a tcnlm model's generation"), torch.no_grad():
        nclm(input_ids=first.sequences[:, -1:], past_key_values=cache)
    assert tcnlm.generate(first.sequences[:, -1:], past_key_values=cache, max_new_tokens=2,
                          do_sample=False).shape[1] == 3


@pytest.mark.parametrize("family", variants(representative=True))
def test_a_wrong_state_mask_or_empty_input_is_one_clear_error(vocabularies, family):
    """forward refuses, each in one ValueError, what used to fail deep inside (a RecursionError for a string state,
    shape errors for a transformers DynamicCache or another batch's state, an index error for a mask shorter than
    the input) or was accepted (TCNLM read an empty input)."""
    from transformers import DynamicCache

    tok, topic_tok = vocabularies
    model = tiny_model(family, tok, topic_tok).eval()
    ids = _prompt(tok)
    kwargs = _conditioning(family)
    with torch.no_grad():
        state = model(input_ids=ids, use_cache=True, **kwargs).state
        for bad, message in [("state", "tuple of batch-first tensors"), (DynamicCache(), "tuple of batch-first"),
                             (tuple(torch.cat([t, t]) for t in state if isinstance(t, torch.Tensor)) or None,
                              "for another batch")]:
            if bad is None:
                continue
            with pytest.raises(ValueError, match=message):
                model(input_ids=ids, state=bad, **kwargs)
        with pytest.raises(ValueError, match="does not cover the input"):
            model(input_ids=ids, attention_mask=torch.ones(ids.shape[0], ids.shape[1] - 1, dtype=torch.long),
                  **kwargs)
        with pytest.raises(ValueError, match="the input is empty"):
            model(input_ids=ids[:, :0], **kwargs)


@pytest.mark.parametrize("family", variants(topic_only=True, representative=True))
def test_the_body_and_the_classifier_load_a_recipe_trained_folder_without_unexpected_weights(vocabularies, family,
                                                                                            tmp_path):
    """A causal LM trained with the steering recipe saves its topic output prior's weight; AutoModel and the
    sequence classifier (which do not use it) reported it as an UNEXPECTED weight of the folder."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    from topic_lm_hf import steering_recipe

    tok, topic_tok = vocabularies
    record = variant_of(family)[0]
    tiny_model(family, tok, topic_tok, **steering_recipe(record.model_type)).save_pretrained(tmp_path)
    _, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["unexpected_keys"]
    _, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=2, output_loading_info=True)
    assert not info["unexpected_keys"]
