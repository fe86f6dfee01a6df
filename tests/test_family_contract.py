"""The family contract: each model declares what it reads, ``TopicContextCollator.for_model`` builds every batch
from those declarations, generation carries the resolved conditioning with the state in one cache, and the
layout rules that keep it so (no signature probing, configuration files are leaves, the demo does not import the
command line, no script edits ``sys.path``)."""

import ast
import functools
from pathlib import Path

import pytest
import torch

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, LSTMLMForSequenceClassification, NCLMConfig,
                         NCLMForCausalLM, RGBNRNNConfig, RGBNRNNForCausalLM, TCNLMConfig, TCNLMForCausalLM,
                         TCNLMForSequenceClassification, TopicContextCollator, TopicRNNForCausalLM)
from topic_lm_hf.models.modeling_generation import TopicLMCache

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "topic_lm_hf"

# What each family reads, as the papers train and evaluate it: (class, conditioning keywords, training context,
# sentence prefix, whole documents).
DECLARED = [
    (LSTMLMForCausalLM, (), "none", False, False),
    (TCNLMForCausalLM, ("context_bow", "topic_ids", "topic_mixture"), "others", False, False),
    (TopicRNNForCausalLM, ("context_bow", "topic_mixture", "topic_ids"), "others", False, False),
    (NCLMForCausalLM, ("context_bow", "topic_ids", "topic_mixture"), "others", True, False),
    (RGBNRNNForCausalLM, ("context_bow", "topic_mixture", "topic_ids"), "preceding", False, True),
    (LSTMLMForSequenceClassification, (), "none", False, False),
    (TCNLMForSequenceClassification, ("context_bow",), "document", False, False),
]


@pytest.mark.parametrize("cls, inputs, context, prefix, documents", DECLARED, ids=lambda x: getattr(x, "__name__", ""))
def test_every_family_declares_what_it_reads(cls, inputs, context, prefix, documents):
    assert tuple(cls.conditioning_inputs) == inputs
    assert (cls.training_context, cls.reads_sentence_prefix, cls.reads_documents) == (context, prefix, documents)
    import inspect

    # The declarations are true of forward (this test is the one place that reads a signature).
    parameters = inspect.signature(cls.forward).parameters
    assert all(name in parameters for name in inputs)
    assert ("sentence_prefix_bow" in parameters) == prefix and ("chunk_mask" in parameters) == documents


# protocol -> (context, layout) of the collator, for a topic model reading sentence chunks
EXPECTED = {"train": ("others", "sentences"), "train-carry": ("preceding", "documents"),
            "paper": ("others", "sentences"), "causal": ("preceding", "sentences"),
            "causal-carry": ("preceding", "documents"), "sliding-window": ("none", "documents"),
            "document": ("document", "sequence")}


def _models(wiki):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    small = dict(embedding_size=8, hidden_size=8)
    return {
        "lstm": LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), **small)),
        "tcnlm": TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=3, **small)),
        "nclm": NCLMForCausalLM(NCLMConfig.from_tokenizers(tok, topic_tok, num_topics=3, encoder_hidden_size=8,
                                                           **small)),
        "rgbn": RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[3], hidden_sizes=[8],
                                                                 embedding_size=8)),
    }


@pytest.mark.parametrize("protocol", list(EXPECTED))
def test_for_model_builds_each_protocols_batches_from_the_declarations(wiki, protocol):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    models = _models(wiki)
    context, layout = EXPECTED[protocol]
    tcnlm = TopicContextCollator.for_model(models["tcnlm"], tok, topic_tok, protocol=protocol)
    assert (tcnlm.context, tcnlm.layout, tcnlm.sentence_prefix) == (context, layout, False)
    assert tcnlm.topic_tokenizer is topic_tok
    lstm = TopicContextCollator.for_model(models["lstm"], tok, topic_tok, protocol=protocol)
    assert (lstm.context, lstm.topic_tokenizer) == ("none", None)  # no bag of words for a model without topics
    nclm = TopicContextCollator.for_model(models["nclm"], tok, topic_tok, protocol=protocol)
    assert nclm.sentence_prefix == (protocol != "document")
    rgbn = TopicContextCollator.for_model(models["rgbn"], tok, topic_tok, protocol=protocol)
    expected_rgbn = {"train": "preceding"}.get(protocol, context)
    assert rgbn.context == expected_rgbn and rgbn.layout == ("sequence" if protocol == "document" else "documents")
    # A batch of the real corpus has what the model reads.
    rows = nclm.prepare(wiki["valid"].select(range(2)))
    batch = nclm([rows[i] for i in range(min(3, len(rows)))])
    assert ("context_bow" in batch) == (context != "none")
    assert ("sentence_prefix_bow" in batch) == (protocol != "document")


def test_for_model_takes_a_training_context_and_refuses_one_elsewhere(wiki):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    tcnlm = _models(wiki)["tcnlm"]
    assert TopicContextCollator.for_model(tcnlm, tok, topic_tok, context="preceding").context == "preceding"
    assert TopicContextCollator.for_model(tcnlm, tok, topic_tok, max_sentence_length=7).max_sentence_length == 7
    with pytest.raises(ValueError, match="protocol must be one of"):
        TopicContextCollator.for_model(tcnlm, tok, topic_tok, protocol="causal-window")
    with pytest.raises(ValueError, match="choose the training batches"):
        TopicContextCollator.for_model(tcnlm, tok, topic_tok, protocol="paper", context="preceding")


@pytest.mark.parametrize("family", ["tcnlm", "nclm", "rgbn"])
def test_generation_resolves_the_conditioning_once_and_carries_it_in_one_cache(wiki, family):
    tok = wiki["tok"]
    model = _models(wiki)[family].eval()
    seen = []
    original = model.forward

    def recording_forward(*args, **kwargs):
        given = dict(kwargs, **(kwargs.get("topic_conditioning") or {}))  # the first step's, validated by generate
        seen.append(sorted(k for k in ("topic_ids", "context_bow", "topic_mixture", "topic_representation")
                           if given.get(k) is not None))
        assert not isinstance(kwargs.get("state"), TopicLMCache)  # forward gets the plain recurrent state
        return original(*args, **kwargs)

    model.forward = functools.wraps(original)(recording_forward)
    prompt = tok(["the senate said"], return_tensors="pt")
    out = model.generate(**prompt, topic_ids=[1], max_new_tokens=4, min_new_tokens=4, do_sample=False,
                         return_dict_in_generate=True)
    first = ["topic_mixture"] if family == "rgbn" else ["topic_ids"]  # rGBN-RNN resolves topic_ids to theta
    assert seen[0] == first and all(s == ["topic_representation"] for s in seen[1:])
    cache = out.past_key_values
    assert isinstance(cache, TopicLMCache) and "topic_representation" in cache.conditioning
    # Continuing from the returned cache gives what one longer generation gives.
    model.forward = original
    longer = model.generate(**prompt, topic_ids=[1], max_new_tokens=6, min_new_tokens=6, do_sample=False)
    resolving = []
    prepare = model.prepare_generation_conditioning
    model.prepare_generation_conditioning = lambda *a, **k: resolving.append(k) or prepare(*a, **k)
    resumed = model.generate(out.sequences[:, -1:], state=cache, max_new_tokens=2, min_new_tokens=2,
                             do_sample=False)
    assert torch.equal(resumed[0, 1:], longer[0, -2:])
    assert resolving == []  # the cache's topics, not a new resolution (rGBN-RNN would draw a prior theta)


@pytest.mark.parametrize("family", ["lstm", "tcnlm", "nclm", "rgbn"])
def test_config_output_hidden_states_is_the_default_of_forward(wiki, family):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    model = _models(wiki)[family].eval()
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="paper")
    batch = collator(collator.prepare(wiki["valid"].select(range(2))).to_list())
    with torch.no_grad():
        assert model(**batch).hidden_states is None
        model.config.output_hidden_states = True
        hidden = model(**batch).hidden_states
        assert hidden is not None and len(hidden) >= 2  # the embeddings and every layer
        assert model(**batch, output_hidden_states=False).hidden_states is None  # the keyword wins


def test_a_family_refuses_conditioning_it_does_not_declare(wiki):
    tok = wiki["tok"]
    tcnlm = _models(wiki)["tcnlm"].eval()
    with pytest.raises(ValueError, match="does not take theta"):  # rGBN-RNN's deprecated name of topic_mixture
        tcnlm.generate(**tok(["the"], return_tensors="pt"), theta=[1.0, 0.0, 0.0], max_new_tokens=2)


# the modules the benchmark scripts share (scripts/benchmarking.py, scripts/benchmark_training.py)
HARNESS = {"benchmarking", "benchmark_training"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add(("." * node.level) + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_layout_rules_hold():
    sources = list(PACKAGE.rglob("*.py"))
    assert not [p for p in sources if "inspect.signature" in p.read_text()], "models declare what they read"
    for config_file in (PACKAGE / "models").glob("configuration_*.py"):
        assert not [m for m in _imports(config_file) if "modeling" in m], f"{config_file.name} must be a leaf"
    assert not [p.name for p in sources if p.name != "cli.py" and any(m.endswith("cli") for m in _imports(p))], \
        "cli.py is the top: nothing in the package imports it (shared flag helpers live in arguments.py)"
    assert not (PACKAGE / "models" / "modeling_common.py").exists()
    assert not [p.name for p in (ROOT / "scripts").glob("*.py") if "sys.path" in p.read_text()]
    assert not [p.name for p in (ROOT / "scripts").glob("*.py")
                if any(m.startswith("benchmark_") and m not in HARNESS for m in _imports(p))], \
        "scripts import the shared modules only"
    for flat in (PACKAGE / "models").glob("*.py"):
        assert len(flat.read_text().splitlines()) <= 1200, flat.name


def test_every_family_forward_is_the_template_with_its_declared_keywords():
    """A family declares its keywords (``forward_inputs``) instead of restating forward: its forward's signature is
    the template's parameters, in the template's order, then its own keywords, which generate validates its
    keywords against; the docstring documents every one."""
    import inspect

    from topic_lm_hf.models.modeling_topic_family import TEMPLATE_INPUTS, TopicFamilyForCausalLM

    template = [n for n in inspect.signature(TopicFamilyForCausalLM.forward).parameters if n not in ("self", "inputs")]
    assert template == list(TEMPLATE_INPUTS)
    for cls in (TCNLMForCausalLM, TopicRNNForCausalLM, NCLMForCausalLM, RGBNRNNForCausalLM):
        parameters = inspect.signature(cls.forward).parameters
        assert list(parameters) == ["self", *TEMPLATE_INPUTS, *cls.forward_inputs, "kwargs"], cls.__name__
        assert set(cls.conditioning_inputs) <= set(cls.forward_inputs)
        assert all(f"    {name}: " in cls.forward.__doc__ for name in parameters if name not in ("self", "kwargs"))
