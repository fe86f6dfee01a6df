"""Run by tests/test_rgbn_rnn.py under `torchrun --nproc_per_node 2` (CPU, gloo): rGBN-RNN's TLASGR under DDP."""

import json
import sys

import torch
from transformers import TrainingArguments

from topic_lm_hf import (RGBNRNNConfig, RGBNRNNForCausalLM, TopicContextCollator, TopicLMTrainer, build_vocabularies,
                         synthetic_documents)

from conftest import finish_distributed

out_dir = sys.argv[1]
docs = synthetic_documents(32)
tok, topic_tok = build_vocabularies(docs, min_freq=1)
collator = TopicContextCollator(tok, topic_tok, context="preceding", layout="documents", max_sentence_length=12)
torch.manual_seed(0)
model = RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[6, 4], hidden_sizes=[16, 8],
                                                         embedding_size=8))
args = TrainingArguments(output_dir=out_dir, max_steps=3, per_device_train_batch_size=4, logging_steps=1,
                         report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", ddp_backend="gloo")
trainer = TopicLMTrainer(model=model, args=args, train_dataset=collator.prepare(docs), data_collator=collator)
trainer.train()
rank = trainer.args.process_index
buffers = {name: value.tolist() for name, value in model.named_buffers()}
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump({"world_size": trainer.args.world_size, "buffers": buffers}, f)
finish_distributed(trainer)
