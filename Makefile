# Every target a person or CI needs. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= dev,trainer
CLUSTER_DIR ?= .cluster

.DEFAULT_GOAL := help

help: ## list targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP) ## create .venv with the distribution (editable) and the `mtrl` console script

tools: ## build kube-apiserver, controller-manager, scheduler, kubectl, etcd, helm and luacheck (cached)
	bash hack/build-tools.sh
	bash hack/build-luacheck.sh

crds: install ## regenerate crds/ from the API models
	$(BIN)/mtrl crds

lint: install ## ruff over the whole tree
	$(BIN)/ruff check .

test: install tools ## the full test suite against a real kube-apiserver and moto server
	$(BIN)/pytest -q

cluster-up: install tools ## start the local control plane in $(CLUSTER_DIR)/ and leave it running
	$(BIN)/python -m mtrl_testbed --dir $(CLUSTER_DIR) up

cluster-down: install ## stop the local control plane
	$(BIN)/python -m mtrl_testbed --dir $(CLUSTER_DIR) down

moto: install ## run a moto server on 127.0.0.1:5000 in the foreground
	$(BIN)/python -m mtrl_testbed moto --port 5000

demo: install tools ## the one-command local demo: operator, workers and trainer on CPU
	$(BIN)/python -m mtrl_testbed.demo

e2e-kind: install ## the demo on a kind cluster (needs docker, kind, kubectl, helm; CI cannot run it)
	bash hack/e2e-kind.sh

bench: install tools ## benchmarks; results go to BENCHMARKS.md
	$(BIN)/python bench/run_all.py

SOAK_MINUTES ?= 30
soak: install tools ## bounded soak (SOAK_MINUTES, default 30): flat memory, no leaks; result in BENCHMARKS.md
	$(BIN)/python bench/soak.py --minutes $(SOAK_MINUTES)

clean: ## remove the venv and local state (not the cached binaries)
	rm -rf $(VENV) $(CLUSTER_DIR) out .pytest_cache .ruff_cache

.PHONY: help install tools crds lint test cluster-up cluster-down moto demo e2e-kind bench soak clean
