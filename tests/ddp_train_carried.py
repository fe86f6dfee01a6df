"""Run by tests/test_distributed.py under `torchrun --nproc_per_node 2` (CPU, gloo): TCNLM trained with its state
carried across each document's chunks (TopicLMTrainer(carry_state=True)), with the default DDP settings."""

import json
import sys

import torch
from transformers import TrainingArguments

from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM, TopicContextCollator, TopicLMTrainer, build_vocabularies, \
    synthetic_documents

from conftest import finish_distributed

out_dir = sys.argv[1]
docs = synthetic_documents(24)
tok, topic_tok = build_vocabularies(docs, min_freq=1)
torch.manual_seed(0)
model = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=4, embedding_size=8, hidden_size=8))
collator = TopicContextCollator.for_model(model, tok, topic_tok, context="preceding", layout="documents",
                                         max_sentence_length=6)
args = TrainingArguments(output_dir=out_dir, max_steps=3, per_device_train_batch_size=2, logging_steps=1,
                         report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", ddp_backend="gloo")
trainer = TopicLMTrainer(model=model, args=args, train_dataset=collator.prepare(docs), data_collator=collator,
                         carry_state=True)
trainer.train()
rank = trainer.args.process_index
weights = {name: value.detach().double().sum().item() for name, value in model.named_parameters()}
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump({"world_size": trainer.args.world_size, "steps": trainer.state.global_step, "weights": weights}, f)
finish_distributed(trainer)
