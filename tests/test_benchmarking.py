"""The benchmarks' cache of the LDA judge (scripts/benchmarking.py, ``cached_lda_judge``): it reads back a judge that
scores texts as the fitted one did, fits again when its settings change, and never unpickles a file: a results
folder is shared, and a crafted ``lda_judge.pkl`` there must not run code."""

import json
import pickle
from pathlib import Path

import benchmarking
import numpy as np
import pytest
from conftest import TINY_CORPUS

from topic_lm_hf import documents_from_lists
from topic_lm_hf.evaluation.steering import bag_of_words_matrix

DOCUMENTS = documents_from_lists(TINY_CORPUS * 3)
TEXTS = [[["court", "ruled", "tax"]], [["fans", "cheered", "game"]], [["police", "team", "case"]], [["zzz"]]]


def _judge(path, topic_tok, **settings):
    return benchmarking.cached_lda_judge(path, DOCUMENTS, topic_tok, num_topics=2, seed=0, max_iter=3, restarts=1,
                                         **settings)


def test_the_cache_reads_back_a_judge_that_scores_texts_identically(tiny_vocabularies, tmp_path, monkeypatch, capsys):
    _, topic_tok = tiny_vocabularies
    fitted = _judge(tmp_path / "lda_judge", topic_tok)
    assert (tmp_path / "lda_judge.safetensors").exists() and (tmp_path / "lda_judge.json").exists()
    assert "LDA judge: sklearn LDA, 2 topics" in capsys.readouterr().out

    fit = benchmarking.fit_lda_judge
    monkeypatch.setattr(benchmarking, "fit_lda_judge", lambda *a, **k: pytest.fail("the cached judge was refitted"))
    cached = _judge(tmp_path / "lda_judge", topic_tok)
    assert capsys.readouterr().out == ""
    bows = bag_of_words_matrix(TEXTS, topic_tok)
    assert np.array_equal(cached.lda.transform(bows), fitted.lda.transform(bows))
    assert cached.dominant_topics(bows).tolist() == fitted.dominant_topics(bows).tolist()
    assert cached.description == fitted.description and np.array_equal(cached.topic_word, fitted.topic_word)

    # other settings: fitted again, and said why
    monkeypatch.setattr(benchmarking, "fit_lda_judge", fit)
    _judge(tmp_path / "lda_judge", topic_tok, max_documents=4)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"LDA judge: {tmp_path / 'lda_judge.json'} does not name these settings and this topic " \
                     "vocabulary; fitting it again"
    assert benchmarking.read_json(tmp_path / "lda_judge.json")["lda_settings"]["max_documents"] == 4


class _TouchOnLoad:
    """Pickled, it names ``Path.touch`` on ``path``: unpickling it creates the file."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def test_a_pickled_judge_is_never_loaded(tiny_vocabularies, tmp_path, capsys):
    _, topic_tok = tiny_vocabularies
    marker = tmp_path / "unpickled"
    crafted = tmp_path / "lda_judge.pkl"
    crafted.write_bytes(pickle.dumps(_TouchOnLoad(marker)))
    judge = _judge(tmp_path / "lda_judge", topic_tok)
    assert not marker.exists()
    assert judge.dominant_topics(bag_of_words_matrix(TEXTS, topic_tok)).tolist()[-1] == -1  # a fitted judge
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"LDA judge: {crafted} is ignored: a pickle is never loaded (unpickling can run any code); " \
                     "fitting it again"
    _judge(tmp_path / "lda_judge", topic_tok)  # read back from its own cache, the pickle still beside it
    assert capsys.readouterr().out == "" and not marker.exists() and crafted.exists()
    pickle.loads(crafted.read_bytes())  # the file was live: unpickling it does run its code
    assert marker.exists()


def test_the_operation_counter_counts_every_dispatched_operation():
    import torch

    x, y = torch.ones(3), torch.ones(3)
    with benchmarking.OperationCounter() as ops:
        (x + y) * y
    assert ops.count == 2 and ops.by_name == {"add": 1, "mul": 1}


# Operations dispatched by one training forward and backward of a tiny model on the tiny corpus's chunks, with the
# torch the package pins (the Makefile's TORCH_SPEC): the figure scripts/benchmark_speed.py reports per family. A
# change to a family's operations per step shows here; when it is meant (fewer operations), update the figure.
# (operations, host synchronisations) of one training step of a tiny model of each variant
PINNED_OPERATIONS = {"lstm_lm": (73, 5), "tcnlm": (639, 6), "rgbn": (1385, 9), "gbn": (963, 7)}


@pytest.mark.parametrize("family", list(PINNED_OPERATIONS))
def test_a_tiny_models_operations_and_flops_per_step_are_pinned(family, tiny_vocabularies):
    import torch
    from conftest import tiny_model

    from topic_lm_hf import TopicContextCollator

    if not torch.__version__.startswith("2.13."):
        pytest.skip(f"the figures are pinned with torch 2.13, this is {torch.__version__}")
    tok, topic_tok = tiny_vocabularies
    model = tiny_model(family, tok, topic_tok)
    collator = TopicContextCollator.for_model(model, tok, topic_tok)
    rows = collator.prepare(documents_from_lists(TINY_CORPUS))
    batch = collator([rows[i] for i in range(len(rows))])
    cost = benchmarking.step_cost(model, batch)
    assert (cost["operations"], cost["host_synchronisations"]) == PINNED_OPERATIONS[family]
    assert cost["gflop"] > 0 and benchmarking.step_cost(model, batch) == cost  # the same step counts the same


def test_a_folder_written_before_a_setting_existed_takes_it_as_its_runs_had_it(tmp_path):
    """A results folder whose settings.json predates the schedule setting was trained with the linear schedule: a
    rerun with --schedule linear continues it, one with the plateau schedule is refused (the results would mix)."""
    (tmp_path / "settings.json").write_text(json.dumps({"lr": 0.002}))
    before = {"schedule": "linear", "lr_decay": 0.5}
    benchmarking.check_settings(tmp_path, {"lr": 0.002, "schedule": "linear", "lr_decay": 0.5}, before=before)
    (tmp_path / "settings.json").write_text(json.dumps({"lr": 0.002}))
    with pytest.raises(SystemExit, match="schedule"):
        benchmarking.check_settings(tmp_path, {"lr": 0.002, "schedule": "plateau", "lr_decay": 0.5}, before=before)


def test_a_row_with_its_own_number_of_topics_builds_that_many(tiny_vocabularies):
    """A row's ``num_topics`` replaces the run's K in its model alone (the run's other rows keep theirs)."""
    import argparse

    tok, topic_tok = tiny_vocabularies
    args = argparse.Namespace(embedding_size=8, hidden_size=8, num_topics=3, topic_sizes=[3], dropout=0.0, seed=0)
    wide = benchmarking.build_model("rgbn-carry-warm-recipe-k200-p10", args, tok, topic_tok)
    plain = benchmarking.build_model("rgbn-carry-warm-recipe-p10", args, tok, topic_tok)
    assert wide.config.topic_sizes == [200] and plain.config.topic_sizes == [3] and args.topic_sizes == [3]
