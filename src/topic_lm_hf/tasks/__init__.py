"""Downstream tasks evaluated on topic-guided language models: word sense disambiguation (``wsd``)."""

from .wsd import (WSDScore, find_wsd_files, iter_wsd_instances, load_wsd_corpus, read_key_file, score_wsd,
                  wsd_gold, write_key_file)

__all__ = ["WSDScore", "find_wsd_files", "iter_wsd_instances", "load_wsd_corpus", "read_key_file", "score_wsd",
           "wsd_gold", "write_key_file"]
