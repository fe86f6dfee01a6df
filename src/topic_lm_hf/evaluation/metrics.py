"""The package's metrics as ``evaluate`` modules that load offline from the installed package.

Each metric the package reports from predictions (and references) ships as an ``evaluate`` module script in
``topic_lm_hf/evaluation/modules/<name>/<name>.py``, which calls the package's own function, so the module and
the function give the same numbers:

=====================  ================================================  ==========================================
name                   inputs (one row each)                             the package's function
=====================  ================================================  ==========================================
``npmi``               ``predictions``: a topic's top words              :func:`topic_coherence` (``reference=``,
                                                                         ``preset=`` ...; the protocol is returned)
``topic_diversity``    ``predictions``: a topic's top words              :func:`topic_diversity`
``texygen_bleu``       ``predictions``: a generated sentence             :func:`texygen_bleu` (``reference_texts=``,
                                                                         every sentence scored against all of them)
``texygen_self_bleu``  ``predictions``: a generated sentence             :func:`texygen_self_bleu`
``distinct_n``         ``predictions``: a generated text                 :func:`distinct_n` (``n=``)
``wsd``                ``predictions``: an instance's answer keys        :func:`topic_lm_hf.tasks.score_wsd` (the
                       (empty: abstained); ``references``: its gold      unified framework's scorer; empty gold: an
                       keys                                              id the gold lacks, ignored)
``classification``     ``predictions``, ``references``: class ids        scikit-learn's ``accuracy_score`` and
                                                                         ``f1_score(average="macro")``
=====================  ================================================  ==========================================

Sentences and texts are strings (split on whitespace) or lists of tokens. Load one with :func:`load_metric` (or
``evaluate.load(str(metric_path(name)))``); ``evaluate.combine`` works across them: an argument that another of
the package's modules takes is left to that module, any other name is an error.

Perplexity is not among them: it is a property of a model under a context protocol, not of predictions, and
stays :func:`topic_lm_hf.evaluate_perplexity`.
"""

from __future__ import annotations

from pathlib import Path

MODULES = Path(__file__).resolve().parent / "modules"
METRICS = ("npmi", "topic_diversity", "texygen_bleu", "texygen_self_bleu", "distinct_n", "wsd", "classification")
# The keyword arguments of each module's compute (besides its inputs).
COMPUTE_ARGUMENTS = {
    "npmi": ("reference", "preset", "window", "top_n", "unseen_pair", "edge_windows"),
    "topic_diversity": ("k", "variant"),
    "texygen_bleu": ("reference_texts", "max_n", "fast"),
    "texygen_self_bleu": ("max_n", "fast"),
    "distinct_n": ("n",),
    "wsd": (),
    "classification": (),
}


def metric_path(name: str) -> Path:
    """The folder of the ``evaluate`` module ``name`` (one of :data:`METRICS`) inside the installed package."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}: the package's evaluate modules are {', '.join(METRICS)}")
    return MODULES / name


def load_metric(name: str, **kwargs):
    """``evaluate.load`` of the package's module ``name`` (one of :data:`METRICS`), from the installed package:
    no network is needed (``HF_HUB_OFFLINE=1`` works). ``kwargs`` go to ``evaluate.load``."""
    try:
        import evaluate
    except ImportError as error:
        raise ImportError("load_metric needs the evaluate library: pip install evaluate") from error
    return evaluate.load(str(metric_path(name)), **kwargs)


def check_arguments(name: str, kwargs: dict) -> None:
    """Check the extra keyword arguments module ``name``'s compute got: those another of the package's modules
    takes are theirs (``evaluate.combine`` passes every argument to every module) and are ignored; any other name
    is a ``TypeError``, as a misspelt argument of a function would be."""
    known = {argument for arguments in COMPUTE_ARGUMENTS.values() for argument in arguments}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"{name} got unexpected argument(s) {unknown}; it takes {list(COMPUTE_ARGUMENTS[name])}")


# What the modules share: their input features, the Texygen citation, and how a text input reaches the functions.


def topic_features():
    """One topic per row: its top words."""
    import datasets

    return datasets.Features({"predictions": datasets.Sequence(datasets.Value("string"))})


def text_features():
    """One text per row, a string (split on whitespace) or a list of tokens."""
    import datasets

    return [datasets.Features({"predictions": datasets.Value("string")}),
            datasets.Features({"predictions": datasets.Sequence(datasets.Value("string"))})]


def token_lists(rows) -> list[list[str]]:
    """The rows of a text input as token lists (strings split on whitespace, as the package's BLEU splits them)."""
    return [row.split() if isinstance(row, str) else list(row) for row in rows]


TEXYGEN_CITATION = """@inproceedings{zhu2018texygen,
  title={Texygen: A Benchmarking Platform for Text Generation Models},
  author={Zhu, Yaoming and Lu, Sidi and Zheng, Lei and Guo, Jiaxian and Zhang, Weinan and Wang, Jun and Yu, Yong},
  booktitle={SIGIR}, year={2018}}"""
