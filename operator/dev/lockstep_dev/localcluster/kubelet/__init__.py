"""A process kubelet: fake GPU nodes whose pods run as local processes.

`ProcessKubelet` registers Node objects with `nvidia.com/gpu` capacity on a
`LocalControlPlane`, keeps them Ready with heartbeats (a Lease in `kube-node-lease` and
the Ready condition's `lastHeartbeatTime`), and turns every Pod the real scheduler binds to
them into local processes, one process group per container, on the pod's own loopback
address (from 127.0.64.0/18 by default, starting at a random one). It reports pod status the way a kubelet does
(phase, podIP, container statuses with restart counts, conditions merged by type so the
operator's readiness gate is never overwritten), probes readiness, restarts containers
after a back-off, and finishes deletions after the grace period.

Typical use::

    with LocalControlPlane() as cp, ProcessKubelet(cp, nodes=2) as kubelet:
        ...  # create pods; kubelet.pod_dir(ns, name) / "container.log" holds their output

    kubelet = ProcessKubelet(nodes=2)            # or as a control-plane extension
    with LocalControlPlane(extensions=[kubelet]):
        ...

What a container becomes (`COMMANDS` is the default table; pass `commands=` to change it;
its keys are leading words of command + args, so `("python3", "-m", "sglang_router...")`
can map one program without mapping every `python3`):

- command `["lockstep-sglang"]` runs `[sys.executable, "-m", "lockstep_standin",
  *args]`, the CPU stand-in of the SGLang image; the image itself is ignored. With
  `engine=engine("sglang")` it runs the real launcher and the real SGLang server on CPU
  instead, with what a CPU-only machine needs added (`lockstep_dev.localcluster.engines`);
- `["python3", "-m", "sglang_router.launch_router", ...]` (the router the operator renders)
  runs the real sglang-router launcher with this interpreter (`sglang-router` installed
  here), exactly with the pod's args;
- any other command runs as written when its executable exists here; otherwise the
  container stays Waiting with reason `ContainerCannotRun` and a message naming it;
- the operator image's `["lockstep", "operator"]` (the chart's Deployment) runs this
  checkout's `python -m lockstep.cli operator` with `--bind-address <pod IP>` added;
- every pod shares this machine's network, so a wildcard `--host 0.0.0.0` (or `::`)
  becomes `--host <pod IP>`;
- there is no cluster DNS, so the host of `--dist-init-addr HOST:PORT` is replaced by the
  pod IP of the pod named by HOST's first DNS label in the same namespace (the start
  waits for that pod to have an IP);
- the environment is the container's `env` (`value`; `valueFrom.fieldRef` for
  metadata.name/namespace/uid, labels and annotations, spec.nodeName, status.podIP and
  status.hostIP; `valueFrom.secretKeyRef`, read through the API when the container starts:
  a missing Secret or key keeps the container Waiting with reason
  `CreateContainerConfigError` and a message naming them, and is tried again, unless the
  reference is `optional`), `LOCKSTEP_POD_IP`, `LOCKSTEP_POD_DIR`, and a few variables of
  this process (`INHERITED_ENV`: PATH, PYTHONPATH, HOME, ...); `$(VAR)` references are
  expanded as Kubernetes does;
- a pod with a `serviceAccountName` (and `automountServiceAccountToken` not false) gets
  `KUBECONFIG`: a kubeconfig minted by the control plane for
  `system:serviceaccount:<namespace>:<name>` in that account's groups, so the API server
  enforces the RBAC bound to it, as it would with the account's token.

Logs: each run of a container appends to `<pod dir>/container.log` after a header line;
`log_tail()` reads it here, and the API server's pods/log (`kubectl logs [--previous]`, the
operator's incident evidence) reaches it through `lockstep_dev.localcluster.containerlogs`,
served on 127.0.0.1 at the port each Node advertises.

Pods are watched (list, then watch from the list's resourceVersion, relisting on 410);
each pod is run by its own thread, which owns the pod's processes. Requests go through
httpx, as in `LocalControlPlane`, with the admin client certificate.

The package is laid out as the real kubelet is (each module's docstring says which part
it stands in for):

- `kubelet`: `ProcessKubelet`, its lifecycle and the sync loop that hands pods to their
  workers (`pkg/kubelet/kubelet.go`);
- `node`: node registration, node status and heartbeats, the node Lease
  (`kubelet_node_status.go`, `nodelease`);
- `podsource`: the list and watch of pods (`pkg/kubelet/config`);
- `pod_workers`: one thread per pod incarnation: init containers, start, restart policy
  and back-off, deletion and its grace period (`pod_workers.go`, `SyncPod`);
- `env`, `argv`, `serviceaccounts`: what a container becomes: its environment (fieldRef,
  secretKeyRef, the downward API), its volumes as local directories, its command and
  args as a local argv, its ServiceAccount's credentials (`kubelet_pods.go`, the
  token manager);
- `runtime`: one process group per container, its log, its end (`kuberuntime`);
- `prober`: readiness probes (`pkg/kubelet/prober`);
- `status`: container statuses, conditions, phase and the status patch
  (`pkg/kubelet/status`);
- `network`: the pods' loopback addresses (the network plugin's IPAM);
- `common`: the errors, time formats and names the others share.

Every name below is importable from the package itself, as it was from the single
module this package replaced.
"""

from __future__ import annotations

from lockstep_dev.localcluster.kubelet.argv import (
    COMMANDS,
    DIST_INIT_FLAG,
    DIST_INIT_FLAGS,
    HOST_FLAG,
    WILDCARD_HOSTS,
    dist_init_pod,
    dist_init_target,
    local_argv,
    with_dist_init_ip,
    with_pod_host,
)
from lockstep_dev.localcluster.kubelet.common import (
    FIELD_MANAGER,
    HOST_IP,
    LOG_NAME,
    CannotRun,
    ContainerConfigError,
    KubeletError,
    MissingConfig,
    Obj,
    micro_time,
    rfc3339,
)
from lockstep_dev.localcluster.kubelet.env import (
    INHERITED_ENV,
    SecretLookup,
    container_env,
    expand_refs,
    field_value,
    mount_map,
    read_secret,
    rewrite_mounts,
    secret_value,
    volume_dirs,
)
from lockstep_dev.localcluster.kubelet.kubelet import (
    ProcessKubelet,
)
from lockstep_dev.localcluster.kubelet.network import (
    AddressPool,
)
from lockstep_dev.localcluster.kubelet.node import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    LEASE_NAMESPACE,
    NODE_LABEL,
    NODE_PREFIX,
    NOT_READY_TAINT,
    RACK_LABEL,
    NodeShape,
    build_node,
    build_node_status,
    node_names,
    node_schedulable,
    rack_labels,
)
from lockstep_dev.localcluster.kubelet.prober import (
    run_probe,
)
from lockstep_dev.localcluster.kubelet.runtime import (
    LOG_MAX_BYTES,
)
from lockstep_dev.localcluster.kubelet.serviceaccounts import (
    SERVICE_ACCOUNT_GROUPS,
    service_account_identity,
    service_account_of,
)
from lockstep_dev.localcluster.kubelet.status import (
    ContainerView,
    exit_code,
    gate_states,
    pod_conditions,
    pod_phase,
)

__all__ = [
    "COMMANDS",
    "DIST_INIT_FLAG",
    "DIST_INIT_FLAGS",
    "FIELD_MANAGER",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "HOST_FLAG",
    "HOST_IP",
    "INHERITED_ENV",
    "LEASE_NAMESPACE",
    "LOG_MAX_BYTES",
    "LOG_NAME",
    "NODE_LABEL",
    "NODE_PREFIX",
    "NOT_READY_TAINT",
    "RACK_LABEL",
    "SERVICE_ACCOUNT_GROUPS",
    "WILDCARD_HOSTS",
    "AddressPool",
    "CannotRun",
    "ContainerConfigError",
    "ContainerView",
    "KubeletError",
    "MissingConfig",
    "NodeShape",
    "Obj",
    "ProcessKubelet",
    "SecretLookup",
    "build_node",
    "build_node_status",
    "container_env",
    "dist_init_pod",
    "dist_init_target",
    "exit_code",
    "expand_refs",
    "field_value",
    "gate_states",
    "local_argv",
    "micro_time",
    "mount_map",
    "node_names",
    "node_schedulable",
    "pod_conditions",
    "pod_phase",
    "rack_labels",
    "read_secret",
    "rewrite_mounts",
    "rfc3339",
    "run_probe",
    "secret_value",
    "service_account_identity",
    "service_account_of",
    "volume_dirs",
    "with_dist_init_ip",
    "with_pod_host",
]
