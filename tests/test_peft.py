"""Adapters on the output layer take part in training: a PEFT LoRA on ``lm_head`` (alone or with the embeddings)
trains with ``transformers.Trainer`` in every family, and saves, reloads and merges to the same logits."""

import pytest
import torch

from topic_lm_hf import TopicContextCollator, build_vocabularies, load_documents

from conftest import tiny_model, variants

peft = pytest.importorskip("peft", reason="peft is not installed (pip install -e .[test])")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus():
    """A handful of real documents (wikipedia-sample, shipped with the package) and their vocabularies."""
    docs = load_documents("wikipedia-sample", max_documents=12)
    tok, topic_tok = build_vocabularies(docs, min_freq=1, stopwords="mallet")
    return docs, tok, topic_tok


@pytest.mark.parametrize("targets", [["lm_head"], ["lm_head", "embed_tokens"]], ids=["lm_head", "lm_head+embed"])
@pytest.mark.parametrize("family", variants(representative=True))
def test_a_lora_on_lm_head_trains_saves_reloads_and_merges(tmp_path, corpus, family, targets):
    from transformers import Trainer, TrainingArguments

    docs, tok, topic_tok = corpus
    model = tiny_model(family, tok, topic_tok)
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="train")
    rows = collator.prepare(docs)
    if hasattr(model, "set_training_corpus_size"):
        model.set_training_corpus_size(len(rows))
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets))
    before = {n: p.detach().clone() for n, p in lora.named_parameters() if p.requires_grad}
    assert before and all("lora_" in n for n in before)
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=3,
                             learning_rate=1e-2, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no",
                             remove_unused_columns=False, label_names=["labels"], seed=0)
    Trainer(model=lora, args=args, train_dataset=rows, data_collator=collator).train()
    # every LoRA matrix moved: lm_head's A and B (B starts at zero, so A moves only once B has), and the others'
    moved = {n for n, p in lora.named_parameters() if p.requires_grad and not torch.equal(p, before[n])}
    assert moved == set(before), sorted(set(before) - moved)

    batch = collator([rows[i] for i in range(3)])
    batch.pop("labels")
    lora.eval()
    with torch.no_grad():
        expected = lora(**batch).logits
    lora.save_pretrained(tmp_path / "adapter")
    loaded = peft.PeftModel.from_pretrained(tiny_model(family, tok, topic_tok), tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected)
        merged = loaded.merge_and_unload().eval()
        assert type(merged) is type(model)
        torch.testing.assert_close(merged(**batch).logits, expected, rtol=1e-4, atol=1e-4)


def test_a_forward_hook_on_lm_head_runs_in_training_and_the_loss_is_unchanged(corpus):
    docs, tok, topic_tok = corpus
    model = tiny_model("lstm_lm", tok, topic_tok).train()
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="train")
    batch = collator([collator.prepare(docs)[i] for i in range(3)])
    fused = model(**batch).loss
    calls = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    try:
        hooked = model(**batch).loss
    finally:
        handle.remove()
    assert len(calls) == 1  # the layer ran as a module, at the predicted positions only
    torch.testing.assert_close(hooked, fused)
