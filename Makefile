# The two quick-start commands: `make demo` and `make test`. Both do all set-up.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
PYTEST := $(BIN)/python -m pytest

.PHONY: demo test venv tools controlplane lint test-unit test-chart test-controlplane \
        test-distributed test-sglang test-e2e crd

venv:
	@bash .ci/setup-venv

tools:
	@bash .ci/fetch-tools >/dev/null

# The local Kubernetes control plane (built once from Kubernetes' Go modules, cached in
# ~/.cache/lockstep; a cold build takes about 9 minutes on 2 cores).
controlplane:
	@bash .ci/build-controlplane >/dev/null

# For now: the flag policy and the manifests of the small example. The local-cluster
# incident drill replaces this when it lands.
demo: venv
	$(BIN)/lockstep check -f examples/pd-small.yaml
	$(BIN)/lockstep check -f examples/unsafe/overlap-schedule.yaml --mode Reject || true
	$(BIN)/lockstep render -f examples/pd-small.yaml

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy operator/lockstep images/sglang/lockstep_sglang

# Every tier, in one pytest run; each tier also runs alone (make test-<tier>).
test: venv tools controlplane lint
	$(PYTEST) tests

test-unit: venv
	$(PYTEST) -m unit tests
test-chart: venv tools
	$(PYTEST) -m chart tests
test-controlplane: venv tools controlplane
	$(PYTEST) -m controlplane tests
test-distributed: venv
	$(PYTEST) -m distributed tests
test-sglang: venv
	$(PYTEST) -m sglang tests
test-e2e: venv tools controlplane
	$(PYTEST) -m e2e tests

# Regenerate the CRD from the pydantic models.
crd: venv
	$(BIN)/lockstep crd > crds/pddeployments.lockstep.dev.yaml
	bash .ci/sync-chart-crd
