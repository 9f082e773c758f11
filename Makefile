# Every target a person or CI needs. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= dev,trainer,trl
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

tools: ## build kube-apiserver, controller-manager, scheduler, kubectl, etcd, helm, Kubeflow's training operator, Kueue, luacheck and dashboardcheck (cached)
	bash hack/build-tools.sh
	bash hack/build-controllers.sh
	bash hack/build-luacheck.sh
	bash hack/build-dashboardcheck.sh

crds: install ## regenerate crds/ from the API models, and the environment catalog from the worker
	$(BIN)/mtrl crds
	$(BIN)/mtrl env catalog

lint: install ## ruff over the whole tree, mypy (with the pydantic plugin) over the API, the operator and the CLI
	$(BIN)/ruff check .
	$(BIN)/mypy

# Two workers, each with its own control plane, moto and operator (tests/conftest.py), fill
# the gaps one process leaves on 2 cores: about 1.25x sooner (BENCHMARKS.md, CI time).
TEST_WORKERS ?= 2
test: install tools ## the full test suite against a real kube-apiserver and moto server
	$(BIN)/pytest -q -n $(TEST_WORKERS)

cluster-up: install tools ## start the local control plane in $(CLUSTER_DIR)/ and leave it running
	$(BIN)/python -m mtrl_testbed --dir $(CLUSTER_DIR) up

dev-up: install tools ## the demo's setup, left running: control plane, moto, bucket, operator; prints the exports
	$(BIN)/python -m mtrl_testbed --dir $(CLUSTER_DIR) up --operator

cluster-down: install ## stop the local control plane (and what dev-up started)
	$(BIN)/python -m mtrl_testbed --dir $(CLUSTER_DIR) down

moto: install ## run a moto server on 127.0.0.1:5000 in the foreground
	$(BIN)/python -m mtrl_testbed moto --port 5000

demo: install tools ## the one-command local demo: operator, workers and trainer on CPU
	$(BIN)/python -m mtrl_testbed.demo

e2e-kind: install ## the demo on a kind cluster (needs docker, kind, kubectl, helm and an image registry; CI runs tests/kubelet instead, docs/kubelet.md)
	bash hack/e2e-kind.sh

bench: install tools ## benchmarks; results go to BENCHMARKS.md
	$(BIN)/python bench/run_all.py

bench-learning: install ## SmolLM2-135M-Instruct learning `guess` on CPU, 3 seeds of 37-69 min on 2 cores (BENCHMARKS.md); the table on stdout, curves in bench/learning.png, numbers in bench/results/learning.json
	$(BIN)/python bench/learning_bench.py

# TRL's side of the GPU check: the GPU machine has no TRL and no internet, so its wheels are
# carried there (pure Python, ~2 MB; multiprocess is per Python version: the machine runs 3.12).
TRL_WHEELS := "trl==1.16.0" "datasets==4.8.5" "dill>=0.3.0,<0.4.2" "multiprocess<0.70.20"
WHEELS_PYTHON ?= 3.12
bench-wheels: install ## download the TRL wheels the GPU machine needs into bench/wheels/ (carry it there)
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version $(WHEELS_PYTHON) \
		-d bench/wheels $(TRL_WHEELS)
	@du -ch bench/wheels/*.whl | tail -1

# The CPU dry run also needs what the GPU machine already has for datasets (pyarrow, pandas ...),
# for this machine's Python; never carried. --no-deps: datasets 4.8.5 pins huggingface-hub<2,
# which the venv's transformers has outgrown, so nothing goes into the venv.
bench-wheels-cpu: install ## the same wheels plus pyarrow, pandas, xxhash, httpx for a CPU dry run, into bench/wheels-cpu/
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: -d bench/wheels-cpu $(TRL_WHEELS) \
		"pyarrow>=21" pandas xxhash httpx httpcore
	@du -ch bench/wheels-cpu/*.whl | tail -1

GPU_CHECK_WHEELS ?= bench/wheels-cpu
gpu-check: install ## the GPU readiness check (the tiny CPU dry run without a GPU); results in out/gpu-check/
	PYTHON=$(BIN)/python MTRL_WHEELS=$(GPU_CHECK_WHEELS) bash bench/gpu_check.sh

SOAK_MINUTES ?= 30
soak: install tools ## bounded soak (SOAK_MINUTES, default 30): flat memory, no leaks; result in BENCHMARKS.md
	$(BIN)/python bench/soak.py --minutes $(SOAK_MINUTES)

images: install ## build the operator, worker and trainer images on bases made here (installs and starts the project's Docker engine; cached per machine)
	PYTHON=$(BIN)/python bash hack/build-images.sh

docker-down: ## stop the project's Docker engine (hack/docker.sh), if it is running
	bash hack/docker.sh down

image-contents: install ## what each image's Python layer holds and its size, without Docker (downloads the wheels)
	$(BIN)/python hack/image-contents.py

clean: ## remove the venv and local state (not the cached binaries)
	rm -rf $(VENV) $(CLUSTER_DIR) out .pytest_cache .ruff_cache

.PHONY: help install tools crds lint test cluster-up dev-up cluster-down moto demo e2e-kind bench bench-learning soak clean \
	bench-wheels bench-wheels-cpu gpu-check images docker-down image-contents
