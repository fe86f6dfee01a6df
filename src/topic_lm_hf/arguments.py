"""The flags of the ``topic-lm`` commands as dataclasses (parsed by ``HfArgumentParser``, as in transformers'
``run_clm.py``), and the parsers of the flags whose values are lists: ``--topic_ids`` / ``--topics`` / ``--k``
(:func:`parse_ids`), ``--pretraining_phases``, ``--protocols`` and ``--config_overrides``. A mistake in a flag is a
:class:`UsageError`. ``topic_lm_hf.cli`` reads these, and so do the task commands (``topic_lm_hf.tasks.commands``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .data import HELP as _HELP
from .families import FAMILIES
from .protocols import PROTOCOLS

_FAMILY_NAMES = ", ".join(list(FAMILIES)[:-1]) + f" or {list(FAMILIES)[-1]}"  # "lstm_lm, tcnlm, ... or rgbn_rnn"


class UsageError(ValueError):
    """A mistake in how a command was called: one line on stderr, exit code 2."""


@dataclass
class ModelArguments:
    model_type: str = field(default="lstm_lm", metadata={
        "help": f"The model to train: {_FAMILY_NAMES} (one of the package's families)."})
    model_name_or_path: Optional[str] = field(default=None, metadata={
        "help": "A saved model folder or Hub id to continue training (its vocabularies are reused)."})
    language_model: Optional[str] = field(default=None, metadata={
        "help": "A trained LSTM LM folder (topic-lm train --model_type lstm_lm on the same corpus and --min_freq) that "
                "a new TopicRNN (cell lstm) or one-layer rGBN-RNN of its sizes starts from: its embeddings, LSTM and "
                "output layer, the topic path nearly closed at the start (from_language_model)."})
    config_file: Optional[str] = field(default=None, metadata={
        "help": "A JSON configuration (e.g. one of hub_configs/), a model folder or a Hub id whose config.json "
                "is used; its model_type wins over --model_type."})
    config_overrides: Optional[str] = field(default=None, metadata={
        "help": "Comma-separated key=value pairs applied to the configuration with transformers' "
                "PretrainedConfig.update_from_string, e.g. 'hidden_size=256,dropout=0.2' (booleans: true / false)."})
    carry_state: bool = field(default=False, metadata={
        "help": "Train with the recurrent state carried across each document's sentences (the causal-carry protocol "
                "that the package's best models are trained for): whole documents per batch, each sentence's context "
                "the sentences before it. rGBN-RNN carries its LSTM state inside its documents batches; every other "
                "family trains through TopicLMTrainer(carry_state=True)."})
    early_stopping_patience: Optional[int] = field(default=None, metadata={
        "help": "Stop when the validation perplexity (eval_lm_loss, every --eval_steps; --metric_for_best_model "
                "chooses another metric) has not improved for this many evaluations, and keep the best checkpoint's "
                "weights (transformers' EarlyStoppingCallback with "
                "load_best_model_at_end; checkpoints are saved at every evaluation). Needs --eval_strategy steps."})
    bptt_chunks: Optional[int] = field(default=None, metadata={
        "help": "With --carry_state: the chunks between two detachments of the carried state (default: the whole "
                "document)."})
    pretraining_phases: Optional[str] = field(default=None, metadata={
        "help": "Training phases before the joint objective, as phase:steps pairs in order, e.g. "
                "'lm:2000,topic_model:500' for NCLM (TopicLMTrainer's pretraining_phases)."})
    recipe: Optional[str] = field(default=None, metadata={
        "choices": ["steering", "paper"],
        "help": "How a new topic model is trained. 'steering' (the default for --model_type): the recipe that makes "
                "topics matter and steer (STEERING_RECIPE: the shared topic output prior topic_output_bias=beta, "
                "and per family TopicRNN's bag-of-words term and topic proportions, NCLM's diversity term), after "
                "the topic model is pre-trained alone (see --pretrain_topic_model_steps); --config_overrides win "
                "over it. 'paper': the paper's model and joint training from scratch, exactly (the default with "
                "--config_file: a published configuration trains as published). Models without topics ignore it."})
    pretrain_topic_model_steps: Optional[int] = field(default=None, metadata={
        "help": "Train the topic model alone on bags of words first (pretrain_topic_model), at most this many "
                "steps, stopping when its objective on the validation documents has not improved for 3 "
                "evaluations (every 500 steps); the best topic model is kept. Default: 20000 with --recipe "
                "steering, 0 (none) with --recipe paper or a saved model."})


def parse_phases(text: Optional[str]) -> list[tuple[str, int]]:
    """'lm:2000,topic_model:500' -> [("lm", 2000), ("topic_model", 500)]."""
    phases = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, steps = item.strip().partition(":")
        if not steps.strip().isdigit():
            raise ValueError(f"--pretraining_phases wants phase:steps pairs (e.g. 'topic_model:300'), got {item!r}")
        phases.append((name.strip(), int(steps)))
    return phases


@dataclass
class EvaluateArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder or Hub id (with its tokenizers)."})
    validation_file: Optional[str] = field(default=None, metadata={
        "help": _HELP["validation_file"] + " Default: wikipedia-sample/validation (the validation split of the "
                "Wikipedia sample that ships with the package, topic-lm train's default corpus)."})
    text_column: Optional[str] = field(default=None, metadata={"help": _HELP["text_column"]})
    max_eval_documents: Optional[int] = field(default=None, metadata={"help": _HELP["max_eval_documents"]})
    protocols: str = field(default=",".join(PROTOCOLS), metadata={"help": _HELP["protocols"]})
    max_sentence_length: int = field(default=30, metadata={"help": _HELP["max_sentence_length"]})
    max_context_tokens: int = field(default=300, metadata={"help": _HELP["max_context_tokens"]})
    batch_size: int = field(default=64, metadata={"help": "Chunks (or documents, for causal-carry) per forward pass."})
    empty_context: bool = field(default=False, metadata={"help": _HELP["empty_context"]})
    output_json: Optional[str] = field(default=None, metadata={
        "help": "Also write the rows as JSON here (default: perplexity.json in the model folder, where "
                "`topic-lm export` finds them for the model card; 'none': nowhere)."})


@dataclass
class ExportArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder (topic-lm train's output, a Trainer "
                                                      "checkpoint or a save_pretrained folder)."})
    repo_id: str = field(metadata={"help": "The Hub repository it is for, e.g. org/tcnlm-apnews (the card's "
                                           "examples load it)."})
    output_dir: str = field(metadata={"help": "Where to write the upload-ready folder."})
    results: Optional[str] = field(default=None, metadata={
        "help": "Evaluation rows (JSON list) for the card; default: the model folder's perplexity.json (written by "
                "topic-lm evaluate) when there is one."})
    dataset: Optional[str] = field(default=None, metadata={
        "help": "The evaluation data's name in the card, for rows that have none (default: their validation file)."})
    push_to_hub: bool = field(default=False, metadata={
        "help": "Also upload the folder (without a network: one line says how to upload it later)."})
    private: bool = field(default=False, metadata={"help": "Create the repository private (with --push_to_hub)."})
    overwrite: bool = field(default=False, metadata={
        "help": "Write into a non-empty --output_dir that is not a previous export (its README.md, config.json "
                "and other files of the same names are replaced)."})


@dataclass
class GenerateArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder or Hub id (with its tokenizers)."})
    prompt: str = field(default="", metadata={
        "help": "Text to continue (raw text, tokenized and lower-cased like the corpora); empty: start a sentence."})
    max_new_tokens: int = field(default=30, metadata={"help": "Tokens to generate after the prompt."})
    do_sample: bool = field(default=False, metadata={
        "help": "Sample from the model's distribution (with --temperature and --top_k); without it, greedy or "
                "beam search."})
    num_beams: int = field(default=1, metadata={"help": "Beams of beam search (1: no beam search)."})
    num_return_sequences: int = field(default=1, metadata={
        "help": "Continuations to print (at most --num_beams without sampling)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (with --do_sample)."})
    top_k: int = field(default=0, metadata={
        "help": "Sample only among the k most probable tokens (with --do_sample; 0: all tokens)."})
    top_p: float = field(default=1.0, metadata={
        "help": "Nucleus sampling: sample among the most probable tokens whose probabilities sum to p (with "
                "--do_sample; 1: all tokens)."})
    seed: int = field(default=0, metadata={"help": "Random seed (sampling)."})
    topic_ids: Optional[str] = field(default=None, metadata={
        "help": "Comma-separated topic ids: generate from an equal mixture of these topics (topic models; see "
                "topic-lm topics)."})
    context_text: Optional[str] = field(default=None, metadata={
        "help": "A document whose topics steer generation (topic models)."})
    topic_guidance_scale: Optional[float] = field(default=None, metadata={
        "help": "Decode-time topic guidance with --topic_ids or --context_text: mix the conditioned scores with "
                "the model's prior, l_cond + (s - 1)(l_cond - l_prior) (1: none; larger: more on topic)."})
    allow_unk: bool = field(default=False, metadata={
        "help": "Let the model generate <unk> (suppressed by default, as in every model's generation config)."})
    topic_layer: Optional[int] = field(default=None, metadata={
        "help": "rGBN-RNN / GBN-RNN: the layer --topic_ids refer to (1 = bottom, the default)."})


@dataclass
class SteerArguments:
    model_name_or_path: str = field(metadata={"help": "A saved topic model folder (with its tokenizers)."})
    judge_corpus: Optional[str] = field(default=None, metadata={
        "help": "The training corpus (Lau .txt, .jsonl[.gz], .parquet): an LDA fitted on it is the independent "
                "judge of topic accuracy. Without it only the model's own encoder judges."})
    judge_documents: Optional[int] = field(default=None, metadata={
        "help": "Fit the LDA judge on the first N documents of --judge_corpus only (faster)."})
    text_column: Optional[str] = field(default=None, metadata={"help": "Raw-text column of a JSON / Parquet corpus."})
    fluency_model: Optional[str] = field(default=None, metadata={
        "help": "A separately trained LM over the same vocabulary (e.g. a same-size LSTM): the perplexity of the "
                "generated text under it measures fluency."})
    topics: Optional[str] = field(default=None, metadata={
        "help": "Comma-separated topic ids to steer towards (default: --num_topics_sampled of them, drawn with --seed)."})
    num_topics_sampled: Optional[int] = field(default=None, metadata={
        "help": "Topics drawn when --topics is not given (default: 10, or every topic of a model with fewer; more "
                "than the model has is an error)."})
    num_samples: int = field(default=20, metadata={"help": "Texts generated per topic, and without a topic."})
    max_new_tokens: int = field(default=30, metadata={"help": "The longest generated text."})
    top_p: float = field(default=0.9, metadata={"help": "Nucleus sampling threshold."})
    topic_guidance_scale: Optional[float] = field(default=None, metadata={
        "help": "Decode-time topic guidance of the steered texts (as generate's): 1 or unset is plain conditioning, "
                "above 1 pushes towards the topic, below 1 towards the model's prior (NCLM LETA's steering recipe "
                "keeps its texts fluent at 0.75)."})
    top_words: int = field(default=50, metadata={"help": "N of topic k's top-N words, for the topic-word share."})
    seed: int = field(default=0, metadata={"help": "Seeds the topic draw and the sampling."})
    json: Optional[str] = field(default=None, metadata={"help": "Also write the full result (with texts) to this file."})


@dataclass
class TopicsArguments:
    model_name_or_path: str = field(metadata={"help": "A saved topic model folder or Hub id."})
    top_n: int = field(default=10, metadata={"help": "Words printed per topic."})
    layer: Optional[int] = field(default=None, metadata={
        "help": "rGBN-RNN / GBN-RNN: the topic layer to print (1 = bottom; default: every layer)."})


def parse_ids(text: str, flag: str, what: str = "topic id") -> list[int]:
    """Comma-separated integers (``3,7``), at least one and none twice; anything else is a :class:`UsageError`
    naming the flag (an empty list would silently mean "no topics", a repeated one would count twice). ``what``:
    what the integers are, for the messages."""
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, e.g. {flag} 3,7 (got {text!r})") from None
    if not ids:
        raise UsageError(f"{flag} is empty: give at least one {what}, e.g. {flag} 3,7")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise UsageError(f"{flag} lists {what.removesuffix(' id')} {repeated[0]} more than once (got {text!r})")
    return ids


def parse_protocols(text: str) -> list[str]:
    """``--protocols``: names separated by commas (spaces around them allowed), each checked before any runs."""
    protocols = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if not protocols or unknown:
        raise ValueError(f"--protocols {text!r}: {'unknown ' + ', '.join(map(repr, unknown)) if unknown else 'none'}"
                         f"; give some of {', '.join(PROTOCOLS)} separated by commas")
    return protocols


def override_literal(text: str):
    """The value of ``key=text`` for an option whose default is None: None, a boolean, an int, a float (``1e-3``)
    or else the word itself."""
    if text in ("None", "null"):
        return None
    if text in ("true", "false"):
        return text == "true"
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def parse_overrides(text: str) -> list[tuple[str, str]]:
    """``key=value`` pairs of ``--config_overrides``, comma-separated; a value in brackets is a list
    (``hidden_sizes=[16,16]``) whose commas do not separate pairs."""
    pairs, rest = [], text.strip()
    while rest:
        match = re.match(r"\s*(\w+)\s*=\s*(\[[^\]]*\]|[^,]*?)\s*(,|$)", rest)
        if match is None:
            raise ValueError(f"--config_overrides takes key=value pairs separated by commas (lists in brackets: "
                             f"hidden_sizes=[16,16]), got {text!r}")
        pairs.append((match.group(1), match.group(2)))
        rest = rest[match.end():].strip()
    return pairs

