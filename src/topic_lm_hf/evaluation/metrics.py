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
the package's modules takes is left to that module, except where it names one of this module's own by another
name (:data:`COUSINS`): ``top_n`` is ``topic_diversity``'s ``k`` (and ``k`` is ``npmi``'s ``top_n``) unless that
is given too, and ``max_n`` given to ``distinct_n`` (``n`` to the BLEU modules) without its own ``n`` is an error
naming it; any other name is an error. No predictions, a row that is not a text, or a class id that is not an
integer is one clear ``ValueError``.

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


# An argument of another module that a caller may mean for this one: module -> {that argument: this module's own
# name for it, and whether it means the same thing}. One that means the same is honoured where this module's own is
# not given; one that does not is refused then, naming the right one. Where this module's own is given too, it is
# the other module's (``evaluate.combine`` passes every argument to every module) and is left to it.
COUSINS = {
    "topic_diversity": {"top_n": ("k", True)},  # the top words per topic
    "npmi": {"k": ("top_n", True)},
    "distinct_n": {"max_n": ("n", False)},  # BLEU's largest order is not a Dist-n order
    "texygen_bleu": {"n": ("max_n", False)},
    "texygen_self_bleu": {"n": ("max_n", False)},
}


def check_arguments(name: str, kwargs: dict, own: dict | None = None) -> dict:
    """Check the extra keyword arguments module ``name``'s compute got and return the values of its own arguments
    that they stand for. ``own``: the module's own arguments as the caller gave them (None: not given). An argument
    of another module that means the same as one of ``name``'s (:data:`COUSINS`: ``top_n`` of ``topic_diversity``
    is its ``k``) is honoured where ``name``'s own is not given; one that means something else is then a
    ``TypeError`` naming the right one; the other modules' arguments are theirs (``evaluate.combine`` passes every
    argument to every module) and are ignored; any other name is a ``TypeError``, as a misspelt argument of a
    function would be."""
    own = own or {}
    known = {argument for arguments in COMPUTE_ARGUMENTS.values() for argument in arguments}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"{name} got unexpected argument(s) {unknown}; it takes {list(COMPUTE_ARGUMENTS[name])}")
    honoured = {}
    for argument, (mine, same) in COUSINS.get(name, {}).items():
        if argument not in kwargs or own.get(mine) is not None:
            continue
        value = kwargs[argument]
        if same and isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if not same or isinstance(value, (list, tuple)):
            raise TypeError(f"{name} takes {mine}=, not {argument}= (another metric's argument, which means something "
                            f"else here): give {mine}= (with evaluate.combine, give both)")
        honoured[mine] = value
    return honoured


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


def check_inputs(name: str, predictions, references=None) -> None:
    """One clear line for inputs that ``evaluate`` would otherwise fail on with an IndexError or KeyError (no
    predictions, a row of the wrong kind) or silently truncate (a float class id)."""
    import numpy as np

    if predictions is None or len(predictions) == 0:
        raise ValueError(f"{name}: predictions is empty: give at least one row")
    if name in ("distinct_n", "texygen_bleu", "texygen_self_bleu"):
        for i, row in enumerate(predictions):
            if not isinstance(row, str) and not (isinstance(row, (list, tuple))
                                                 and all(isinstance(token, str) for token in row)):
                raise ValueError(f"{name}: predictions[{i}] is {type(row).__name__} {row!r}: give texts, each a "
                                 "string or a list of string tokens")
    if name == "classification":
        if references is None:
            raise ValueError("classification needs references=: the true class id of every row")
        for what, values in (("predictions", predictions), ("references", references)):
            array = np.asarray(values)
            if array.ndim != 1:
                raise ValueError(f"classification: {what} has shape {array.shape}: give one class id per row (for "
                                 "scores or probabilities, their argmax: logits.argmax(-1))")
            if array.dtype.kind not in "iub" and not (array.dtype.kind == "f" and np.all(np.mod(array, 1) == 0)):
                bad = next(v for v in array.tolist() if not (isinstance(v, (int, float)) and float(v).is_integer()))
                raise ValueError(f"classification: {what} must be class ids (integers), got {bad!r}: take the "
                                 "argmax of scores or probabilities first (logits.argmax(-1))")


class CheckedInputs:
    """The modules' metrics check their inputs (:func:`check_inputs`) before ``evaluate`` infers their features;
    ``metric_name`` is the module's name."""

    metric_name = ""

    def compute(self, *, predictions=None, references=None, **kwargs):
        """``evaluate.Metric.compute``, its inputs checked first."""
        check_inputs(self.metric_name, predictions, references)
        return super().compute(predictions=predictions, references=references, **kwargs)


TEXYGEN_CITATION = """@inproceedings{zhu2018texygen,
  title={Texygen: A Benchmarking Platform for Text Generation Models},
  author={Zhu, Yaoming and Lu, Sidi and Zheng, Lei and Guo, Jiaxian and Zhang, Weinan and Wang, Jun and Yu, Yong},
  booktitle={SIGIR}, year={2018}}"""
