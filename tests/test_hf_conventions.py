"""transformers conventions every family keeps: loading with ``output_loading_info``, no cache without
``use_cache``, continuing a generation from ``past_key_values``, and rGBN-RNN's dtype, device and greedy decoding."""

import pytest
import torch

from topic_lm_hf import build_vocabularies, synthetic_documents
from topic_lm_hf.families import FAMILIES, variant_of

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
