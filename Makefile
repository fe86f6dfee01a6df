# Two commands set up everything on a fresh machine (Python >= 3.10 and the local torch wheel):
#   make demo   - create .venv, install, train + evaluate + save/reload + generate on the default corpus
#   make test   - create .venv, install, run the whole test suite (.ci/run calls this)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test benchmark clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	# torch first, pinned: an unpinned torch would pull several GB of CUDA wheels
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[test]"

demo: install
	$(BIN)/topic-lm demo

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

benchmark: install
	$(BIN)/python scripts/benchmark_speed.py

clean:
	rm -rf $(VENV) out build src/*.egg-info
