"""A figure of one comparison over seeds: each seed's ``causal-carry`` perplexity of the carried LSTM, a carried topic
model, the same topic model with another document's topics (the ablation) and its matched topic-free twin, read from
``benchmark_all.py``'s ``results.json`` of each seed's folder.

    python scripts/plot_seeds.py results/wiki-cpu-carried/seed-0 results/wiki-cpu-carried/seed-1 \\
        results/wiki-cpu-carried/seed-2 --topic-row rgbn-carry-warm-recipe --out results/wiki-cpu-carried/seeds.png

Needs matplotlib (``pip install 'topic-lm-hf[bench]'``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def series(folders: list[Path], topic_row: str) -> dict[str, list[float]]:
    """Per seed: the four perplexities under ``causal-carry`` (None where a row is missing)."""
    out = {"carried LSTM": [], "carried topic model": [], "with another document's topics": [],
           "matched, topics uninformative": []}
    for folder in folders:
        rows = json.loads((folder / "results.json").read_text())["results"]

        def carried(name):
            return rows[name]["perplexity"]["causal-carry"]["perplexity"] if name in rows else None

        out["carried LSTM"].append(carried("lstm-carry"))
        out["carried topic model"].append(carried(topic_row))
        out["with another document's topics"].append((rows.get(topic_row, {}).get("mismatched") or {}).get(
            "perplexity"))
        out["matched, topics uninformative"].append(carried(f"{topic_row}-matched"))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="one benchmark_all.py folder per seed")
    parser.add_argument("--topic-row", required=True, help="the topic model's row, e.g. rgbn-carry-warm-recipe")
    parser.add_argument("--title", default="Wikipedia sample, causal-carry, each row stopped by its dev perplexity")
    parser.add_argument("--out", type=Path, required=True, help="the PNG written")
    args = parser.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("matplotlib is not installed: pip install 'topic-lm-hf[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(args.folders, args.topic_row)
    label = json.loads((args.folders[0] / "results.json").read_text())["results"][args.topic_row]["label"]
    data = {label if k == "carried topic model" else k: v for k, v in data.items()}
    seeds = [f"seed {i}" for i in range(len(args.folders))]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    width = 0.8 / len(data)
    for k, (label, values) in enumerate(data.items()):
        xs = [i + (k - (len(data) - 1) / 2) * width for i in range(len(seeds))]
        bars = ax.bar([x for x, v in zip(xs, values) if v is not None], [v for v in values if v is not None], width,
                      label=label)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    low = min(v for values in data.values() for v in values if v is not None)
    ax.set_ylim(low * 0.9, None)
    ax.set_xticks(range(len(seeds)), seeds)
    ax.set_ylabel("validation perplexity (lower is better)")
    ax.set_title(args.title, fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
