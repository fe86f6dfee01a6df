# Two commands set up everything on a fresh machine (Python >= 3.10 and the local torch wheel):
#   make demo   - create .venv, install, train + evaluate + save/reload + generate on the default corpus
#   make test   - create .venv, install, run the whole test suite (.ci/run calls this)
#   make test-fresh-clone - a representative part of the suite with no corpus folder at all (.ci/run calls it too)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-fresh-clone benchmark clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	# torch first, pinned: an unpinned torch would pull several GB of CUDA wheels
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[test]"

demo: install
	$(BIN)/topic-lm demo

# -n auto: one test process per core (at most 4: each holds torch, a few models and the commands it starts), a test
# file's tests in the same process (their module fixtures built once)
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 --dist loadfile

test: install
	$(PYTEST) tests

# As a fresh clone runs: TOPIC_LM_DATA names an empty folder (so no corpus beside the checkout is used either), and
# the package's own stop list and wikipedia-sample carry the demo, the command line and the data tests: the tests
# that look for a corpus folder (the model contract reads none, and runs in `make test` as it would here).
FRESH_CLONE_TESTS := tests/test_data.py tests/test_text.py tests/test_packaging.py tests/test_cli.py
test-fresh-clone: install
	rm -rf out/no-corpora && mkdir -p out/no-corpora
	TOPIC_LM_DATA=$(CURDIR)/out/no-corpora $(PYTEST) $(FRESH_CLONE_TESTS)

benchmark: install
	$(BIN)/python scripts/benchmark_speed.py

clean:
	rm -rf $(VENV) out build src/*.egg-info
