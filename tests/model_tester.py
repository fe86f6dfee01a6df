"""The contract every model family of the package keeps, checked the same way on every family and variant
(transformers' ``ModelTesterMixin`` / ``GenerationTesterMixin``, for these recurrent topic LMs).

``FAMILIES`` is the one family table: a tiny configuration per variant, the weights that make its topics matter,
the conditioning it takes (and the reason for each kind it does not take), the size of its recurrent ``state``
and whether it can tie its embeddings. Its keys are the family registry's variants (``Family.variants`` of
``topic_lm_hf.families``), each configuration with the values that make its variant: ``tests/test_model_contract.py``
checks both, so that a variant added to the registry cannot be left out of the contract. :class:`ModelTester` holds the checks; ``tests/test_model_contract.py``
runs each of them on every family:

* ``check_save_load_round_trip``: safetensors only, the Auto classes, identical weights, buffers and outputs,
  the body through ``AutoModel``, the code files and ``auto_map`` for ``trust_remote_code``;
* ``check_tied_embeddings``: one stored matrix, still tied after loading;
* ``check_padded_rows_equal_unpadded_rows``: left and right padding change no real position nor the state;
* ``check_state_equivalence``: a whole sequence equals its first chunk and then the rest with the returned
  ``state`` (transformers' ``create_and_check_state_equivalency``);
* ``check_generation``: cached equals uncached generation (greedy, beam search, beam search with
  ``num_return_sequences``, sampling without a prompt) and a batch equals its prompts one by one;
* ``remote_code_job`` / :class:`RemoteCodeRun` / ``check_remote_code``: a folder saved for the Hub loads with
  ``trust_remote_code=True`` in a process where the package cannot be imported (``conftest.run_without_package``;
  one process for every family) and gives the same outputs, tokenizer, topics and classifier.

Inputs are real sentences and documents of ``wikipedia-sample``, the corpus that ships with the package.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, LSTMLMModel, NCLMConfig, NCLMForCausalLM, NCLMModel,
                         RGBNRNNConfig, RGBNRNNForCausalLM, RGBNRNNModel, TCNLMConfig, TCNLMForCausalLM, TCNLMModel,
                         TopicContextCollator, TopicRNNConfig, TopicRNNForCausalLM, TopicRNNModel,
                         make_bow, save_vocabularies)


F32 = dict(rtol=1e-5, atol=1e-5)  # float32 precision for O(1) activations: every state / padding copy's tolerance
# Kinds of topic conditioning. A per-row kind gives one row per prompt; a "-shared" kind one value for every row.
CONDITIONS = ("prior", "context_bow", "context_bow-shared", "topic_ids", "topic_ids-shared", "topic_mixture",
              "topic_mixture-shared", "theta")
ROW_KEYS = ("context_bow", "topic_ids", "topic_mixture", "theta")  # what a per-row kind slices, row by row
GENERATE_ONLY = ("topic_mode",)  # generate() arguments that forward() does not take
MODES = {"greedy": dict(do_sample=False), "beam": dict(num_beams=3, do_sample=False),
         "beam-nrs": dict(num_beams=3, num_return_sequences=2, do_sample=False),
         "sample": dict(do_sample=True)}  # "sample": without a prompt, one <bos> row per conditioning row
# The (conditioning kind, decoding mode) pairs of the generation check: greedy and beam search with
# num_return_sequences under every kind; beam search alone and sampling under the kinds that the families' own
# copies ran them with (test_lstm_lm, test_topic_rnn and the naive MoE's copy; test_rgbn_rnn's), the CI budget
# being what it is.
GENERATION = [(kind, mode) for mode in ("greedy", "beam-nrs") for kind in CONDITIONS] + \
    [(kind, "beam") for kind in ("prior", "context_bow", "topic_mixture", "topic_ids-shared")] + \
    [(kind, "sample") for kind in ("prior", "context_bow", "topic_ids", "topic_ids-shared")]


# ----------------------------------------------------------------------------------------------
# weights that make the topics matter (what each family's own tests did to their small models)
# ----------------------------------------------------------------------------------------------


def randomize_(module, scale):
    """Move every parameter away from its structured initialisation (TCNLM's W_b ~ 1), so that the topic matters."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * scale)


def fixed_init_(module, scale=0.6):
    """Deterministic, non-trivial weights (torchtune's fixed_init_model), as test_topic_rnn gives TopicRNN."""
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(module.named_parameters())):
            p.copy_(scale * torch.sin(torch.arange(p.numel(), dtype=torch.float32) * 0.37 + i).view_as(p))


def _sharpen_topic_model(model):
    """NCLM: sharper NVDM weights than Glorot's, so that topics and sentences matter (test_nclm's ``make``)."""
    with torch.no_grad():
        for p in model.model.topic_model.parameters():
            p.mul_(4.0)


# ----------------------------------------------------------------------------------------------
# conditioning values: builders take (the tester's data, the model's config) and give a list of variants
# ----------------------------------------------------------------------------------------------


def _rows_of_topic_ids(k):
    return [[k - 1], [1, k - 2], [0]]  # one topic, two topics, topic 0


def _mixture(rows, k, simplex, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * 2
    return torch.softmax(x, -1) if simplex else x  # TopicRNN's theta is any real vector


def _topic_conditions(simplex: bool) -> dict:
    """TCNLM, TopicRNN and NCLM: a document's bag of words, topic ids (an equal mixture of them) or a mixture."""
    return {
        "context_bow": lambda d, c: [{"context_bow": d.bows[:3]}],
        "context_bow-shared": lambda d, c: [{"context_bow": d.bows[3:4]}],
        "topic_ids": lambda d, c: [{"topic_ids": _rows_of_topic_ids(c.num_topics)}],
        "topic_ids-shared": lambda d, c: [{"topic_ids": [c.num_topics - 1, 1]}],
        "topic_mixture": lambda d, c: [{"topic_mixture": _mixture(3, c.num_topics, simplex)}],
        "topic_mixture-shared": lambda d, c: [{"topic_mixture": _mixture(1, c.num_topics, simplex)[0]}],
        "theta": "theta is rGBN-RNN's conditioning (gamma weights of every layer); this family takes "
                 "topic_mixture instead",
    }


NO_TOPICS = "the LSTM LM has no topics: generate() refuses every topic argument"
RGBN_CONDITIONS = {
    "context_bow": lambda d, c: [{"context_bow": d.bows[:3]}],
    "context_bow-shared": lambda d, c: [{"context_bow": d.bows[3:4]}],
    # topics of any layer (topic_layer), and a path down the topic tree (topic_mode="chain", generate() only)
    "topic_ids": lambda d, c: [{"topic_ids": [[1], [5], [0]], "topic_layer": 1}],
    "topic_ids-shared": lambda d, c: [{"topic_ids": [2], "topic_layer": 3},
                                      {"topic_ids": [0, 3], "topic_layer": 2, "topic_mode": "chain"}],
    "topic_mixture": "rGBN-RNN takes no topic_mixture: its theta is unnormalised gamma weights of every layer "
                     "(the 'theta' kind)",
    "topic_mixture-shared": "rGBN-RNN takes no topic_mixture: its theta is unnormalised gamma weights of every "
                            "layer (the 'theta' kind)",
    "theta": lambda d, c: [{"theta": torch.rand(3, sum(c.topic_sizes), generator=torch.Generator().manual_seed(4))
                            * 3}],
}


# ----------------------------------------------------------------------------------------------
# the family table
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """What the shared checks need to know about one family variant."""

    config_class: type
    lm_class: type
    base_class: type
    config: dict  # tiny sizes and the variant's options
    state_size: int  # tensors in the returned ``state``
    conditions: dict = field(default_factory=dict)  # kind -> builder, or the reason the family does not take it
    reads: tuple = ()  # batch fields its forward reads besides the tokens
    prepare: Optional[Callable] = None  # in-place weight changes that make the conditioning matter
    tie: Union[dict, str] = "tie_word_embeddings is not supported"  # overrides that tie, or why it cannot
    exact_round_trip: tuple = ()  # the round-trip batches whose outputs its own copy required bit-identical
    # the others' tolerance after loading: test_lstm_lm's (a memory-mapped checkpoint may take another SIMD path)
    round_trip_tolerance: dict = field(default_factory=lambda: dict(rtol=1e-5, atol=1e-8))
    stochastic_prior: bool = False  # without conditioning its topics are sampled (rGBN-RNN's prior)
    documents_layout: bool = False  # reads whole documents (b, c, s) natively (rGBN-RNN)
    new_tokens: int = 6  # tokens of every generation check (as many as the family's own copy generated)
    prompts: int = 2  # rows of the generation checks (as many as the family's own copy had)

    def condition(self, kind: str):
        """The builder of conditioning ``kind`` (the prior: none), or the reason the family does not take it."""
        return (lambda d, c: [{}]) if kind == "prior" else self.conditions.get(kind, NO_TOPICS)


LSTM_SIZES = dict(embedding_size=12, hidden_size=16, num_hidden_layers=2, dropout=0.1)
TCNLM = dict(num_factors=10, encoder_hidden_size=16, topic_embedding_size=8, initializer_range=0.5, **LSTM_SIZES)
# test_topic_rnn's sizes (one layer): its copy of the classifier check asked torch.allclose's 1e-8 of these
TOPIC_RNN = dict(num_topics=3, inference_hidden_size=4, embedding_size=6, hidden_size=5, dropout=0.1)
NCLM = dict(num_topics=5, embedding_size=12, hidden_size=16, num_hidden_layers=2, encoder_hidden_size=10,
            dropout=0.0, etr_top_n=4, num_topic_samples=3, initializer_range=0.3)
RGBN = dict(topic_sizes=[8, 6, 4], hidden_sizes=[16, 12, 8], embedding_size=12, dropout=0.0, initializer_range=0.3)
TOPIC_RNN_TIE = ("TopicRNN cannot tie its embeddings: TopicRNNConfig drops tie_word_embeddings (the softmax "
                 "adds the topic head B theta to W h)")
RGBN_TIE = "rGBN-RNN cannot tie its embeddings: the output layer reads the concatenation of every layer's output"


def _nclm(variant, sentence_topics):
    return Family(NCLMConfig, NCLMForCausalLM, NCLMModel,
                  dict(variant=variant, sentence_topics=sentence_topics, **NCLM),
                  state_size=3 if sentence_topics else 2,  # + the sentence topics' running state
                  conditions=_topic_conditions(simplex=True), reads=("context_bow", "sentence_prefix_bow"),
                  prepare=_sharpen_topic_model, tie={"tie_word_embeddings": True, "embedding_size": 16},
                  exact_round_trip=("chunks",))


def _topic_rnn(cell, **extra):
    simplex = extra.get("theta_transform") == "softmax"  # topic proportions: a mixture is a distribution
    return Family(TopicRNNConfig, TopicRNNForCausalLM, TopicRNNModel, dict(cell=cell, **TOPIC_RNN, **extra),
                  state_size=2 if cell == "lstm" else 1, conditions=_topic_conditions(simplex=simplex),
                  reads=("context_bow",), prepare=fixed_init_, tie=TOPIC_RNN_TIE,
                  round_trip_tolerance=dict(rtol=0, atol=1e-5))  # its copy's: ~5e-7 seen on GRU weights


def _rgbn(recurrent):
    return Family(RGBNRNNConfig, RGBNRNNForCausalLM, RGBNRNNModel, dict(recurrent=recurrent, **RGBN),
                  state_size=4 * 3, conditions=RGBN_CONDITIONS, reads=("context_bow",), tie=RGBN_TIE,
                  exact_round_trip=("chunks", "documents"), stochastic_prior=True, documents_layout=True,
                  new_tokens=8)


FAMILIES = {
    "lstm_lm": Family(LSTMLMConfig, LSTMLMForCausalLM, LSTMLMModel, dict(initializer_range=0.5, **LSTM_SIZES),
                      state_size=2, tie={"tie_word_embeddings": True}, new_tokens=8, prompts=3),
    "tcnlm": Family(TCNLMConfig, TCNLMForCausalLM, TCNLMModel, dict(num_topics=6, **TCNLM), state_size=2,
                    conditions=_topic_conditions(simplex=True), reads=("context_bow",),
                    prepare=lambda m: randomize_(m.model.layers, 0.4), tie={"tie_word_embeddings": True},
                    prompts=3),
    "tcnlm-naive_moe": Family(TCNLMConfig, TCNLMForCausalLM, TCNLMModel,
                              dict(num_topics=4, lm_type="naive_moe", **TCNLM), state_size=2,
                              conditions=_topic_conditions(simplex=True), reads=("context_bow",),
                              prepare=lambda m: randomize_(m.model.experts, 0.3),
                              tie={"tie_word_embeddings": True}, prompts=3),
    "topic_rnn-rnn": _topic_rnn("rnn"),
    "topic_rnn-lstm": _topic_rnn("lstm"),
    "topic_rnn-gru": _topic_rnn("gru"),
    "topic_rnn-softmax": _topic_rnn("lstm", theta_transform="softmax"),
    "nclm-lta": _nclm("lta", False),
    "nclm-eta": _nclm("eta", False),
    "nclm-leta": _nclm("leta", False),
    "nclm-leta-sdt": _nclm("leta", True),
    "nclm-eta-sdt": _nclm("eta", True),
    "gbn": _rgbn(False),
    "rgbn": _rgbn(True),
}


# ----------------------------------------------------------------------------------------------
# data: real Wikipedia sentences (the conftest's wiki)
# ----------------------------------------------------------------------------------------------


@dataclass
class ContractData:
    tok: object
    topic_tok: object
    documents: object  # validation documents: prompts, bags of words, chunk and documents batches
    source: str
    # Logits near 0 that are sums of O(1) terms differ after loading by a float32 ulp at 1 (1.2e-7, seen on NCLM):
    # the round trips allow two such ulps absolute where a family's copy asked less (test_lstm_lm's 1e-8).
    atol_floor: float = 2.4e-7

    def __post_init__(self):
        sentences = [s for doc in self.documents["sentences"] for s in doc if len(s) >= 12]
        # three prompts of 12, 2 and 7 words: the batch has padding on every row but the first
        self.prompts = [" ".join(sentences[0][:12]), " ".join(sentences[1][:2]), " ".join(sentences[2][:7])]
        self.bows = make_bow([[w for s in doc for w in s] for doc in self.documents["sentences"][:4]], self.topic_tok)
        assert (self.bows.sum(-1) > 0).all()
        collator = TopicContextCollator(self.tok, self.topic_tok, context="preceding", max_sentence_length=6,
                                        sentence_prefix=True)
        rows = collator.prepare(self.documents.select([0, 1]))
        self.chunks = collator([rows[i] for i in range(8)])  # continuation chunks carry a sentence prefix
        assert (self.chunks["sentence_prefix_bow"].sum(-1) > 0).any()
        sequences = TopicContextCollator(self.tok, self.topic_tok, context="document", layout="sequence",
                                         max_document_length=40)
        self.sequence_batch = sequences(list(sequences.prepare(self.documents.select([0, 1, 2]))))
        documents = TopicContextCollator(self.tok, self.topic_tok, context="preceding", layout="documents",
                                         max_sentence_length=10)
        rows = documents.prepare(self.documents.select([0, 1, 2]))
        self.document_batch = documents([rows[i] for i in range(len(rows))])

    def padded(self, side: str, rows: int = 3) -> dict:
        return dict(self.tok(self.prompts[:rows], return_tensors="pt", padding=True, padding_side=side))

    def one(self, i: int) -> dict:
        return dict(self.tok([self.prompts[i]], return_tensors="pt"))


def load_contract_data(request) -> ContractData:
    wiki = request.getfixturevalue("wiki")
    return ContractData(wiki["tok"], wiki["topic_tok"], wiki["valid"], "wikipedia-sample")


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def assert_same_outputs(family: Family, data: ContractData, batch: str, got, want, msg: str = ""):
    """A loaded model's outputs on ``batch``: bit-identical where the family's own copy asked for it (NCLM's chunks,
    rGBN-RNN's chunks and documents), else within the family's round-trip tolerance."""
    if batch in family.exact_round_trip:
        assert torch.equal(got, want), f"{msg} {batch}"
        return
    tolerance = family.round_trip_tolerance
    tolerance = {**tolerance, "atol": max(tolerance["atol"], data.atol_floor)}
    diff = (got - want).abs().max().item()
    torch.testing.assert_close(got, want, **tolerance, msg=f"{msg} {batch}: max difference {diff:.3g}")


def slice_rows(kind: str, conditioning: dict, start: int, stop: int) -> dict:
    """Rows ``start:stop`` of the conditioning: per-row kinds keep those rows, shared kinds are the same for every
    row."""
    if kind.endswith("-shared") or kind == "prior":
        return conditioning
    return {k: (v[start:stop] if k in ROW_KEYS else v) for k, v in conditioning.items()}


def slice_row(kind: str, conditioning: dict, i: int) -> dict:
    return slice_rows(kind, conditioning, i, i + 1)


def relative_imports(source: str) -> set[str]:
    return set(re.findall(r"^\s*from \.(\w+) import", source, flags=re.MULTILINE))


# ----------------------------------------------------------------------------------------------
# the tester
# ----------------------------------------------------------------------------------------------


class ModelTester:
    """One family variant: builds its tiny model and runs the shared checks on it."""

    def __init__(self, name: str, data: ContractData):
        self.name, self.family, self.data = name, FAMILIES[name], data
        self.model = self.build().eval()  # shared by the checks of a module: never changed by them

    # -- models and inputs ----------------------------------------------------------------------

    def config(self, **overrides):
        f, d = self.family, self.data
        kwargs = {**f.config, **overrides}
        if f.config_class is LSTMLMConfig:
            vocab = d.tok.get_vocab()
            return LSTMLMConfig(vocab_size=len(d.tok), pad_token_id=vocab["<pad>"], bos_token_id=vocab["<bos>"],
                                eos_token_id=vocab["<eos>"], **kwargs)
        return f.config_class.from_tokenizers(d.tok, d.topic_tok, **kwargs)

    def build(self, **overrides):
        torch.manual_seed(0)
        model = self.family.lm_class(self.config(**overrides))
        if self.family.prepare is not None:
            self.family.prepare(model)
        return model

    def conditions(self, kind: str, forward: bool = False) -> list[dict]:
        """The variants of conditioning ``kind``; skips with the family's reason where it does not take it.
        ``forward``: only the variants that forward() takes too."""
        builder = self.family.condition(kind)
        if isinstance(builder, str):
            pytest.skip(f"{self.name}: {builder}")
        variants = builder(self.data, self.model.config)
        if forward:
            variants = [v for v in variants if not set(v) & set(GENERATE_ONLY)]
        return variants

    def supported_conditions(self, forward: bool = False):
        """(kind, variant) of every conditioning the family takes (the prior included)."""
        for kind in CONDITIONS:
            builder = self.family.condition(kind)
            if isinstance(builder, str):
                continue
            for variant in builder(self.data, self.model.config):
                if not (forward and set(variant) & set(GENERATE_ONLY)):
                    yield kind, variant

    def batch_inputs(self, batch: dict) -> dict:
        """The fields of a collator batch that the family's forward reads."""
        keys = ("input_ids", "attention_mask") + self.family.reads
        if self.family.documents_layout and batch["input_ids"].dim() == 3:
            keys += ("chunk_mask", "sentence_index")
        return {k: batch[k] for k in keys if k in batch}

    def round_trip_batches(self) -> dict[str, dict]:
        """Left-padded prompts with each row's bag of words, real right-padded chunks (continuations with their
        sentence prefix), and for a documents family a documents batch."""
        d, f = self.data, self.family
        prompts = d.padded("left")
        if "context_bow" in f.reads:
            prompts["context_bow"] = d.bows[:3]
        batches = {"prompts": prompts, "chunks": self.batch_inputs(d.chunks)}
        if f.documents_layout:
            batches["documents"] = self.batch_inputs(d.document_batch)
        return batches

    def train_step(self, model):
        """One training forward and backward (KL annealing counters move; rGBN-RNN's TLASGR gathers statistics and
        updates Phi and Pi), so that the round trip also carries the training buffers."""
        model.train()
        if self.family.documents_layout:
            batch = {**self.batch_inputs(self.data.document_batch), "labels": self.data.document_batch["labels"]}
        else:
            batch = {**self.batch_inputs(self.data.chunks), "labels": self.data.chunks["labels"]}
        if hasattr(model, "set_training_corpus_size"):
            model.set_training_corpus_size(len(self.data.documents))
        torch.manual_seed(1)
        model(**batch).loss.backward()
        if hasattr(model, "tlasgr_step"):
            model.tlasgr_step()
            assert int(model.model.tlasgr_step_count) == 1
        model.zero_grad()
        return model.eval()

    # -- save / load ----------------------------------------------------------------------------

    def check_body_loads_from_the_lm_folder(self, lm, folder: Path, batches: dict[str, dict]):
        """``AutoModel`` on a causal LM's folder: the body, every weight and buffer the LM's ``model.*``, nothing
        missing or unexpected, the same hidden states."""
        body, info = AutoModel.from_pretrained(folder, output_loading_info=True)
        body.eval()
        assert type(body) is self.family.base_class
        assert info["unexpected_keys"] == set() and info["missing_keys"] == set()
        lm_state = lm.state_dict()
        for name, tensor in body.state_dict().items():
            assert torch.equal(tensor, lm_state[f"model.{name}"]), name
        with torch.no_grad():
            for name, batch in batches.items():
                assert_same_outputs(self.family, self.data, name, body(**batch).last_hidden_state,
                                    lm.model(**batch).last_hidden_state, "AutoModel hidden states,")
        # the ignore list only hides what the body lacks: a causal LM still reports keys it does not know
        state = {**lm.state_dict(), "lm_head.extra": torch.zeros(1)}
        assert set(lm.load_state_dict(state, strict=False).unexpected_keys) == {"lm_head.extra"}
        lm.load_state_dict(lm_state)

    def check_save_load_round_trip(self, folder: Path):
        f, d = self.family, self.data
        model = self.train_step(self.build())
        model.save_pretrained(folder)
        save_vocabularies(d.tok, d.topic_tok, folder)
        # safetensors only, every tensor of the state dict in it
        assert (folder / "model.safetensors").exists() and not list(folder.glob("*.bin"))
        assert set(load_file(folder / "model.safetensors")) == set(model.state_dict())
        # the code for trust_remote_code: auto_map names the files; everything they import is in the folder
        config_json = model.config.to_dict()
        config_module = f"configuration_{f.config_class.model_type}"
        lm_module = f"modeling_{f.config_class.model_type}"
        saved = json.loads((folder / "config.json").read_text())
        assert saved["model_type"] == f.config_class.model_type
        assert saved["auto_map"] == self.full_auto_map()  # every Auto class of the family, from any save
        todo, seen = [config_module, lm_module], set()
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            assert (folder / f"{module}.py").exists(), f"{module}.py is imported by the saved code but not saved"
            todo.extend(relative_imports((folder / f"{module}.py").read_text()))
        # with the package imported, its registered class is used, not the copied code
        loaded = AutoModelForCausalLM.from_pretrained(folder).eval()
        assert type(loaded) is f.lm_class
        ignore = ("auto_map", "transformers_version", "_name_or_path")
        assert {k: v for k, v in loaded.config.to_dict().items() if k not in ignore} == \
            {k: v for k, v in config_json.items() if k not in ignore}
        state = model.state_dict()
        assert loaded.state_dict().keys() == state.keys()
        for name, tensor in loaded.state_dict().items():
            assert torch.equal(tensor, state[name]) and tensor.dtype == state[name].dtype, name
        buffers = dict(loaded.named_buffers())
        for name, buffer in model.named_buffers():  # non-persistent ones too
            assert torch.equal(buffer, buffers[name]), name
        batches = self.round_trip_batches()
        with torch.no_grad():
            for name, batch in batches.items():
                assert_same_outputs(f, d, name, loaded(**batch).logits, model(**batch).logits)
        if hasattr(model, "get_topics"):  # the topic tokenizer saved next to the model
            assert loaded.get_topics(top_n=3) == model.get_topics(top_n=3, topic_tokenizer=d.topic_tok)
        self.check_body_loads_from_the_lm_folder(model, folder, batches)
        # a sequence classifier from the LM folder gets the LM's body (base_model_prefix="model"), frozen by default
        classifier = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
        assert type(classifier).__name__ == f.lm_class.__name__.replace("ForCausalLM", "ForSequenceClassification")
        body = dict(model.model.named_parameters())
        for name, p in classifier.model.named_parameters():
            assert torch.equal(p, body[name]) and not p.requires_grad, name
        with torch.no_grad():
            features = classifier.model.document_representation(d.sequence_batch)
            torch.testing.assert_close(features, model.document_representation(d.sequence_batch), rtol=1e-5,
                                       atol=1e-8)  # torch.allclose's tolerance, as test_topic_rnn's copy

    def check_tied_embeddings(self, folder: Path):
        if isinstance(self.family.tie, str):  # it cannot tie (family.tie says why): asked to, it refuses or says so
            try:
                model = self.build(tie_word_embeddings=True)
            except ValueError as error:
                assert "tie_word_embeddings" in str(error), error
                return
            assert not model.config.tie_word_embeddings, f"{self.name}: {self.family.tie}"
            assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
            return
        model = self.build(**self.family.tie).eval()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        model.save_pretrained(folder)
        keys = set(load_file(folder / "model.safetensors"))
        assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
        loaded = AutoModelForCausalLM.from_pretrained(folder).eval()
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
        batches = self.round_trip_batches()
        with torch.no_grad():
            for name, batch in batches.items():
                assert_same_outputs(self.family, self.data, name, loaded(**batch).logits, model(**batch).logits)
        self.check_body_loads_from_the_lm_folder(model, folder, batches)

    # -- padding and state --------------------------------------------------------------------

    def check_padded_rows_equal_unpadded_rows(self, side: str):
        """Every row of a padded batch (with each conditioning the family takes) gives the logits at its real
        positions and the state of the row run alone, with and without the cache."""
        model, d = self.model, self.data
        batch = d.padded(side)
        assert (batch["attention_mask"] == 0).any(dim=1).sum() == 2
        seen = []
        with torch.no_grad():
            for kind, conditioning in self.supported_conditions(forward=True):
                for use_cache in (True, False):
                    both = model(**batch, **conditioning, use_cache=use_cache)
                    assert (both.state is not None) == use_cache
                    for i in range(len(d.prompts)):
                        alone = model(**d.one(i), **slice_row(kind, conditioning, i), use_cache=use_cache)
                        real = batch["attention_mask"][i].bool()
                        msg = f"{kind} {side} row {i} use_cache={use_cache}"
                        torch.testing.assert_close(both.logits[i][real], alone.logits[0], **F32, msg=msg)
                        if use_cache:
                            assert len(both.state) == len(alone.state) == self.family.state_size
                            for a, b in zip(both.state, alone.state):
                                torch.testing.assert_close(a[i], b[0], **F32, msg=msg)
                seen.append(both.logits)
        # the conditioning reaches the logits (else the checks above would not test it)
        if len(seen) > 1:
            assert all((logits - seen[0]).abs().max() > 1e-4 for logits in seen[1:])

    def check_state_equivalence(self, side: str):
        """A padded batch run whole equals its first k tokens and then the rest with the returned state: the
        logits at every real position and the final state (transformers' create_and_check_state_equivalency).
        Right padding splits at 1, 3 and 7 (short rows end inside the first chunk); left padding where every row
        has begun (bos and a word in the first chunk)."""
        model, d = self.model, self.data
        batch = d.padded(side)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        splits = (1, 3, 7) if side == "right" else (int((mask == 0).sum(1).max()) + 2,)
        with torch.no_grad():
            for kind, conditioning in self.supported_conditions(forward=True):
                full = model(**batch, **conditioning, use_cache=True)
                assert len(full.state) == self.family.state_size
                for k in splits:
                    first = model(input_ids=ids[:, :k], attention_mask=mask[:, :k], **conditioning, use_cache=True)
                    rest = model(input_ids=ids[:, k:], attention_mask=mask[:, k:], state=first.state,
                                 **conditioning, use_cache=True)
                    msg = f"{kind} {side} split at {k}"
                    logits = torch.cat([first.logits, rest.logits], 1)
                    real = mask.bool()
                    torch.testing.assert_close(logits[real], full.logits[real], **F32, msg=msg)
                    assert len(rest.state) == len(full.state)
                    for a, b in zip(rest.state, full.state):
                        torch.testing.assert_close(a, b, **F32, msg=msg)

    # -- generation -----------------------------------------------------------------------------

    def check_refused(self, kind: str):
        """``generate()`` refuses conditioning ``kind``, which the family does not take, in one error naming it."""
        keyword = kind.removesuffix("-shared")
        value = {"context_bow": self.data.bows[:1], "topic_ids": [[0]], "topic_mixture": torch.full((1, 4), 0.25),
                 "theta": torch.ones(1, 4)}[keyword]
        with pytest.raises(ValueError, match=keyword):
            self.model.generate(**{keyword: value}, max_new_tokens=1)

    def check_generation(self, kind: str, mode: str):
        """Cached generation equals uncached generation; with a prompt, every row of a left-padded batch equals
        its prompt generated alone (with its row of the conditioning). A kind the family does not take: refused."""
        model, d = self.model, self.data
        if isinstance(self.family.condition(kind), str):
            self.check_refused(kind)
            return
        variants = self.conditions(kind)
        new, rows = self.family.new_tokens, self.family.prompts
        decoding = dict(MODES[mode], max_new_tokens=new, min_new_tokens=new)
        n = decoding.get("num_return_sequences", 1)
        per_row = not (kind.endswith("-shared") or kind == "prior")
        for conditioning in variants:
            conditioning = slice_rows(kind, conditioning, 0, rows)
            msg = f"{self.name} {kind} {conditioning.keys()} {mode}"
            if mode == "sample":  # no prompt: one <bos> row per conditioning row
                outs = []
                for use_cache in (True, False):
                    torch.manual_seed(11)
                    outs.append(model.generate(**conditioning, **decoding, use_cache=use_cache))
                assert torch.equal(outs[0], outs[1]), msg
                assert outs[0].shape == (rows if per_row else 1, 1 + new), msg
                assert (outs[0][:, 0] == model.config.bos_token_id).all(), msg
                continue
            batch = d.padded("left", rows)
            outs = []
            for use_cache in (True, False):
                torch.manual_seed(11)  # rGBN-RNN's prior samples theta
                outs.append(model.generate(**batch, **conditioning, **decoding, use_cache=use_cache))
            cached, uncached = outs
            assert torch.equal(cached, uncached), msg
            assert cached.shape == (rows * n, batch["input_ids"].shape[1] + new), msg
            if kind == "prior" and self.family.stochastic_prior:
                continue  # a row alone draws other topics from the prior than in the batch: nothing to compare
            for i in range(rows):
                single = model.generate(**d.one(i), **slice_row(kind, conditioning, i), **decoding)
                assert torch.equal(cached[i * n:(i + 1) * n, -new:], single[:, -new:]), \
                    f"{msg} row {i}"

    # -- remote code ----------------------------------------------------------------------------

    def remote_code_job(self, root: Path, name: str) -> tuple[dict, dict]:
        """Save for the Hub, into ``root/hub``, a Hub cache in huggingface_hub's own layout
        (``models--org--name/refs/main`` naming the revision, ``snapshots/<revision>/`` its files), as a download
        leaves it; and with a plain ``save_pretrained`` (what a Trainer checkpoint writes) into ``root/name-saved``.
        Returns the inputs a process without the package runs on them (by repo id, offline), and what this
        process gets from them: the logits under every conditioning the family takes, greedy generation from the
        padded prompts (without conditioning and with one row each of the documents' bags of words), and from
        <bos> under each shared conditioning."""
        from topic_lm_hf.hub import save_for_hub

        model, d = self.model, self.data
        repo_id, revision = f"topic-lm-hf/{name}", "0123456789abcdef0123456789abcdef01234567"
        repo = root / "hub" / f"models--{repo_id.replace('/', '--')}"
        folder = repo / "snapshots" / revision
        save_for_hub(model, folder, d.tok, d.topic_tok, repo_id=repo_id)
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(revision)
        saved = root / f"{name}-saved"
        model.save_pretrained(saved)
        batch = d.padded("left")
        forward = {f"{kind} {i}": v for i, (kind, v) in enumerate(self.supported_conditions(forward=True))}
        decoding = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False)
        generate = {name: {**batch, **v, **decoding} for name, v in forward.items()
                    if name.startswith(("prior", "context_bow "))}
        for i, (kind, v) in enumerate(self.supported_conditions()):  # from <bos>, under the conditioning alone
            if kind == "prior" or kind.endswith("-shared"):
                generate[f"{kind} {i} without a prompt"] = {**v, **decoding}
        job = {"repo_id": repo_id, "saved": str(saved), "prompts": d.prompts, "forward": {k: {**batch, **v} for k, v in forward.items()},
               "generate": generate, "topics": hasattr(model, "get_topics")}
        expected = {"ids": batch["input_ids"], "logits": {}, "generated": {},
                    "auto_map": json.loads((folder / "config.json").read_text())["auto_map"],
                    "saved_auto_map": json.loads((saved / "config.json").read_text())["auto_map"]}
        with torch.no_grad():
            for name, inputs in job["forward"].items():
                torch.manual_seed(11)
                expected["logits"][name] = model(**inputs).logits
        for name, inputs in generate.items():
            torch.manual_seed(11)
            expected["generated"][name] = model.generate(**inputs)
        if job["topics"]:
            expected["topics"] = model.get_topics(top_n=3, topic_tokenizer=d.topic_tok)
        return job, expected

    def full_auto_map(self) -> dict:
        f = self.family
        model_type, lm = f.config_class.model_type, f.lm_class.__name__
        return {"AutoConfig": f"configuration_{model_type}.{f.config_class.__name__}",
                "AutoModel": f"modeling_{model_type}.{f.base_class.__name__}",
                "AutoModelForCausalLM": f"modeling_{model_type}.{lm}",
                "AutoModelForSequenceClassification":
                    f"modeling_{model_type}.{lm.replace('ForCausalLM', 'ForSequenceClassification')}"}

    def check_remote_code(self, result: dict, expected: dict):
        f = self.family
        lm, model_type = f.lm_class.__name__, f.config_class.model_type
        classifier = lm.replace("ForCausalLM", "ForSequenceClassification")
        assert expected["auto_map"] == self.full_auto_map()  # save_for_hub maps every Auto class the family has
        assert expected["saved_auto_map"] == self.full_auto_map()  # and so does save_pretrained
        # every Auto class loads the save_pretrained folder without the package
        assert result["saved"] == {"AutoConfig": type(self.model.config).__name__, "AutoModel": f.base_class.__name__,
                                   "AutoModelForCausalLM": lm, "AutoModelForSequenceClassification": classifier}
        # without trust_remote_code, transformers asks for it instead of suggesting an upgrade
        assert "trust_remote_code=True" in result["message"] and "upgrade" not in result["message"]
        assert result["module"].startswith("transformers_modules") and result["class"] == f.lm_class.__name__
        assert torch.equal(result["ids"], expected["ids"])  # the tokenizer loads from the folder too
        assert result["topic_vocabulary"] == len(self.data.topic_tok)  # and the topic tokenizer
        assert result["logits"].keys() == expected["logits"].keys()
        for name, logits in expected["logits"].items():
            torch.testing.assert_close(result["logits"][name], logits, rtol=1e-5, atol=1e-6, msg=name)
        assert result["generated"].keys() == expected["generated"].keys()
        for name, ids in expected["generated"].items():
            assert torch.equal(result["generated"][name], ids), name
        if "topics" in expected:
            assert result["topics"] == expected["topics"]
        # a sequence classifier from the LM folder: the family's, with the frozen body of the paper's recipe
        assert result["classifier"] == classifier
        assert result["frozen"]


# The body of the process without the package: loads every folder of ``jobs.pt`` and writes ``results.pt``.
REMOTE_SCRIPT = """
import os, sys
sys.stdin = open(os.devnull)  # transformers' "run the custom code? [y/N]" prompt gets no answer: an error at once
import torch
os.environ["HF_HUB_CACHE"] = os.path.abspath("hub")  # before transformers reads it
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          AutoTokenizer, PreTrainedTokenizerFast)
torch.set_num_threads(1)  # it runs beside the tests of the module
jobs = torch.load("jobs.pt", weights_only=False)
results = {}
for name, job in jobs.items():
    path, r = job["repo_id"], {}  # a repo id, found offline in the Hub cache (HF_HUB_CACHE, HF_HUB_OFFLINE=1)
    try:
        AutoModelForCausalLM.from_pretrained(path)
        r["message"] = ""
    except ValueError as error:
        r["message"] = str(error)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    topic_tok = PreTrainedTokenizerFast.from_pretrained(path, subfolder="topic_tokenizer")
    r["topic_vocabulary"] = len(topic_tok)
    r["module"], r["class"] = type(model).__module__, type(model).__name__
    r["ids"] = tok(job["prompts"], return_tensors="pt", padding=True, padding_side="left")["input_ids"]
    r["logits"], r["generated"] = {}, {}
    with torch.no_grad():
        for key, inputs in job["forward"].items():
            torch.manual_seed(11)
            r["logits"][key] = model(**inputs).logits
    for key, inputs in job["generate"].items():
        torch.manual_seed(11)
        r["generated"][key] = model.generate(**inputs)
    if job["topics"]:
        r["topics"] = model.get_topics(top_n=3)
    clf = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2, trust_remote_code=True)
    r["classifier"] = type(clf).__name__
    r["frozen"] = not any(p.requires_grad for p in clf.model.parameters())
    r["saved"] = {"AutoConfig": type(AutoConfig.from_pretrained(job["saved"], trust_remote_code=True)).__name__}
    for auto in (AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification):
        r["saved"][auto.__name__] = type(auto.from_pretrained(job["saved"], trust_remote_code=True)).__name__
    results[name] = r
torch.save(results, "results.pt")
print()  # the prompt above ends without a newline
print(json.dumps({"families": sorted(results)}))
"""


class RemoteCodeRun:
    """Every family's folder loaded in ONE process without the package (``conftest.run_without_package``: one
    interpreter start for all). The folders and this process's expected outputs are made at once; the other
    process runs in a background thread (it only waits on the subprocess) while the module's other tests go on,
    and :meth:`result` waits for it."""

    def __init__(self, testers: dict, root: Path):
        import threading

        from conftest import run_without_package

        self.families, self.root, self.expected, self.error = sorted(testers), root, {}, None
        jobs = {}
        for name, tester in testers.items():
            jobs[name], self.expected[name] = tester.remote_code_job(root, name)
        torch.save(jobs, root / "jobs.pt")

        def run():
            try:
                self.out = run_without_package(REMOTE_SCRIPT, root)
            except BaseException as error:  # raised again by result()
                self.error = error

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self) -> tuple[dict, dict]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.out["families"] == self.families
        return torch.load(self.root / "results.pt", weights_only=False), self.expected
