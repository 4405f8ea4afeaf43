# Two set-up commands (see README): `make study` installs everything and runs the default study;
# `make test` installs the package with its test dependencies, lints it (ruff) and runs the test suite.
# torch is installed first, pinned, so that pip takes the local CPU wheel rather than a CUDA build.
PYTHON ?= python3
PIP = $(PYTHON) -m pip install --quiet
STUDY ?= seed_questions

.PHONY: install install-dev study quick lint test bench

install:
	$(PIP) torch==2.13.0
	$(PIP) -e '.[corpora]'

install-dev:
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'

study: install
	$(PYTHON) -m probing.study $(STUDY)

quick: install
	$(PYTHON) -m probing.study $(STUDY) --quick

lint: install-dev
	$(PYTHON) -m ruff check .

test: lint
	$(PYTHON) -m pytest -q -n auto --dist loadgroup

bench: install-dev
	$(PYTHON) benchmarks/extract_throughput.py
	$(PYTHON) benchmarks/cka_speed.py
	$(PYTHON) benchmarks/probe_speed.py
