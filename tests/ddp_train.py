"""Run by tests/test_distributed.py under `torchrun --nproc_per_node 2` (CPU, gloo)."""

import json
import sys

import torch
from transformers import TrainingArguments

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TopicContextCollator, TopicLMTrainer, build_vocabularies,
                         synthetic_documents)

from conftest import finish_distributed

out_dir = sys.argv[1]
docs = synthetic_documents(80)
tok, _ = build_vocabularies(docs, min_freq=1)
collator = TopicContextCollator(tok, None, context="none")
torch.manual_seed(0)
model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=16, hidden_size=16))
args = TrainingArguments(output_dir=out_dir, max_steps=6, per_device_train_batch_size=8, logging_steps=2,
                         report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", ddp_backend="gloo")
trainer = TopicLMTrainer(model=model, args=args, train_dataset=collator.prepare(docs), data_collator=collator)
trainer.train()
trainer.save_model(out_dir)
if trainer.is_world_process_zero():
    with open(f"{out_dir}/result.json", "w") as f:
        json.dump({"world_size": trainer.args.world_size, "log": trainer.state.log_history}, f)
finish_distributed(trainer)
