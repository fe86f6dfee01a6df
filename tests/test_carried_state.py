"""The carried-state loop shared by causal-carry evaluation, the sliding window and carried training
(``run_carried_chunks``), driven directly on real Wikipedia documents (wikipedia-sample) against each document run
alone."""

import pytest
import torch
from conftest import tiny_model

from topic_lm_hf import TopicContextCollator
from topic_lm_hf.carried_state import run_carried_chunks

pytestmark = pytest.mark.usefixtures("one_thread")

# Sentences kept of the first wikipedia-sample training documents: not sorted by length, so the loop must reorder the
# rows, and of different lengths, so the batch has padding chunks (and, at max_sentence_length=8, sentences of
# several chunks).
SENTENCES = (2, 5, 1, 3, 5)


def documents_batch(wiki, family):
    """A documents batch of the cut documents, with the inputs ``family`` reads, and ``doc_index`` (b,): a tensor
    with one entry per document, which the loop cuts to each chunk's rows like any other."""
    context = "none" if family == "lstm_lm" else "preceding"
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"] if context != "none" else None,
                                    context=context, layout="documents", max_sentence_length=8,
                                    sentence_prefix=family.startswith("nclm"))
    docs = wiki["train"]["sentences"][:len(SENTENCES)]
    batch = collator([{"sentences": doc[:n]} for doc, n in zip(docs, SENTENCES)])
    batch["doc_index"] = torch.arange(len(SENTENCES))
    return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}


def token_nll(model, input_ids, attention_mask, state, inputs):
    """Per-token NLL (rows, l - 1) of chunks (inputs chunk[:-1], targets chunk[1:]), as evaluation computes it, the
    target mask, and the state after the chunk's inputs."""
    target_mask = attention_mask[:, 1:].bool()
    out = model(input_ids=input_ids[:, :-1], attention_mask=target_mask.long(), state=state, use_cache=True,
                return_dict=True, **inputs)
    log_probs = torch.log_softmax(out.logits.double(), dim=-1)
    return -log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1), target_mask, out.state


def naive_document_nll(model, batch, i):
    """Document ``i`` alone, chunk after chunk without padding, the state carried: its NLL sum and token count."""
    total, tokens, state = 0.0, 0, None
    for k in range(int(batch["chunk_mask"][i].sum())):
        length = int(batch["attention_mask"][i, k].sum())
        ids = batch["input_ids"][i, k, :length].unsqueeze(0)
        inputs = {key: batch[key][i, k].unsqueeze(0) for key in ("context_bow", "sentence_prefix_bow") if key in batch}
        nll, mask, state = token_nll(model, ids, torch.ones_like(ids), state, inputs)
        total += nll.sum().item()
        tokens += int(mask.sum())
    return total, tokens


@pytest.mark.parametrize("family", ["lstm_lm", "tcnlm", "nclm-leta-sdt"])
def test_the_loop_equals_each_document_run_alone(wiki, family):
    batch = documents_batch(wiki, family)
    model = tiny_model(family, wiki["tok"], wiki["topic_tok"]).double().eval()
    nll = torch.zeros(len(SENTENCES), dtype=torch.float64)
    tokens = torch.zeros(len(SENTENCES), dtype=torch.long)
    visits = []

    def step(k, chunk, state):
        docs = chunk["doc_index"]
        visits.append((k, docs.tolist(), state is None))
        inputs = {key: chunk[key] for key in ("context_bow", "sentence_prefix_bow") if key in chunk}
        token, mask, state = token_nll(model, chunk["input_ids"], chunk["attention_mask"], state, inputs)
        nll.index_add_(0, docs, (token * mask).sum(1))
        tokens.index_add_(0, docs, mask.sum(1))
        return state

    with torch.no_grad():
        run_carried_chunks(batch, step)
        expected = [naive_document_nll(model, batch, i) for i in range(len(SENTENCES))]
    n_chunks = batch["chunk_mask"].sum(1).tolist()
    assert n_chunks != sorted(n_chunks, reverse=True)  # rows to reorder (and padding chunks)
    # Chunk k runs the documents that have one, longest first (ties in batch order), from a fresh state at k = 0.
    by_length = sorted(range(len(SENTENCES)), key=lambda i: -n_chunks[i])
    assert visits == [(k, [i for i in by_length if n_chunks[i] > k], k == 0) for k in range(max(n_chunks))]
    assert tokens.tolist() == [n for _, n in expected]
    for i, (want, _) in enumerate(expected):
        assert nll[i].item() == pytest.approx(want, rel=1e-9), i


def test_a_tokens_only_model_reads_each_document_as_one_sequence(wiki):
    """``carried_state_loss`` gives a model that reads nothing but its tokens (the LSTM) each document as one
    sequence (``document_sequences``): the same loss and gradients as the chunk loop (forced by a chunk callback),
    on documents of several chunks and sentences, with padding chunks; and the sequence is the document's tokens,
    each once, with every chunk's targets."""
    from topic_lm_hf.carried_state import document_sequences
    from topic_lm_hf.carried_state import carried_state_loss

    batch = documents_batch(wiki, "lstm_lm")
    batch.pop("doc_index")
    sequences = document_sequences(batch)
    # the document's sequence: <bos> w .. per sentence (a sentence's <eos> is a target, never an input, as in the
    # loop), then the last <eos>; and every chunk's targets once
    tok = wiki["tok"]
    for i, n in enumerate(SENTENCES):
        doc = wiki["train"]["sentences"][i][:n]
        expected = [t for sentence in doc for t in
                    [tok.bos_token_id, *tok(sentence, is_split_into_words=True, add_special_tokens=False)["input_ids"]]]
        expected.append(tok.eos_token_id)
        length = int(sequences["attention_mask"][i].sum())
        assert sequences["input_ids"][i, :length].tolist() == expected
        targets = sequences["labels"][i, 1:length]
        chunk_targets = batch["labels"][i, :, 1:][batch["attention_mask"][i, :, 1:].bool()
                                                  & batch["chunk_mask"][i].bool().unsqueeze(-1)]
        assert targets.tolist() == chunk_targets.tolist()
        assert (sequences["labels"][i, length:] == -100).all() and sequences["labels"][i, 0] == -100

    torch.manual_seed(0)
    model = tiny_model("lstm_lm", wiki["tok"], wiki["topic_tok"], dropout=0.0).double().train()
    grads = []
    for callback in (None, lambda labels, out: None):
        model.zero_grad()
        loss = carried_state_loss(model, batch, chunk_callback=callback).loss
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (one, one_grads), (loop, loop_grads) = grads
    torch.testing.assert_close(one, loop, rtol=1e-10, atol=0)
    for a, b in zip(one_grads, loop_grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-10)  # float64 sums in another order


@pytest.mark.parametrize("family", ["topic_rnn-lstm", "nclm-leta", "nclm-eta", "tcnlm", "tcnlm-moe"])
def test_a_topic_model_whose_recurrence_reads_only_tokens_runs_a_documents_batch_in_one_call(wiki, family):
    """TopicRNN, NCLM without sentence topics and TCNLM (``carries_documents_in_one_call``): the recurrence over each
    document's sequence and the rest on the batch of the documents' chunks, each with its own preceding-text context
    (``chunk_rows``), give the loss, every loss term and the gradients of the chunk loop (forced by a chunk
    callback); in the topic-model phase (NCLM) the loop runs. TCNLM's recurrence reads its chunk's topics at every
    step (``rows``: each token under the t of the chunk that feeds it); its topic terms per predicted token
    (``topic_loss_normalization="lm_tokens"``) are the loop's exactly."""
    from topic_lm_hf.carried_state import chunk_rows
    from topic_lm_hf.carried_state import carried_state_loss

    batch = documents_batch(wiki, family)
    batch.pop("doc_index")
    rows, document_tokens = chunk_rows(batch)
    real_chunks = int(batch["chunk_mask"].sum())
    assert rows["input_ids"].shape == (real_chunks, batch["input_ids"].shape[2])
    assert rows["context_bow"].shape == (real_chunks, batch["context_bow"].shape[2])
    # each row's tokens but its last are read at their places in the document's sequence
    sequence = document_tokens["input_ids"].flatten()
    fed = rows["attention_mask"].bool()  # as the loop feeds them: the chunk's tokens but its last
    assert torch.equal(sequence[document_tokens["positions"][fed]], rows["input_ids"][fed])

    # each token of the sequences is fed by the row whose chunk feeds it in the loop
    rows_of = document_tokens["rows"].flatten()
    row_index = torch.arange(real_chunks).unsqueeze(1).expand_as(fed)
    assert torch.equal(rows_of[document_tokens["positions"][fed]], row_index[fed])

    options = {}
    if family.startswith("tcnlm"):
        options = dict(topic_loss_normalization="lm_tokens", dropout=0.0)
        options.update(lm_type="naive_moe" if family == "tcnlm-moe" else "tcnlm")
    model = tiny_model(family.replace("-moe", ""), wiki["tok"], wiki["topic_tok"], **options).double().eval()
    assert model.carries_documents_in_one_call()
    results = []
    for callback in (None, lambda labels, out: None):
        model.zero_grad()
        out = carried_state_loss(model, batch, chunk_callback=callback)
        out.loss.backward()
        results.append((out, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (one, one_grads), (loop, loop_grads) = results
    # TopicRNN computes its output bias and loss in float32 (even in a float64 model): float32 sums in another order
    for key in ("loss", "lm_loss", "kl_loss", "aux_loss", "bow_loss"):
        if getattr(loop, key) is None:
            assert getattr(one, key) is None
            continue
        torch.testing.assert_close(getattr(one, key).double(), getattr(loop, key).double(), rtol=1e-6, atol=1e-9)
    assert len(one_grads) == len(loop_grads)
    for a, b in zip(one_grads, loop_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    if family.startswith("nclm"):
        model.set_training_phase("topic_model")
        assert not model.carries_documents_in_one_call()


def test_topicrnns_batch_terms_in_one_call_are_taken_over_the_batch_of_chunks(wiki):
    """With free bits and the bag-of-words term, TopicRNN's one-call carried loss takes them over the batch of all
    the documents' chunks, as chunk training over its batch: the reported bag-of-words loss is the rows' summed NLL
    per context word (the loop took it per batch of the documents' k-th chunks)."""
    from topic_lm_hf.carried_state import chunk_rows
    from topic_lm_hf.carried_state import carried_state_loss

    batch = documents_batch(wiki, "topic_rnn-lstm")
    batch.pop("doc_index")
    model = tiny_model("topic_rnn-lstm", wiki["tok"], wiki["topic_tok"], bow_loss_weight=1.0,
                       kl_free_bits=0.5).double().eval()
    out = carried_state_loss(model, batch)
    rows, _ = chunk_rows(batch)
    with torch.no_grad():
        mean, log_sigma = model.model.inference_net(rows["context_bow"].float())
        nll, words = model.bow_nll(rows["context_bow"], model._theta(mean))
    torch.testing.assert_close(out.bow_loss.double(), (nll.sum() / words.clamp_min(1)).double(), rtol=1e-5,
                               atol=1e-7)


def test_a_model_asked_for_its_hidden_states_runs_the_chunk_loop(wiki):
    """With ``config.output_hidden_states`` the per-layer states are the chunks', so carried training keeps the loop
    (the one-call path refuses them) and trains as before."""
    from topic_lm_hf.carried_state import carried_state_loss

    batch = documents_batch(wiki, "topic_rnn-lstm")
    batch.pop("doc_index")
    model = tiny_model("topic_rnn-lstm", wiki["tok"], wiki["topic_tok"]).double().eval()
    expected = carried_state_loss(model, batch).loss
    model.config.output_hidden_states = True
    torch.testing.assert_close(carried_state_loss(model, batch).loss, expected, rtol=1e-6, atol=1e-9)
