"""Fixtures for the controlplane tier: one real local control plane for this folder.

The control plane is package-scoped (this folder is a package for that reason): it stops
after the folder's last test, so it does not idle beside the later tiers. An idle one is
not free: the namespace controller keeps retrying the deletion of the tests' namespaces,
whose PDDeployments keep the operator's finalizer once their test's operator is gone
(measured: about a third of a core, for as long as the pytest run lasts).

The control plane (`lockstep_dev.localcluster.LocalControlPlane`: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) is built once and cached by
`.ci/build-controlplane`. A cold build takes minutes, more than one test's timeout, so it
runs after collection when any test of this folder was selected, before the first test.

Hook for later tiers: override `controlplane_extensions` (package scope) to run something
beside the control plane, e.g. a process kubelet that registers fake GPU nodes; each
extension is entered once the control plane is ready and exited before it stops.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lockstep_dev.localcluster import (
    ControlPlaneError,
    ControlPlaneExtension,
    LocalControlPlane,
    build_controlplane,
    find_kubectl,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PDD_CRD = REPO / "crds" / "pddeployments.lockstep.dev.yaml"
# Every CRD lockstep ships (the PDDeployment and the per-role PDRoleScale).
CRDS = sorted((REPO / "crds").glob("*.yaml"))

BUILD_TIMEOUT = 3600.0  # a cold build (module download + compile) on 2 cores: ~10 min
START_TIMEOUT = 90.0  # start-to-ready is a few seconds; a loaded CI machine gets margin

_binary: list[Path] = []
_build_error: list[ControlPlaneError] = []


def _selected_here(items: list[pytest.Item]) -> bool:
    return any(Path(str(item.path)).is_relative_to(HERE) for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not _selected_here(session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    started = time.monotonic()
    if reporter is not None:
        reporter.write_line("controlplane: building or reusing lockstep-controlplane ...")
    try:
        _binary.append(build_controlplane(timeout=BUILD_TIMEOUT))
    except ControlPlaneError as exc:
        # Reported by every test that needs it, rather than aborting the whole session.
        _build_error.append(exc)
    if reporter is not None:
        took = time.monotonic() - started
        reporter.write_line(f"controlplane: binary ready after {took:.0f}s")


@pytest.fixture(scope="session")
def controlplane_binary() -> Path:
    """The `lockstep-controlplane` binary (built after collection; see module doc)."""
    if _build_error:
        raise _build_error[0]
    if not _binary:
        _binary.append(build_controlplane(timeout=BUILD_TIMEOUT))
    return _binary[0]


@pytest.fixture(scope="package")
def controlplane_extensions() -> list[ControlPlaneExtension]:
    """What runs beside the session's control plane; none here (see module doc)."""
    return []


@pytest.fixture(scope="package")
def controlplane(
    controlplane_binary: Path,
    controlplane_extensions: list[ControlPlaneExtension],
) -> Iterator[LocalControlPlane]:
    """This folder's control plane, with every committed CRD (crds/) installed before
    the controllers start and the API server's audit log on."""
    with LocalControlPlane(
        binary=controlplane_binary,
        crds=CRDS,
        audit_log=True,
        extensions=controlplane_extensions,
        ready_timeout=START_TIMEOUT,
    ) as cp:
        yield cp


@pytest.fixture
def namespace(controlplane: LocalControlPlane) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = controlplane.new_namespace(prefix="t")
    yield name
    controlplane.delete_namespace(name)


@pytest.fixture
def http(controlplane: LocalControlPlane) -> Iterator[httpx.Client]:
    """An httpx client for the API server as the admin user."""
    with controlplane.http_client() as client:
        yield client


@pytest.fixture(scope="session")
def kubectl() -> Path:
    """The kubectl that `.ci/fetch-tools` extracts (or `$LOCKSTEP_KUBECTL`)."""
    return find_kubectl()
