"""The shared machinery: topic kwargs given to generate(), and recurrent layers on padded batches."""

import inspect

import pytest
import torch
from torch import nn

from conftest import tiny_model, variants
from topic_lm_hf import TopicContextCollator
from topic_lm_hf.families import topic_families
from topic_lm_hf.models.modeling_conditioning import normalize_topic_ids, normalize_topic_kwargs, topic_ids_to_mixture
from topic_lm_hf.models.modeling_recurrent import reorder_state, run_rnn


def test_topic_ids_forms_and_broadcasting():
    assert normalize_topic_ids(3, 10).tolist() == [[3]]
    assert normalize_topic_ids([3, 7], 10, batch_size=2).tolist() == [[3, 7], [3, 7]]
    assert normalize_topic_ids([[1], [2, 5]], 10).tolist() == [[1, -1], [2, 5]]
    assert normalize_topic_ids(torch.tensor([3, 7]), 10, batch_size=4).tolist() == [[3, 7]] * 4
    # fewer rows than the batch (other than one): refused, never repeated row by row ([t0, t0, t1, t1] would pair
    # the second prompt with the first row's topics)
    for rows, batch in (([[1], [2]], 4), ([[1], [2]], 3), ([[1], [2], [3]], 2)):
        with pytest.raises(ValueError, match=rf"topic_ids has {len(rows)} rows but the batch has {batch}: give one row"):
            normalize_topic_ids(rows, 10, batch_size=batch)
    mix = topic_ids_to_mixture(normalize_topic_ids(torch.tensor([[1, -1], [2, 5]]), 6), 6)
    assert mix.tolist() == [[0, 1, 0, 0, 0, 0], [0, 0, 0.5, 0, 0, 0.5]]


@pytest.mark.parametrize("bad, message", [([], "empty"), ([[]], "empty row"), ([-2], "non-negative"),
                                          ([10], r"in \[0, 10\)"), (torch.tensor([[-1, -1]]), "without any topic"),
                                          (torch.tensor([[12]]), r"in \[0, 10\)")])
def test_bad_topic_ids_are_clear_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        normalize_topic_ids(bad, 10)


def test_mixture_and_bow_validation():
    assert normalize_topic_kwargs(3, 5, 2, topic_mixture=[0.2, 0.3, 0.5])["topic_mixture"].shape == (2, 3)
    with pytest.raises(ValueError, match="shape"):
        normalize_topic_kwargs(3, 5, topic_mixture=[0.5, 0.5])
    with pytest.raises(ValueError, match="sum to 1"):
        normalize_topic_kwargs(3, 5, topic_mixture=[0.5, 0.5, 0.5])
    assert normalize_topic_kwargs(3, 5, topic_mixture=[2.0, -1.0, 0.0], mixture_on_simplex=False)
    with pytest.raises(ValueError, match="mismatched vocabularies"):
        normalize_topic_kwargs(3, 5, context_bow=torch.ones(1, 4))
    with pytest.raises(ValueError, match="at most one"):
        normalize_topic_kwargs(3, 5, topic_ids=[1], context_bow=torch.ones(1, 5))
    with pytest.raises(ValueError, match="rows"):
        normalize_topic_kwargs(3, 5, 3, context_bow=torch.ones(2, 5))


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN])
def test_run_rnn_left_and_right_padding_match_unpadded_rows(cell):
    torch.manual_seed(0)
    rnn = cell(3, 5, num_layers=2, batch_first=True)
    x = torch.randn(2, 4, 3)
    lengths = [4, 2]
    for side in ("left", "right"):
        mask = torch.zeros(2, 4, dtype=torch.long)
        for i, n in enumerate(lengths):
            mask[i, -n:] = 1 if side == "left" else 0
            if side == "right":
                mask[i, :n] = 1
        out, state = run_rnn(rnn, x, mask)
        for i, n in enumerate(lengths):
            real = x[i:i + 1][mask[i:i + 1].bool()].view(1, n, 3)
            ref_out, ref_state = run_rnn(rnn, real)
            torch.testing.assert_close(out[i][mask[i].bool()], ref_out[0])
            for s, r in zip(state, ref_state):
                torch.testing.assert_close(s[i], r[0])
        assert out[~mask.bool()].abs().sum() == 0
    # a row with no token keeps its initial state
    init = tuple(torch.randn(2, 2, 5) for _ in range(2 if cell is nn.LSTM else 1))
    _, state = run_rnn(rnn, x, torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]), init)
    for s, i0 in zip(state, init):
        torch.testing.assert_close(s[1], i0[1])
    assert reorder_state(state, torch.tensor([1, 1, 0]))[0].shape[0] == 3


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_run_rnn_right_padded_with_state_equals_each_row_alone(cell):
    """Right padding with the state wanted runs one fused call per distinct length (rows sorted, each continuing
    from its state): outputs, final states and gradients equal each row run alone, with repeated lengths, a row
    without a token and an initial state."""
    torch.manual_seed(0)
    rnn = cell(3, 5, num_layers=2, batch_first=True).double()
    lengths = [5, 0, 3, 5, 1, 3, 6]
    b, s = len(lengths), 7
    x = torch.randn(b, s, 3, dtype=torch.float64, requires_grad=True)
    init = tuple(torch.randn(b, 2, 5, dtype=torch.float64, requires_grad=True)
                 for _ in range(2 if cell is nn.LSTM else 1))
    mask = (torch.arange(s) < torch.tensor(lengths).unsqueeze(1)).long()
    from benchmarking import OperationCounter

    with OperationCounter() as ops:
        out, state = run_rnn(rnn, x, mask, init)
    assert ops.syncs == 1, dict(ops.syncs_by_name)  # the padding's shape and the lengths, read at once
    from topic_lm_hf.models.modeling_recurrent import host_reads_deferred

    with host_reads_deferred():  # the padding taken as on the right unread; the lengths still read for the state
        deferred_out, deferred_state = run_rnn(rnn, x, mask, init)
    torch.testing.assert_close(deferred_out, out)
    for a, r in zip(deferred_state, state):
        torch.testing.assert_close(a, r)
    assert out[~mask.bool()].abs().sum() == 0
    reference = []
    for i, n in enumerate(lengths):
        row_init = tuple(h[i:i + 1] for h in init)
        ref_out, ref_state = run_rnn(rnn, x[i:i + 1, :n], None, row_init) if n else (x.new_zeros(1, 0, 5), row_init)
        torch.testing.assert_close(out[i, :n], ref_out[0])
        for a, r in zip(state, ref_state):
            torch.testing.assert_close(a[i], r[0])
        reference.append((ref_out, ref_state))
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum() + sum(h.sum() for h in state), [x, *init])
    ref_loss = sum((o[0] * weights[i, :o.shape[1]]).sum() + sum(h.sum() for h in st)
                   for i, (o, st) in enumerate(reference))
    for a, r in zip(grads, torch.autograd.grad(ref_loss, [x, *init])):
        torch.testing.assert_close(a, r)


def _left_aligned(input_ids, attention_mask):
    """Move each row's real tokens to the end (left padding, as generate() wants)."""
    order = torch.argsort(attention_mask, dim=1, stable=True)
    return input_ids.gather(1, order), attention_mask.gather(1, order)


@pytest.mark.parametrize("family", variants(reads_documents=False))  # rGBN-RNN: a chunk is not its input
def test_a_fully_padded_row_in_eval_and_generate(wiki, family):
    """Chunk j of a documents-layout batch is all padding for a document with fewer chunks; every
    family runs it (it used to raise TypeError in run_rnn), the padded row keeps the initial
    state and the real rows are unaffected."""
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    model = tiny_model(family, tok, topic_tok).eval()
    collator = TopicContextCollator(tok, topic_tok, context="preceding", layout="documents")
    prepared = collator.prepare(wiki["valid"])
    n_chunks = [len(ids) for ids in prepared["input_ids"]]
    short, long = n_chunks.index(min(n_chunks)), n_chunks.index(max(n_chunks))
    batch = collator([prepared[short], prepared[long]])
    j = max(n_chunks) - 1  # the long document's last chunk: the short one has none
    ids, mask, bow = batch["input_ids"][:, j], batch["attention_mask"][:, j], batch["context_bow"][:, j]
    assert mask[0].sum() == 0 and mask[1].sum() > 0
    cond = {"context_bow": bow} if "context_bow" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, **cond)
        alone = model(input_ids=ids[1:], attention_mask=mask[1:], use_cache=True,
                      **{k: v[1:] for k, v in cond.items()})
    assert torch.isfinite(out.logits).all()
    real = mask[1].bool()
    torch.testing.assert_close(out.logits[1][real], alone.logits[0][real])
    for s, s_alone in zip(out.state, alone.state):
        assert s[0].abs().sum() == 0  # no token: the (zero) initial state
        torch.testing.assert_close(s[1], s_alone[0])
    assert torch.isfinite(model.document_representation(input_ids=ids, attention_mask=mask)).all()

    left_ids, left_mask = _left_aligned(ids, mask)
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    generated = model.generate(input_ids=left_ids, attention_mask=left_mask, **cond, **kwargs)
    n = int(mask[1].sum())
    one = model.generate(input_ids=left_ids[1:, -n:], **{k: v[1:] for k, v in cond.items()}, **kwargs)
    assert generated.shape == (2, ids.shape[1] + 4)
    assert generated[1, -(n + 4):].tolist() == one[0].tolist()


def test_numpy_topic_ids_are_read_as_ids():
    import numpy as np

    assert normalize_topic_ids(np.int64(3), 10).tolist() == [[3]]
    assert normalize_topic_ids(np.array([3, 7]), 10).tolist() == [[3, 7]]
    assert normalize_topic_ids([np.array([1, 2]), [3]], 10).tolist() == [[1, 2], [3, -1]]


@pytest.mark.parametrize("bad, message", [
    ([1.7], r"got 1\.7 \(float\)"), (torch.tensor([1.7]), "dtype torch.float32"), ([True], r"got True \(bool\)"),
    (torch.tensor([True]), "dtype torch.bool"), ("37", "got the string '37'"), (2.0, r"got 2\.0 \(float\)"),
    ([[[1]]], r"got \[1\] \(list\) in row 0"), ([[1], 2], "mixes single ids and lists"),
    ([["3"]], r"got '3' \(str\)"), (torch.zeros(1, 1, 1, dtype=torch.long), "1 or 2 dimensions")])
def test_topic_ids_that_are_not_integer_ids_are_clear_errors(wiki, bad, message):
    """Given to generate() as a user would: int() used to turn 1.7 and True into topic 1 and "37"
    into the topics 3 and 7, and [1.7] was a bare TypeError."""
    model = tiny_model("tcnlm", wiki["tok"], wiki["topic_tok"]).eval()
    with pytest.raises(ValueError, match=message):
        model.generate(topic_ids=bad, max_new_tokens=2, do_sample=False)


@pytest.mark.parametrize("family", ["tcnlm", "topic_rnn-gru"])
def test_a_documents_layout_context_bow_is_a_clear_error(wiki, family):
    """(b, chunks, V_c) bags from a documents-layout batch: one bag per row is needed (this used to
    crash inside the model, or blame topic_mixture at the second generation step)."""
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    model = tiny_model(family, tok, topic_tok).eval()
    collator = TopicContextCollator(tok, topic_tok, context="preceding", layout="documents")
    batch = collator(collator.prepare(wiki["valid"].select(range(2))).to_list())
    ids, mask, bow = batch["input_ids"][:, 0], batch["attention_mask"][:, 0], batch["context_bow"]
    assert bow.dim() == 3
    with pytest.raises(ValueError, match=r"context_bow must have shape \(b, \d+\).*got shape \(2, \d+, \d+\)"):
        model(input_ids=ids, attention_mask=mask, context_bow=bow)
    with pytest.raises(ValueError, match=r"context_bow must have shape \(b, \d+\).*got shape \(2, \d+, \d+\)"):
        model.generate(input_ids=ids[:, :3], context_bow=bow, max_new_tokens=2, do_sample=False)
    with pytest.raises(ValueError, match="context_bow must be numbers"):
        model(input_ids=ids, attention_mask=mask, context_bow=[["a"] * bow.shape[-1]] * 2)


def test_a_checkpoint_that_lacks_weights_of_the_model_is_an_error(wiki, tmp_path):
    """transformers only warns and leaves missing weights random; a checkpoint of another family
    then evaluated and generated as if trained."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from topic_lm_hf import TCNLMForCausalLM

    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    tiny_model("lstm_lm", tok, topic_tok).save_pretrained(tmp_path / "lstm")
    with pytest.raises(OSError, match=r"lacks \d+ weight\(s\) of TCNLMForCausalLM .*model\.layers.*another model"):
        TCNLMForCausalLM.from_pretrained(tmp_path / "lstm")

    # Legitimate: a causal-LM folder gives a classifier its body and a new head ...
    lm = tiny_model("topic_rnn-gru", tok, topic_tok)
    lm.save_pretrained(tmp_path / "topic_rnn")
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "topic_rnn", num_labels=2)
    torch.testing.assert_close(clf.model.rnn.weight_hh_l0, lm.model.rnn.weight_hh_l0)
    # ... but a classifier folder lacks the LM heads.
    clf.save_pretrained(tmp_path / "classifier")
    with pytest.raises(OSError, match=r"lacks 5 weight\(s\) of TopicRNNForCausalLM .*lm_head"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "classifier")
    # Tied weights are stored once and are not missing.
    tied = tiny_model("tcnlm", tok, topic_tok, tie_word_embeddings=True)
    tied.save_pretrained(tmp_path / "tied")
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / "tied", output_loading_info=True)
    assert info["missing_keys"] == set()
    torch.testing.assert_close(loaded.lm_head.weight, tied.lm_head.weight)


@pytest.mark.parametrize("config_cls, bad", [
    ("LSTMLMConfig", {"hidden_size": True}), ("TCNLMConfig", {"kl_annealing_steps": 2.5}),
    ("TopicRNNConfig", {"inference_num_layers": True}), ("NCLMConfig", {"num_topic_samples": -1})])
def test_every_config_checks_its_integer_sizes_the_same_way(config_cls, bad):
    import topic_lm_hf

    name, value = next(iter(bad.items()))
    with pytest.raises(ValueError, match=rf"{name} must be a (positive|non-negative) integer, got {value!r}"):
        getattr(topic_lm_hf, config_cls)(**bad)


def test_a_printed_config_abbreviates_long_lists_and_a_saved_one_keeps_them(tmp_path):
    from topic_lm_hf import NCLMConfig, SenseTaggerConfig

    config = NCLMConfig(vocab_size=5000, topic_vocab_size=4000, topic_word_ids=list(range(4000)))
    text = repr(config)
    assert len(text.splitlines()) < 80 and "(4,000 entries)" in text and '"topic_word_ids"' in text
    config.save_pretrained(tmp_path)
    assert NCLMConfig.from_pretrained(tmp_path).topic_word_ids == list(range(4000))
    assert len(str(SenseTaggerConfig(vocab_size=50, num_labels=5)).splitlines()) < 80


@pytest.mark.parametrize("family", [f.model_type for f in topic_families()])
def test_topic_word_ids_outside_the_vocabulary_are_refused_by_the_config(family):
    from transformers import AutoConfig

    import topic_lm_hf  # noqa: F401 (registers the model types)

    sizes = {"rgbn_rnn": dict(topic_sizes=[3], hidden_sizes=[8])}.get(family, {})
    with pytest.raises(ValueError, match=r"topic_word_ids\[1\] = 50 is not an LM id \(0 .. 49"):
        AutoConfig.for_model(family, vocab_size=50, topic_vocab_size=3, topic_word_ids=[-1, 50, 4], **sizes)
    with pytest.raises(ValueError, match="topic_word_ids is a list"):
        AutoConfig.for_model(family, vocab_size=50, topic_vocab_size=3, topic_word_ids=3, **sizes)
