"""One comparison over seeds, as a figure and as a table: each seed's ``causal-carry`` perplexity of the carried LSTM,
a carried topic model, the same topic model with another document's topics (the ablation) and its matched topic-free
twin, read from ``benchmark_all.py``'s ``results.json`` of each seed's folder.

    python scripts/plot_seeds.py results/wiki-cpu-carried/seed-0 results/wiki-cpu-carried/seed-1 \\
        results/wiki-cpu-carried/seed-2 --topic-row rgbn-carry-warm-recipe --out results/wiki-cpu-carried/seeds.png

``--table`` prints the table instead (or as well, with ``--out``): per seed and on the mean, the topic model against
the strongest baseline of that seed (the carried LSTM or the matched twin, whichever is lower), the points its
document's own topics are worth (the ablation minus its perplexity), and whether they are worth more than its lead. A
seed is compared only once it has every baseline the table has (the twin, where any seed has one): a seed whose
twin is still training shows no lead and stays out of the mean.
The figure needs matplotlib (``pip install 'topic-lm-hf[bench]'``); the table does not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def series(folders: list[Path], topic_row: str, matched_row: str) -> dict[str, list[float]]:
    """Per seed: the four perplexities under ``causal-carry`` (None where a row is missing); the twin is
    ``matched_row``."""
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
        out["matched, topics uninformative"].append(carried(matched_row))
    return out


def table(data: dict[str, list[float]], label: str) -> str:
    """The markdown table of ``series``' values: a row per seed and the mean over the seeds that have the topic model
    and every baseline (sd where there are two or more), the lead over the strongest baseline, the own topics' worth
    and whether it exceeds the lead."""
    lstm, topic, mismatched, matched = data.values()
    rows = ["| seed | carried LSTM | matched, topics uninformative | " + label + " | lead over the strongest baseline | "
            "with another document's topics | the document's own topics (points) | own topics > lead |",
            "|---|---|---|---|---|---|---|---|"]
    leads, worths = [], []

    def fmt(value, pattern="{:.2f}"):
        return "-" if value is None else pattern.format(value)

    # the baselines the table has: the carried LSTM, and the twin where any seed has one
    expected = [values for values in (lstm, matched) if any(v is not None for v in values)]
    complete = [t is not None and all(values[i] is not None for values in expected) for i, t in enumerate(topic)]
    for seed, (a, b, t, m) in enumerate(zip(lstm, matched, topic, mismatched)):
        baselines = [v for v in (a, b) if v is not None]
        lead = 100 * (min(baselines) - t) / min(baselines) if complete[seed] else None
        worth = m - t if m is not None and t is not None else None
        leads.append(lead)
        worths.append(worth)
        # only a lead can be outweighed: behind its baseline, a model's topics pay for nothing
        pays = "-" if lead is None or worth is None else "yes" if lead > 0 and worth > min(baselines) - t else "no"
        rows.append(f"| {seed} | {fmt(a)} | {fmt(b)} | {fmt(t)} | {fmt(lead, '{:+.1f} %')} | {fmt(m)} | {fmt(worth)} | "
                    f"{pays} |")

    def mean(values):
        values = [v for v in values if v is not None]
        if not values:
            return None, None
        mu = sum(values) / len(values)
        sd = (sum((v - mu) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else None
        return mu, sd

    # the mean over the seeds that have the topic model and every baseline: another seed compares nothing yet
    present = [i for i, done in enumerate(complete) if done]
    name = "mean" if len(present) == len(topic) else f"mean (seeds {', '.join(map(str, present)) or 'none'})"
    (lead, sd) = mean(leads)
    spread = f"{fmt(lead, '{:+.1f} %')}" + ("" if sd is None else f" (sd {sd:.1f})")
    columns = [fmt(mean([values[i] for i in present])[0]) for values in (lstm, matched, topic, mismatched, worths)]
    rows.append(f"| {name} | {' | '.join(columns[:3])} | {spread} | {' | '.join(columns[3:])} | |")
    return "\n".join(rows)


def title(folders: list[Path], rows: list[str]) -> str:
    """The figure's default title: the corpus that ``benchmark_all.py`` named in the folders' ``results.json`` and
    whether every row shown (the carried LSTM, the topic model, its twin) stopped by its development perplexity."""
    runs = [json.loads((folder / "results.json").read_text()) for folder in folders]
    corpus = runs[0]["context"]["corpus_name"]
    stopped = [run["results"][name].get("early_stopped") for run in runs for name in ["lstm-carry", *rows]
               if name in run["results"]]
    how = "each row stopped by its dev perplexity" if all(stopped) else "not every row stopped by its dev perplexity"
    return f"{corpus[0].upper()}{corpus[1:]}, causal-carry, {how}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="one benchmark_all.py folder per seed")
    parser.add_argument("--topic-row", required=True, help="the topic model's row, e.g. rgbn-carry-warm-recipe")
    parser.add_argument("--matched-row", default=None,
                        help="the matched topic-free twin's row (default: <topic-row>-matched), e.g. a twin trained "
                             "the same way whose row another topic row shares")
    parser.add_argument("--label", default=None,
                        help="the topic model's name in the table and the legend (default: its row's label)")
    parser.add_argument("--title", default=None,
                        help="the figure's title (default: the corpus, and whether every row stopped by its dev "
                             "perplexity)")
    parser.add_argument("--out", type=Path, default=None, help="the PNG written")
    parser.add_argument("--table", action="store_true", help="print the table (markdown)")
    args = parser.parse_args(argv)
    if args.out is None and not args.table:
        parser.error("give --out (the figure), --table, or both")
    matched = args.matched_row or f"{args.topic_row}-matched"
    data = series(args.folders, args.topic_row, matched)
    rows = json.loads((args.folders[0] / "results.json").read_text())["results"]
    label = args.label or rows[args.topic_row]["label"]
    if args.table:
        print(table(data, label))
    if args.out is None:
        return
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("matplotlib is not installed: pip install 'topic-lm-hf[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax.set_title(args.title or title(args.folders, [args.topic_row, matched]), fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
