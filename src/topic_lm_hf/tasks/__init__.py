"""Downstream tasks evaluated on topic-guided language models, in one place: document classification
(``classification``), document retrieval (``retrieval``) and word sense disambiguation (``wsd``)."""

from .classification import (FeatureCollator, add_document_features, bow_logistic_regression,
                             classification_accuracy, classification_scores, clean_newsgroups_post, document_collator,
                             evaluate_classifier, extract_document_features, load_classification_splits,
                             load_imdb_splits, majority_accuracy, majority_baseline, predict_labels, train_classifier)
from .retrieval import (evaluate_retrieval, fraction_cutoff, lda_retrieval, normalize_blocks, retrieval_precision,
                        tfidf_retrieval)
from .wsd import (SenseInventory, WSDScore, find_wsd_files, first_sense_baseline, iter_wsd_instances,
                  load_sense_inventory, load_wsd_corpus, most_frequent_sense_baseline, read_key_file, score_wsd,
                  wordnet_pos, wsd_gold, write_key_file)
from .wsd_tagger import disambiguate, evaluate_sense_tagger, train_sense_tagger

__all__ = ["FeatureCollator", "add_document_features", "bow_logistic_regression", "classification_accuracy",
           "classification_scores", "clean_newsgroups_post", "document_collator", "evaluate_classifier",
           "extract_document_features", "load_classification_splits", "load_imdb_splits", "majority_accuracy",
           "majority_baseline", "predict_labels", "train_classifier",
           "evaluate_retrieval", "fraction_cutoff", "lda_retrieval", "normalize_blocks", "retrieval_precision",
           "tfidf_retrieval",
           "SenseInventory", "WSDScore", "find_wsd_files", "first_sense_baseline", "iter_wsd_instances",
           "load_sense_inventory", "load_wsd_corpus", "most_frequent_sense_baseline", "read_key_file", "score_wsd",
           "wordnet_pos", "wsd_gold", "write_key_file",
           "disambiguate", "evaluate_sense_tagger", "train_sense_tagger"]
