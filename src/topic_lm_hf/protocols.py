"""The context protocols, one record each: what a batch of the protocol holds and what a perplexity under it means.

A protocol fixes the *context* of sentence j (the sentences whose topic words form its bag of words: the
collator's ``context`` mode) and whether the recurrent state is *carried* from chunk to chunk across a document
(the batches are then whole documents). The evaluation protocols are those ``evaluate_perplexity`` and
``topic-lm evaluate --protocols`` report a perplexity under:

=================  ======================================  ===========================  ============
protocol           context bag of words of sentence j      LSTM state                   leaks?
=================  ======================================  ===========================  ============
``paper``          the document minus sentence j           reset at every chunk         yes: later
                                                                                         sentences
``causal``         sentences before j                      reset at every chunk         no
``causal-carry``   sentences before j                      carried across the chunks    no
                                                           and sentences of a document
=================  ======================================  ===========================  ============

``paper`` is what every paper's code computes (Lau et al. 2017 onwards); it conditions on sentences that come
after the one being predicted, so it is not a language-model perplexity in the strict sense. ``causal`` and
``causal-carry`` follow Zheng, Vafa & Blei (TMLR 2023). The other protocols name the batches of training with
the state carried (``train-carry``), of TopicRNN's sliding window and of the downstream tasks (``document``).

``TopicContextCollator.for_model(model, ..., protocol=name)`` builds a protocol's batches (and two that follow
from the model itself: ``"train"``, ``"pretraining"``); the evaluator, the command line, the demo and the
benchmark scripts read the names, their order and their descriptions from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Protocol:
    """One context protocol.

    Args:
        name: its name (``evaluate_perplexity(protocol=name)``, ``--protocols``, ``TopicContextCollator.for_model``).
        context: the context mode of sentence j (``TopicContextCollator``'s ``context``: ``"others"``,
            ``"preceding"``, ``"document"`` or ``"none"``); a model without a bag-of-words input reads none.
        carry_state: whether a batch holds whole documents, read chunk after chunk with the recurrent state carried
            from each chunk to the next (else each chunk starts from a fresh state).
        evaluation: whether ``evaluate_perplexity`` reports a perplexity under it.
        description: one line for tables: the context of sentence j and the state.
        leaky: whether the context holds words that are predicted (later sentences): the only protocols under
            which a model that reads the words it predicts (``leaky_modes()``) is evaluated, labelled leaky.
    """

    name: str
    context: str
    carry_state: bool
    evaluation: bool
    description: str
    leaky: bool = False


# every protocol, the evaluation protocols first, in the order their rows are reported
ALL_PROTOCOLS = MappingProxyType({p.name: p for p in (
    Protocol("paper", "others", carry_state=False, evaluation=True, leaky=True,
             description="document minus sentence j (sees later sentences), state reset at every chunk"),
    Protocol("causal", "preceding", carry_state=False, evaluation=True,
             description="sentences before j, state reset at every chunk"),
    Protocol("causal-carry", "preceding", carry_state=True, evaluation=True,
             description="sentences before j, state carried across the document"),
    Protocol("train-carry", "preceding", carry_state=True, evaluation=False,
             description="sentences before j, state carried across the document (TopicLMTrainer(carry_state=True))"),
    Protocol("sliding-window", "none", carry_state=True, evaluation=False,
             description="no bag of words (TopicRNN's window of the words before), state carried across the document"),
    Protocol("document", "document", carry_state=False, evaluation=False,
             description="the whole document's bag of words, one sequence per document (downstream tasks)"),
)})
# the protocols evaluate_perplexity reports a perplexity under: paper, causal, causal-carry
PROTOCOLS = MappingProxyType({name: p for name, p in ALL_PROTOCOLS.items() if p.evaluation})


def evaluation_protocol(context: str, carry_state: bool) -> Protocol:
    """The evaluation protocol whose batches have this context mode and carry: the one a model trained on such
    batches is evaluated under first (``"others"`` -> ``paper``, ``"preceding"`` -> ``causal``, carried ->
    ``causal-carry``)."""
    for protocol in PROTOCOLS.values():
        if protocol.context == context and protocol.carry_state == carry_state:
            return protocol
    raise ValueError(f"No evaluation protocol has context={context!r} and carry_state={carry_state}: the protocols "
                     f"are {', '.join(f'{p.name} ({p.context}, carried: {p.carry_state})' for p in PROTOCOLS.values())}")


def describe_protocols(protocols=None) -> str:
    """``name = description`` of each protocol (default: the evaluation protocols), separated by semicolons."""
    return "; ".join(f"{p.name} = {p.description}" for p in (protocols or PROTOCOLS.values()))
