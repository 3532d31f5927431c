# Two commands on a fresh machine: `make run` and `make test`. Both build the
# virtual environment on first use, so nothing has to be installed by hand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m channel_server

# Two test processes, each file in one of them (its module fixtures start once): most
# tests wait on Spark, child processes or fsyncs, so two overlap on two cores.
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) -m bench

lint: $(STAMP)
	$(VENV)/bin/ruff check ingest_sdk catalog flush pipelines channel_server tests bench tools
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
