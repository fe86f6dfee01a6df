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
