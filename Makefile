# FastInfer: `make serve` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 3000
WEIGHTS ?= auto
# The model family `make serve` serves, `make bento` packs and `make bench`/`tune` measure:
# FASTINFER_MODEL's, else resnet50 (ImageNet's, the one `make models` builds from WEIGHTS). Your own is built
# by `fastinfer build --weights PATH --labels PATH --name NAME`; then `make serve MODEL=NAME`, `make bench
# MODEL=NAME`, ... (README, "Serve your own model").
MODEL ?= $(or $(FASTINFER_MODEL),resnet50)
# The model store lives in the project unless you point BENTOML_HOME elsewhere.
export BENTOML_HOME ?= $(CURDIR)/bentoml_home

.PHONY: serve test test-quick system-deps models lint clean-models bento container bench tune docs lock

# Every package at the version and hashes of the lock (the bento installs the same file), then the project
# itself; pip check fails when pyproject.toml pins a version the lock does not hold (run `make lock`).
LOCK := requirements.lock.txt
$(VENV)/.installed: pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	@$(PY) -m pip check || { echo "$(LOCK) does not match pyproject.toml: run make lock"; exit 1; }
	@touch $@

# Regenerates the lock from pyproject.toml (its runtime and dev requirements) for every platform (macOS,
# Linux x86-64 and aarch64, ...), with hashes. Versions already locked are kept where pyproject allows:
# `make lock LOCK_ARGS=--upgrade` (or `--upgrade-package NAME`) moves them to the newest. It needs only the
# venv's uv: a venv whose install stopped at pip check (pyproject.toml ahead of the lock) has it.
lock:
	@test -x $(VENV)/bin/uv || $(MAKE) --no-print-directory $(VENV)/.installed || test -x $(VENV)/bin/uv
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 --generate-hashes \
	  --quiet --output-file $(LOCK) $(LOCK_ARGS)

# Idempotent: a rerun with the same weights only checks the store (seconds). Another family than the
# default is not built here (its weights and labels are yours): it only has to be in the store.
models: $(VENV)/.installed
ifeq ($(MODEL),resnet50)
	$(PY) -m build_models --weights $(WEIGHTS)
else
	@$(PY) -m fastinfer.catalog.holdings $(MODEL)
endif

# Serves (and packs, benchmarks, tunes) MODEL's family: FASTINFER_MODEL for the server and everything it
# runs first; `make bench MODEL=shop` measures shop's models and records the family in its results.
serve bento bench tune: export FASTINFER_MODEL := $(MODEL)

serve: models
	$(VENV)/bin/bentoml serve service:FastInfer --port $(PORT)

# redis-server and chromium: what pip cannot install (apt-get as root, else one line naming them).
system-deps:
	@scripts/system-deps

# Two processes by default, each file's tests on one (its module's servers start once). On 2 cores three took
# 612 s against 603 s for two: the CPU is the limit.
# `make test TEST_WORKERS=0` runs in one process.
TEST_WORKERS ?= 2
test: system-deps models
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The loop while you work: the unit tests that need no built store, no server and no model build (docs/architecture.md).
test-quick: $(VENV)/.installed
	$(PY) -m pytest -m "unit and not heavy" -q -n $(TEST_WORKERS) --dist loadfile

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/deptry .
	$(VENV)/bin/lint-imports --no-cache

# The docs site (mkdocs.yml, docs/) into site/, its configuration tables regenerated from the settings'
# definitions first; --strict: a broken link or anchor fails it.
docs: $(VENV)/.installed
	$(PY) docs/hooks/settings_table.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean-models:
	rm -rf $(BENTOML_HOME)/models

# Regenerates BENCHMARKS.md and docs/bench/*.png from scratch on this machine (~25 min).
bench: models
	$(PY) -m load_tests --study

# Serves each promising configuration for real (~7 min on 2 cores) and keeps the best as the server's
# default ($(BENTOML_HOME)/tuned/tuned.json); TUNE_ARGS="--goal latency", "--budget 900", ...
tune: models
	$(PY) -m load_tests.tuning $(TUNE_ARGS)

# The bento: service, code, dashboard and MODEL's models (by tag), its packages from the lock — offline. It
# carries its family: the bento argument `model` (BentoML sets it again wherever the bento is served) and
# FASTINFER_MODEL in its image's environment (fastinfer/catalog/config.py, service.py). Built with every runner in
# its graph, so that where the engines run is decided where it is served (docs/architecture.md#where-engines-run).
bento: models
	FASTINFER_IN_FRONT=none $(VENV)/bin/bentoml build --arg model=$(MODEL) .

# The container image fastinfer:latest; needs a container engine (Docker/Podman/BuildKit).
container: bento
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
	  $(VENV)/bin/bentoml containerize fastinfer:latest -t fastinfer:latest; \
	else \
	  echo "No container engine answers here (docker info failed): the bento is built ($$($(VENV)/bin/bentoml list fastinfer -o json | $(PY) -c 'import json,sys; print(json.load(sys.stdin)[0][\"tag\"])'))."; \
	  echo "Its Dockerfile is in $$BENTOML_HOME/bentos/fastinfer/<version>/env/docker/; run 'make container' where Docker runs,"; \
	  echo "or 'bentoml export fastinfer:latest fastinfer.bento' and 'bentoml import' + 'bentoml containerize' there."; \
	  exit 1; \
	fi
