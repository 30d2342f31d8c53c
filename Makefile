# The two quick-start commands: `make demo` and `make test`. Both do all set-up.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
PYTEST := $(BIN)/python -m pytest

.PHONY: demo test setup venv tools controlplane lint test-unit test-chart test-controlplane \
        test-distributed test-sglang test-realsglang test-releases test-e2e crd

venv:
	@bash .ci/setup-venv

tools:
	@bash .ci/fetch-tools >/dev/null

# The local Kubernetes control plane (built once from Kubernetes' Go modules, cached in
# ~/.cache/lockstep; a cold build takes about 9 minutes on 2 cores).
controlplane:
	@bash .ci/build-controlplane >/dev/null

# The incident drill on the local cluster: a real control plane, the process kubelet, CPU
# stand-in SGLang ranks in real gloo groups, the real operator installed with the Helm
# chart (helm from `tools`) and the real sglang-router in front; traffic goes through the
# router as a client's would (streams, a two-minute wait). A desync is injected into a
# decode group spanning two pods and lockstep detects, drains, restarts the whole group
# and re-admits it while the other groups keep serving; the summary says what the users
# saw: the requests the incident caught and how each ended.
demo:
	@$(MAKE) --no-print-directory setup
	$(BIN)/lockstep dev drill --scenario desync --router

# Lint, format, types, the import contracts (who may import what: pyproject.toml's
# [tool.importlinter]) and the house's shape (module and class sizes, the step and
# action tables, the round naming no step).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy operator/lockstep images/sglang/lockstep_sglang operator/dev/lockstep_dev operator/dev/lockstep_standin
	$(BIN)/lint-imports --no-cache --no-logo
	$(PYTEST) -q -p no:cacheprovider tests/unit/test_house_size.py tests/unit/test_recovery_layout.py \
	  tests/unit/test_execute_layout.py

# Every tier, in one pytest run; each tier also runs alone (make test-<tier>). The 25
# slowest tests are listed at the end (CI time is budgeted: keep it under 60 minutes).
test:
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory lint
	$(PYTEST) --durations=25 tests

# The set-up both quick-start commands need, its three parts at once: the venv's pip
# mostly waits on downloads while the control plane's cold build keeps both cores busy.
setup:
	@$(MAKE) --no-print-directory -j3 venv tools controlplane

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
test-realsglang: venv
	$(PYTEST) -m realsglang tests
# The real server of every supported SGLang release (0.5.21, 0.5.22, 0.5.23), each from
# its own venv with the torch it pins (.ci/setup-release-venv makes 0.5.21's and 0.5.22's
# on first use, with uv from its cache: under a minute each).
test-releases: venv
	$(PYTEST) -m releases tests
test-e2e: venv tools controlplane
	$(PYTEST) -m e2e tests

# Regenerate the CRDs from the pydantic models (the PDDeployment and the per-role scale
# target PDRoleScale) and copy them into the chart.
crd: venv
	$(BIN)/lockstep crd > crds/pddeployments.lockstep.dev.yaml
	$(BIN)/lockstep crd --kind PDRoleScale > crds/pdrolescales.lockstep.dev.yaml
	bash .ci/sync-chart-crd
