"""Training and evaluation speed of the LSTM baseline, and the fraction of measured matmul FLOP/s.

Default: the papers' small size (E=300, H=600, one layer, 30-token chunks, batch 64) on APNEWS
train.txt with the MALLET stop list and min_freq=10. Prints a markdown table.

    python scripts/benchmark_speed.py                       # papers' small size
    python scripts/benchmark_speed.py --hidden_size 900 --num_layers 2 --embedding_size 300   # large

FLOPs per token are counted analytically (multiply-add = 2 FLOPs): an LSTM layer does
2*4H*(in+H), the softmax layer 2*H*V; a training step costs 3x the forward pass (forward, and a
backward that is twice as expensive). The peak is the best of torch.mm on square float32
matrices measured on this machine in the same run.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, TopicContextCollator, build_vocabularies, load_documents
from topic_lm_hf.benchmarking import add_common_arguments
from topic_lm_hf.data import shared_data_dir


def matmul_flops(seconds: float = 3.0) -> float:
    """Best float32 torch.mm FLOP/s over a few square sizes."""
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            a @ b
            count += 1
        best = max(best, 2 * n ** 3 * count / (time.perf_counter() - start))
    return best


def forward_flops_per_token(config: LSTMLMConfig) -> float:
    flops, inp = 0.0, config.embedding_size
    for _ in range(config.num_hidden_layers):
        flops += 2 * 4 * config.hidden_size * (inp + config.hidden_size)
        inp = config.hidden_size
    return flops + 2 * config.hidden_size * config.vocab_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_file", default=None)
    parser.add_argument("--embedding_size", type=int, default=300)
    parser.add_argument("--hidden_size", type=int, default=600)
    parser.add_argument("--num_layers", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_sentence_length", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30, help="timed training steps (after 3 warm-up steps)")
    add_common_arguments(parser, "--threads", threads=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    data = shared_data_dir()
    train_file = args.train_file or (str(data / "apnews" / "train.txt") if data else None)
    if train_file is None:
        raise SystemExit("No corpus: pass --train_file (../shared/data/apnews/train.txt is absent)")
    stop = str(data / "stopwords" / "mallet_en.txt") if data else "default"
    docs = load_documents(train_file)
    tok, _ = build_vocabularies(docs, min_freq=10, stopwords=stop)
    collator = TopicContextCollator.for_model(LSTMLMForCausalLM, tok, max_sentence_length=args.max_sentence_length)
    rows = collator.prepare(docs).shuffle(seed=0)
    config = LSTMLMConfig(vocab_size=len(tok), embedding_size=args.embedding_size, hidden_size=args.hidden_size,
                          num_hidden_layers=args.num_layers, dropout=0.4)
    model = LSTMLMForCausalLM(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [collator([rows[i] for i in range(s, s + args.batch_size)])
               for s in range(0, (args.steps + 3) * args.batch_size, args.batch_size)]

    def predicted(batch):
        return int((batch["labels"][:, 1:] != -100).sum())

    model.train()
    tokens, elapsed = 0, 0.0
    for step, batch in enumerate(batches):
        start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 3:
            elapsed += time.perf_counter() - start
            tokens += predicted(batch)
    train_tps = tokens / elapsed

    model.eval()
    tokens, elapsed = 0, 0.0
    with torch.no_grad():
        for step, batch in enumerate(batches):
            start = time.perf_counter()
            model(**batch)
            if step >= 3:
                elapsed += time.perf_counter() - start
                tokens += predicted(batch)
    eval_tps = tokens / elapsed

    peak = matmul_flops()
    per_token = forward_flops_per_token(config)
    print(f"\nLSTM LM speed on {train_file} (V={len(tok)}, E={args.embedding_size}, H={args.hidden_size}, "
          f"layers={args.num_layers}, {args.max_sentence_length}-token chunks, batch {args.batch_size}), "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.processor() or platform.machine()}\n")
    print("| phase | tokens/s | GFLOP/s (model) | fraction of measured matmul peak |")
    print("|---|---|---|---|")
    for phase, tps, factor in (("train (fwd+bwd+Adam)", train_tps, 3), ("evaluate (forward)", eval_tps, 1)):
        achieved = tps * per_token * factor
        print(f"| {phase} | {tps:,.0f} | {achieved / 1e9:.1f} | {achieved / peak:.1%} |")
    print(f"\nmeasured float32 matmul peak: {peak / 1e9:.1f} GFLOP/s; model FLOPs/token (forward): {per_token / 1e6:.2f} M")


if __name__ == "__main__":
    main()
