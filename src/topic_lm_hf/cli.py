"""The ``topic-lm`` command: ``train``, ``evaluate``, ``generate``, ``topics`` and ``demo``.

Arguments are dataclasses parsed by ``HfArgumentParser``, as in transformers' ``run_clm.py``:
every ``TrainingArguments`` flag works with ``topic-lm train``. Examples::

    topic-lm train --train_file ../shared/data/apnews/train.txt --validation_file ../shared/data/apnews/valid.txt \\
        --model_type lstm_lm --config_overrides "embedding_size=300,hidden_size=600" \\
        --output_dir out/lstm-apnews --max_steps 2000 --per_device_train_batch_size 64
    topic-lm evaluate --model_name_or_path out/lstm-apnews --validation_file ../shared/data/apnews/valid.txt
    topic-lm generate --model_name_or_path out/lstm-apnews --prompt "the senate" --max_new_tokens 20
    topic-lm demo     # the README's main job: train, evaluate, save, reload, generate
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from transformers import AutoConfig, AutoModelForCausalLM, HfArgumentParser, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

from . import data as data_lib
from .collator import TopicContextCollator, make_bow
from .evaluation import evaluate_perplexity
from .trainer import TopicLMTrainer

logger = logging.getLogger("topic_lm_hf")


@dataclass
class DataArguments:
    train_file: Optional[str] = field(default=None, metadata={"help": "Training corpus (Lau .txt, .jsonl[.gz], .parquet)."})
    validation_file: Optional[str] = field(default=None, metadata={"help": "Validation corpus, same formats."})
    text_column: Optional[str] = field(default=None, metadata={"help": "Raw-text column of JSON / Parquet corpora."})
    min_freq: int = field(default=10, metadata={"help": "LM vocabulary: minimum word frequency."})
    stopwords: str = field(default="default", metadata={
        "help": "Stop list for the topic vocabulary: 'default' (scikit-learn's English list), 'none', or a file."})
    min_doc_freq: int = field(default=0, metadata={"help": "Topic vocabulary: minimum document frequency."})
    max_sentence_length: int = field(default=30, metadata={"help": "Predicted tokens per chunk."})
    max_context_tokens: int = field(default=300, metadata={"help": "Topic tokens kept in a context bag of words."})
    context: str = field(default="others", metadata={
        "help": "Training context: 'others' (papers), 'preceding' (causal) or 'document'."})
    max_train_documents: Optional[int] = field(default=None, metadata={"help": "Use only the first N training documents."})
    max_eval_documents: Optional[int] = field(default=None, metadata={"help": "Use only the first N validation documents."})
    protocols: str = field(default="paper,causal,causal-carry", metadata={"help": "Perplexity protocols to report."})
    synthetic: bool = field(default=False, metadata={"help": "Use the package's synthetic corpus."})


@dataclass
class ModelArguments:
    model_type: str = field(default="lstm_lm", metadata={"help": "A registered model_type (e.g. lstm_lm)."})
    model_name_or_path: Optional[str] = field(default=None, metadata={"help": "A saved model to continue from / use."})
    config_file: Optional[str] = field(default=None, metadata={"help": "A JSON config (see hub_configs/)."})
    config_overrides: Optional[str] = field(default=None, metadata={
        "help": "Comma-separated key=value pairs applied to the config, e.g. 'hidden_size=256,dropout=0.2'."})


@dataclass
class GenerateArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder or Hub id."})
    prompt: str = field(default="", metadata={"help": "Text to continue (raw text; tokenized like the corpora)."})
    max_new_tokens: int = 30
    do_sample: bool = False
    num_beams: int = 1
    num_return_sequences: int = 1
    temperature: float = 1.0
    top_k: int = 0
    seed: int = 0
    topic_ids: Optional[str] = field(default=None, metadata={"help": "Comma-separated topic ids (topic models)."})
    context_text: Optional[str] = field(default=None, metadata={"help": "A document whose topics steer generation."})


@dataclass
class TopicsArguments:
    model_name_or_path: str = field(metadata={"help": "A saved topic model."})
    top_n: int = 10


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def shared_data_dir() -> Optional[Path]:
    """``../shared/data`` next to the current directory or next to this checkout, if present."""
    candidates = [Path.cwd().parent / "shared" / "data", Path(__file__).resolve().parents[3] / "shared" / "data"]
    if os.environ.get("TOPIC_LM_DATA"):
        candidates.insert(0, Path(os.environ["TOPIC_LM_DATA"]))
    return next((c for c in candidates if (c / "apnews" / "train.txt").exists()), None)


def _parse_overrides(text: Optional[str]) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in (text or "").split(","))):
        if "=" not in item:
            raise ValueError(f"config override {item!r} is not key=value")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def _accepts(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def build_model(model_args: ModelArguments, tokenizer, topic_tokenizer):
    """A new model of ``model_type`` sized to the vocabularies, or a saved one."""
    if model_args.model_name_or_path:
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
        data_lib.check_vocabularies(tokenizer, topic_tokenizer, model.config)
        return model
    kwargs = {}
    if model_args.config_file:
        kwargs.update(json.loads(Path(model_args.config_file).read_text()))
    kwargs.update(_parse_overrides(model_args.config_overrides))
    model_type = kwargs.pop("model_type", model_args.model_type)
    config = AutoConfig.for_model(model_type, **kwargs)
    config.vocab_size = len(tokenizer)
    for name, token in (("pad_token_id", "<pad>"), ("bos_token_id", "<bos>"), ("eos_token_id", "<eos>")):
        setattr(config, name, tokenizer.convert_tokens_to_ids(token))
    if hasattr(config, "topic_vocab_size"):
        config.topic_vocab_size = len(topic_tokenizer)
    if hasattr(config, "topic_word_ids_from_tokenizers"):
        # TopicRNN's stop-word indicator: the LM id of every topic word (-1 for the topic <unk>).
        config.topic_word_ids = config.topic_word_ids_from_tokenizers(tokenizer, topic_tokenizer)
    return AutoModelForCausalLM.from_config(config)


def load_corpora(data_args: DataArguments):
    """(train documents, validation documents, a label naming their source)."""
    if data_args.synthetic or (data_args.train_file is None and shared_data_dir() is None):
        docs = data_lib.synthetic_documents(600, seed=0)
        split = docs.train_test_split(test_size=0.15, seed=0)
        return split["train"], split["test"], "SYNTHETIC corpus generated by topic_lm_hf (not real text)"
    train_file = data_args.train_file or str(shared_data_dir() / "apnews" / "train.txt")
    valid_file = data_args.validation_file
    if valid_file is None and data_args.train_file is None:
        valid_file = str(shared_data_dir() / "apnews" / "valid.txt")
    kw = {"text_column": data_args.text_column}
    train = data_lib.load_documents(train_file, max_documents=data_args.max_train_documents, **kw)
    if valid_file:
        valid = data_lib.load_documents(valid_file, max_documents=data_args.max_eval_documents, **kw)
    else:
        split = train.train_test_split(test_size=0.1, seed=0)
        train, valid = split["train"], split["test"]
    return train, valid, f"{train_file} ({len(train)} docs) / {valid_file or '10% of train'} ({len(valid)} docs)"


def resolve_stopwords(value: str):
    if value == "none":
        return None
    if value == "mallet":
        root = shared_data_dir()
        if root is None:
            raise FileNotFoundError("stopwords='mallet' needs ../shared/data/stopwords/mallet_en.txt")
        return str(root / "stopwords" / "mallet_en.txt")
    return value


def format_perplexity_table(rows: list[dict]) -> str:
    lines = ["| model | protocol | context | state | perplexity | tokens |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['protocol']} | {r['context']} | "
                     f"{'carried' if r['carry_state'] else 'reset per chunk'} | {r['perplexity']:.2f} | {r['tokens']} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# commands
# ----------------------------------------------------------------------------------------------


def train(data_args: DataArguments, model_args: ModelArguments, training_args: TrainingArguments,
          train_docs=None, valid_docs=None, callbacks=None):
    """Train (resuming from the last complete checkpoint in ``output_dir`` if there is one) and save."""
    set_seed(training_args.seed)
    if train_docs is None:
        train_docs, valid_docs, source = load_corpora(data_args)
        logger.info("Data: %s", source)
    out = training_args.output_dir
    if model_args.model_name_or_path:
        tok, topic_tok = data_lib.load_vocabularies(model_args.model_name_or_path)
    else:
        tok, topic_tok = data_lib.build_vocabularies(train_docs, min_freq=data_args.min_freq,
                                                     stopwords=resolve_stopwords(data_args.stopwords),
                                                     min_doc_freq=data_args.min_doc_freq)
    model = build_model(model_args, tok, topic_tok)
    uses_context = _accepts(model, "context_bow")
    collator = TopicContextCollator(tok, topic_tok, context=data_args.context if uses_context else "none",
                                    max_sentence_length=data_args.max_sentence_length,
                                    max_context_tokens=data_args.max_context_tokens)
    train_rows = collator.prepare(train_docs)
    eval_rows = collator.prepare(valid_docs) if valid_docs is not None and training_args.eval_strategy != "no" else None
    trainer = TopicLMTrainer(model=model, args=training_args, train_dataset=train_rows, eval_dataset=eval_rows,
                             data_collator=collator, processing_class=tok, callbacks=callbacks)
    from .trainer import last_complete_checkpoint

    last = last_complete_checkpoint(out)  # skips a checkpoint the previous run did not finish writing
    if last:
        logger.info("Resuming from %s", last)
    trainer.train(resume_from_checkpoint=last)
    trainer.save_model(out)
    data_lib.save_vocabularies(tok, topic_tok, out)
    return trainer.model, tok, topic_tok


def evaluate(model, docs, protocols, tokenizer=None, topic_tokenizer=None, name="model", **kw) -> list[dict]:
    rows = []
    for protocol in protocols:
        result = evaluate_perplexity(model, docs, protocol, tokenizer=tokenizer, topic_tokenizer=topic_tokenizer, **kw)
        rows.append({"model": name, **result})
    return rows


def generate_text(model, tokenizer, prompt: str = "", topic_tokenizer=None, topic_ids=None, context_text=None,
                  **generate_kwargs) -> list[str]:
    """Generate from a raw-text prompt (tokenized like the corpora), optionally steered by topics."""
    words = [w for s in data_lib.tokenize_text(prompt) for w in s]
    inputs = tokenizer([" ".join(words)], return_tensors="pt")
    kwargs = dict(generate_kwargs)
    if topic_ids is not None:
        kwargs["topic_ids"] = topic_ids
    if context_text is not None:
        if topic_tokenizer is None:
            raise ValueError("context_text needs the topic tokenizer")
        kwargs["context_bow"] = make_bow([context_text], topic_tokenizer)
    out = model.generate(**inputs, pad_token_id=tokenizer.pad_token_id, **kwargs)
    # Keep <unk> visible (an out-of-vocabulary prompt word must not silently vanish); drop the rest.
    hidden = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
    return [" ".join(tokenizer.convert_ids_to_tokens([i for i in row.tolist() if i not in hidden])) for row in out]


def demo(argv: list[str]) -> None:
    """The main job: train a small LSTM LM and a TCNLM of the same size, evaluate both under every
    protocol, save, reload with the Auto classes, generate (from prompts and from topics)."""
    parser = HfArgumentParser((DataArguments,))
    (data_args, rest) = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    out_dir = next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--output_dir"), "out/demo")
    max_steps = int(next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--max_steps"), 200))
    t0 = time.time()
    train_docs, valid_docs, source = load_corpora(data_args)
    print(f"[demo] data: {source}")
    if shared_data_dir() is not None and data_args.stopwords == "default" and not data_args.synthetic:
        data_args.stopwords = "mallet"  # the papers' stop list, when the shared data holds it
    if data_args.synthetic or "SYNTHETIC" in source:
        data_args.min_freq = 1
    if data_args.max_eval_documents is None and len(valid_docs) > 60:
        valid_docs = valid_docs.select(range(60))  # keep the demo to a few minutes (--max_eval_documents)
    results = []
    # The LSTM baseline and TCNLM of the same size, trained for the same number of steps.
    models = [("lstm_lm", "embedding_size=128,hidden_size=256,dropout=0.2"),
              ("tcnlm", "embedding_size=128,hidden_size=256,num_topics=20,dropout=0.2")]
    for model_type, overrides in models:
        path = os.path.join(out_dir, model_type)
        args = TrainingArguments(output_dir=path, max_steps=max_steps, per_device_train_batch_size=64,
                                 learning_rate=3e-3, max_grad_norm=0.5, logging_steps=50, save_steps=200,
                                 save_total_limit=1, eval_strategy="no", report_to=[], use_cpu=True,
                                 disable_tqdm=True, seed=0, lr_scheduler_type="linear", warmup_steps=20)
        model, tok, topic_tok = train(data_args, ModelArguments(model_type=model_type, config_overrides=overrides),
                                      args, train_docs, valid_docs)
        reloaded = AutoModelForCausalLM.from_pretrained(path).eval()
        model.eval()
        probe = tok(["the"], return_tensors="pt")
        same = torch.allclose(model(**probe).logits, reloaded(**probe).logits)
        print(f"[demo] {model_type}: saved to {path}; reloaded with AutoModelForCausalLM, identical logits: {same}")
        results += evaluate(reloaded, valid_docs, data_args.protocols.split(","), name=model_type)
        for prompt in ("the senate", "police said", ""):
            text = generate_text(reloaded, tok, prompt, max_new_tokens=20, do_sample=True, top_k=40)[0]
            print(f"[demo] {model_type} generates from {prompt!r}: {text}")
        if hasattr(reloaded, "get_topics"):
            for k, words in enumerate(reloaded.get_topics(top_n=8)[:5]):
                print(f"[demo] {model_type} topic {k}: {' '.join(words)}")
                text = generate_text(reloaded, tok, "", topic_ids=[k], max_new_tokens=15, do_sample=True, top_k=40)[0]
                print(f"[demo] {model_type} generates from topic {k}: {text}")
    print(f"\n[demo] validation perplexity on {source}, {len(valid_docs)} documents:\n")
    print(format_perplexity_table(results))
    print(f"\n[demo] finished in {time.time() - t0:.0f} s")


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("datasets", "transformers.trainer", "transformers.configuration_utils", "transformers.modeling_utils"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    commands = ("train", "evaluate", "generate", "topics", "demo")
    if not argv or argv[0] not in commands:
        print(f"usage: topic-lm {{{','.join(commands)}}} [--help]\n\n{__doc__}")
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    command, argv = argv[0], argv[1:]
    if command == "demo":
        return demo(argv)
    if command == "train":
        data_args, model_args, training_args = HfArgumentParser(
            (DataArguments, ModelArguments, TrainingArguments)).parse_args_into_dataclasses(args=argv)
        train(data_args, model_args, training_args)
        print(f"saved to {training_args.output_dir}")
    elif command == "evaluate":
        data_args, model_args = HfArgumentParser((DataArguments, ModelArguments)).parse_args_into_dataclasses(args=argv)
        if not model_args.model_name_or_path:
            raise SystemExit("evaluate needs --model_name_or_path")
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
        if data_args.validation_file is None and shared_data_dir() is None:
            raise SystemExit("evaluate needs --validation_file")
        valid_file = data_args.validation_file or str(shared_data_dir() / "apnews" / "valid.txt")
        docs = data_lib.load_documents(valid_file, text_column=data_args.text_column,
                                       max_documents=data_args.max_eval_documents)
        rows = evaluate(model, docs, data_args.protocols.split(","), name=model_args.model_name_or_path,
                        max_sentence_length=data_args.max_sentence_length,
                        max_context_tokens=data_args.max_context_tokens)
        print(f"validation: {valid_file} ({len(docs)} documents)\n")
        print(format_perplexity_table(rows))
    elif command == "generate":
        (args,) = HfArgumentParser((GenerateArguments,)).parse_args_into_dataclasses(args=argv)
        set_seed(args.seed)
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).eval()
        tok, topic_tok = data_lib.load_vocabularies(args.model_name_or_path)
        topic_ids = [int(x) for x in args.topic_ids.split(",")] if args.topic_ids else None
        texts = generate_text(model, tok, args.prompt, topic_tokenizer=topic_tok, topic_ids=topic_ids,
                              context_text=args.context_text, max_new_tokens=args.max_new_tokens,
                              do_sample=args.do_sample, num_beams=args.num_beams,
                              num_return_sequences=args.num_return_sequences, temperature=args.temperature,
                              top_k=args.top_k or None)
        print("\n".join(texts))
    elif command == "topics":
        (args,) = HfArgumentParser((TopicsArguments,)).parse_args_into_dataclasses(args=argv)
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
        if not hasattr(model, "get_topics"):
            raise SystemExit(f"{type(model).__name__} has no topics (it is not a topic model)")
        for k, words in enumerate(model.get_topics(top_n=args.top_n)):
            print(f"topic {k:3d}: {' '.join(words)}")


if __name__ == "__main__":
    main()
