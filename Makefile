# One entry point for developers, `make repro` users and CI. Every target finds its Python
# through tools/python.sh (bootstraps .venv from requirements/ on first use).
SHELL := /bin/bash
# tools/python.sh prints the interpreter, or its reason on stderr and nothing on stdout: then
# every target that needs Python stops here (make's exit 2) instead of running "-m harness".
PY = $(or $(shell bash tools/python.sh),$(error no Python for the harness: see the line above from tools/python.sh))
# 3 workers on 2 cores: many tests wait on a stage timeout or a peer rank, and another worker's
# ranks fill that time; a 4th only adds contention (fresh clones: 2 -> 401 s, 3 -> 382 s,
# 4 -> 508 s of `make test`; docs/benchmarks.md, issue 23)
PYTEST_WORKERS ?= 3
RESULTS ?= results

help:             ## this list
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/'

.PHONY: help repro test test-slow test-all test-gpu witness verdict gate report map matrix bench lint docker-build docker-repro clean fix-wheel lock

repro:            ## the main job: reproduce the bug, check the fix, on the best tier here
	$(PY) -m harness --results-root="$(RESULTS)" repro

test:             ## the test suite (cpu tier here; GPU tiers skip with a reason without a GPU)
	$(PY) -m pytest -m "not slow" -n $(PYTEST_WORKERS) --dist loadgroup --junitxml=$(RESULTS)/junit.xml

test-slow:        ## only the slow tests: the full versions of what `make test` checks small (nightly)
	$(PY) -m pytest -m slow -n $(PYTEST_WORKERS) --dist loadgroup --junitxml=$(RESULTS)/junit.xml

test-all:         ## everything, slow tests included
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --junitxml=$(RESULTS)/junit.xml

test-gpu:         ## GPU tiers only (nightly on 8-GPU nodes); SHARD=K/N: the K-th of N shards, run back to back
	$(PY) -m pytest -m "gpu or gpu_shared" -n $(PYTEST_WORKERS) --dist loadgroup --junitxml=$(RESULTS)/junit.xml $(if $(SHARD),--shard $(SHARD))

witness:          ## the unpatched bug witness grid (allow-to-fail in CI)
	$(PY) -m harness --results-root="$(RESULTS)" run --scenario gpu-witness --label witness --jobs $(PYTEST_WORKERS)

# verdict and gate: make exits 2 for any non-zero code of theirs (GNU make's status for a failed
# recipe, whatever the code; its "Error N" line names the code); the scripts exit with the code.
verdict:          ## un-quarantine verdict on $(RESULTS)/*/results.json, or runs the cells when none (code: bash tools/verdict.sh)
	PY="$(PY)" RESULTS="$(RESULTS)" bash tools/verdict.sh

gate:             ## un-quarantine gate per job on $(RESULTS)/*/results.json; GATE_PATCHED=1: the jobs apply harness.fix (code: bash tools/unquarantine-gate.sh)
	PY="$(PY)" RESULTS="$(RESULTS)" bash tools/unquarantine-gate.sh

fix-wheel:        ## the fix for jobs: dist/moe_ckpt_fix-<version>-py3-none-any.whl (pip install it + MOE_CKPT_FIX=1; docs/fix.md)
	$(PY) tools/fix-wheel/build.py dist

report:           ## markdown summary + grid picture of the newest run
	$(PY) -m harness --results-root="$(RESULTS)" report

map:              ## collision map of every topology up to 8 ranks
	$(PY) -m harness map --max-world 8

bench:            ## per-stage durations of one cpu cell and the CI suite; signal -> exit seconds
	$(PY) bench/stages.py
	$(PY) bench/interrupts.py

lock:             ## requirements/*.lock from their inputs (cpu.in, megatron-core.txt, installer.txt); UPGRADE=1: newest versions (code: bash tools/lock.sh)
	UPGRADE="$(UPGRADE)" bash tools/lock.sh

lint:             ## CI file against GitLab's schema, Dockerfile lint
	bash tools/validate-gitlab-ci.sh
	bash tools/lint-dockerfile.sh

.PHONY: ci-local
ci-local:         ## lint + cpu-tests jobs run from .gitlab-ci.yml by gitlab-ci-local (shell executor; docs/ci.md)
	bash tools/gitlab-ci-local.sh --force-shell-executor --unset-variable PIP_CACHE_DIR --unset-variable UV_CACHE_DIR \
	  --variable CI_PIPELINE_SOURCE=merge_request_event --needs cpu-tests

docker-build:
	docker build -f docker/Dockerfile -t moe-ckpt-harness:local .

docker-repro: docker-build
	docker run --rm --gpus all --ipc=host -v $(PWD)/$(RESULTS):/workspace/harness/$(RESULTS) moe-ckpt-harness:local make repro

clean:
	rm -rf $(RESULTS) .pytest_cache dist

matrix:           ## decisive cells per (modelopt, megatron-core) pair: MODELOPT="0.47.0 0.48.0rc1" MCORE="0.15.x 0.16.x 0.19.2"
	$(PY) -m harness --results-root="$(RESULTS)" matrix $(foreach v,$(MODELOPT),--modelopt $(v)) $(foreach v,$(MCORE),--mcore $(v))
