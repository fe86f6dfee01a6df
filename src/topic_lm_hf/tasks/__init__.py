"""Downstream tasks evaluated on topic-guided language models: word sense disambiguation (``wsd``)."""

from .wsd import (SenseInventory, WSDScore, find_wsd_files, first_sense_baseline, iter_wsd_instances,
                  load_sense_inventory, load_wsd_corpus, most_frequent_sense_baseline, read_key_file, score_wsd,
                  wordnet_pos, wsd_gold, write_key_file)

__all__ = ["SenseInventory", "WSDScore", "find_wsd_files", "first_sense_baseline", "iter_wsd_instances",
           "load_sense_inventory", "load_wsd_corpus", "most_frequent_sense_baseline", "read_key_file", "score_wsd",
           "wordnet_pos", "wsd_gold", "write_key_file"]
