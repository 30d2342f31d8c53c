"""The credentials a pod's containers get: a kubeconfig for the pod's ServiceAccount.

Stands in for the real kubelet's service account token manager (`pkg/kubelet/token`) and
the projected token volume: where a kubelet mounts a token the API server maps to
`system:serviceaccount:<namespace>:<name>`, this one sets `KUBECONFIG` to a kubeconfig the
control plane mints for that user in the account's groups, so the API server enforces the
RBAC bound to the account as it would with its token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from lockstep_dev.localcluster.controlplane import ControlPlaneError, LocalControlPlane
from lockstep_dev.localcluster.kubelet.common import KubeletError, MissingConfig, checked

SERVICE_ACCOUNT_GROUPS = ("system:serviceaccounts", "system:authenticated")


def service_account_of(pod: Mapping[str, Any]) -> str | None:
    """The ServiceAccount whose credentials a pod's containers get: its
    `serviceAccountName` unless `automountServiceAccountToken` is false. Pods without a
    name get none here (a kubelet would mount `default`'s, which grants nothing)."""
    spec = pod.get("spec") or {}
    name = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if not name or spec.get("automountServiceAccountToken") is False:
        return None
    return str(name)


def service_account_identity(namespace: str, account: str) -> tuple[str, list[str]]:
    """The user and groups the API server gives a ServiceAccount's token."""
    user = f"system:serviceaccount:{namespace}:{account}"
    return user, [
        *SERVICE_ACCOUNT_GROUPS[:1],
        f"system:serviceaccounts:{namespace}",
        *SERVICE_ACCOUNT_GROUPS[1:],
    ]


class ServiceAccountKubeconfigs:
    """The kubeconfigs of a kubelet's ServiceAccounts, minted once per account and kept
    under `directory()` (asked only when one is minted)."""

    def __init__(self, directory: Callable[[], Path]) -> None:
        self._directory = directory
        self._paths: dict[tuple[str, str], Path] = {}
        self._lock = threading.Lock()

    def get(
        self, http: httpx.Client, controlplane: LocalControlPlane, namespace: str, account: str
    ) -> Path:
        """The kubeconfig of `account` in `namespace`. Raises `MissingConfig` while the
        account does not exist (or the API server cannot say)."""
        key = (namespace, account)
        with self._lock:
            path = self._paths.get(key)
            if path is not None:
                return path
            try:
                found = http.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}")
                if found.status_code != 404:
                    checked(found, f"reading serviceaccount {namespace}/{account}")
            except (httpx.HTTPError, KubeletError) as exc:
                raise MissingConfig(f'reading serviceaccount "{account}": {exc}') from exc
            if found.status_code == 404:
                raise MissingConfig(f'serviceaccount "{account}" not found')
            directory = self._directory()
            directory.mkdir(exist_ok=True)
            user, groups = service_account_identity(namespace, account)
            try:
                path = controlplane.user_kubeconfig(
                    user, groups, path=directory / f"{namespace}_{account}.kubeconfig"
                )
            except ControlPlaneError as exc:
                raise MissingConfig(f'credentials of serviceaccount "{account}": {exc}') from exc
            self._paths[key] = path
            return path

    def clear(self) -> None:
        """Forget every kubeconfig (the kubelet stopped; its directory goes with it)."""
        with self._lock:
            self._paths.clear()
