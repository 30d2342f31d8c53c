"""The local cluster: a real Kubernetes control plane on 127.0.0.1, for tests and
`lockstep dev`.

`LocalControlPlane` builds (once, cached) and runs etcd, kube-apiserver,
kube-controller-manager and kube-scheduler from Kubernetes' own Go modules; see
`lockstep_dev.localcluster.controlplane`.
"""

from lockstep_dev.localcluster.controlplane import (
    BINARY_ENV,
    KUBECTL_ENV,
    TEST_NAMESPACE_LABEL,
    ControlPlaneError,
    ControlPlaneExtension,
    LocalControlPlane,
    ReadyInfo,
    build_controlplane,
    find_kubectl,
)

__all__ = [
    "BINARY_ENV",
    "KUBECTL_ENV",
    "TEST_NAMESPACE_LABEL",
    "ControlPlaneError",
    "ControlPlaneExtension",
    "LocalControlPlane",
    "ReadyInfo",
    "build_controlplane",
    "find_kubectl",
]
