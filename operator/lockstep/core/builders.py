"""Pure manifest builders: a PDDeployment (plus the policy's verdict) -> Kubernetes objects.

No I/O and no Kubernetes client: every function takes its inputs as arguments and
returns plain dicts, ready for `kubectl apply`, the API client or a test.

The shape of a deployment named `m` in namespace `ns`:
- per (role, group, node rank) one Pod `m-<role>-<group>-<rank>`; the pods of one group
  are one TP group of `tp = gpusPerPod * podsPerGroup` ranks. A group has two name slots:
  a make-before-break move (node maintenance) starts the next epoch in the other slot
  (`m-<role>-<group>b-<rank>`, label `lockstep.dev/slot: "1"`) while the old pods serve;
- per group and slot one PodDisruptionBudget (every pod of the slot must stay
  available): an eviction (`kubectl drain`) of a serving group's pod is refused, and the
  operator moves the group off the node itself;
- per group one headless Service `m-<role>-<group>` (`publishNotReadyAddresses`, selector
  includes the epoch), through which every rank finds rank 0 for the torch.distributed
  rendezvous (`--dist-init-addr`), whose port also moves with the epoch, so a rank of
  an old epoch can never join a new one;
- one Secret `m-agent-token` holding the token the pod agents require on
  `POST /restart` (the operator's in-place group restart); pods read it from env;
- the sglang-router (PD mode, Kubernetes service discovery on the role selectors of the
  rank-0 pods, which are the only ones that serve HTTP), with its ServiceAccount and a
  Role to watch pods, a Deployment and a Service.
Every object is owned by the PDDeployment (when its uid is known), so deleting it
garbage-collects everything.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment, RoleSpec
from lockstep.api.objects import label
from lockstep.core import evidence
from lockstep.core.policy import PolicyResult, RolePolicy, evaluate
from lockstep.core.shape import RoleShape, deployment_shape

Obj = dict[str, Any]

# A wedged NCCL rank ignores SIGTERM; the group is restarted as a whole, so there is
# nothing to drain gracefully inside a pod.
POD_GRACE_SECONDS = 15


def group_name(pdd: PDDeployment, role: str, group: int, slot: int = 0) -> str:
    """The name of a group's headless Service (and PodDisruptionBudget) in a name slot,
    also its pods' subdomain: `<name>-<role>-<group>`, slot 1 `<name>-<role>-<group>b`."""
    return f"{pdd.metadata.name}-{role}-{group}{'b' if slot else ''}"


def pod_name(pdd: PDDeployment, role: str, group: int, rank: int, slot: int = 0) -> str:
    """`<name>-<role>-<group>-<rank>` (slot 1: `<name>-<role>-<group>b-<rank>`)."""
    return f"{group_name(pdd, role, group, slot)}-{rank}"


def pod_slot(pod: Mapping[str, Any]) -> int:
    """The name slot of a pod (its label; pods without one are slot 0)."""
    return 1 if label(pod, c.LABEL_SLOT) == "1" else 0


def dist_port(epoch: int) -> int:
    """The rendezvous port of a group's epoch."""
    return c.DIST_PORT_BASE + epoch % c.DIST_PORT_SPAN


def deployment_labels(pdd: PDDeployment) -> dict[str, str]:
    """Labels on every object of a deployment."""
    return {
        c.APP_INSTANCE: pdd.metadata.name,
        c.APP_MANAGED_BY: c.MANAGER,
        c.LABEL_DEPLOYMENT: pdd.metadata.name,
    }


def role_selector(pdd: PDDeployment, role: str) -> dict[str, str]:
    """Selects the serving (rank-0) pods of a role: what the router discovers."""
    return {c.LABEL_DEPLOYMENT: pdd.metadata.name, c.LABEL_ROLE: role, c.LABEL_RANK: "0"}


def group_selector(pdd: PDDeployment, role: str, group: int) -> dict[str, str]:
    """Selects every pod of one group, whatever its epoch."""
    return {
        c.LABEL_DEPLOYMENT: pdd.metadata.name,
        c.LABEL_ROLE: role,
        c.LABEL_GROUP: str(group),
    }


def owner_references(pdd: PDDeployment) -> list[Obj]:
    """The PDDeployment as controller owner (empty when its uid is not known yet)."""
    if not pdd.metadata.uid:
        return []
    return [
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": pdd.metadata.name,
            "uid": pdd.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(pdd: PDDeployment, name: str, labels: Mapping[str, str]) -> Obj:
    meta: Obj = {"name": name, "labels": {**deployment_labels(pdd), **labels}}
    if pdd.metadata.namespace:
        meta["namespace"] = pdd.metadata.namespace
    owners = owner_references(pdd)
    if owners:
        meta["ownerReferences"] = owners
    return meta


# The deep probe with a timeout under the readiness probe's own (3 s).
LEADER_READINESS_PATH = "/lockstep/probe?timeout=2"


def _dist_init_addr(pdd: PDDeployment, role: str, group: int, epoch: int, slot: int) -> str:
    host = f"{pod_name(pdd, role, group, 0, slot)}.{group_name(pdd, role, group, slot)}"
    if pdd.metadata.namespace:
        host += f".{pdd.metadata.namespace}.svc"
    return f"{host}:{dist_port(epoch)}"


def spec_hash(obj: Any) -> str:
    """A short stable hash of a JSON-able object (pod template changes roll groups)."""
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def _resources(role: RoleSpec) -> Obj:
    gpus = str(role.gpus_per_pod)
    requests = {k: v for k, v in role.resources.requests.items()}
    limits = {k: v for k, v in role.resources.limits.items()}
    requests["nvidia.com/gpu"] = gpus
    limits["nvidia.com/gpu"] = gpus
    return {"requests": requests, "limits": limits}


def build_evidence_configmap(pdd: PDDeployment, data: Mapping[str, str]) -> Obj:
    """The evidence store's ConfigMap (`lockstep.core.evidence`): one key per incident."""
    labels = {c.LABEL_COMPONENT: evidence.COMPONENT}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(pdd, evidence.configmap_name(pdd.metadata.name), labels),
        "data": dict(data),
    }


def build_full_capture_configmap(
    pdd: PDDeployment, name: str, incident_id: str, capture: str
) -> Obj:
    """A whole capture's ConfigMap (`lockstep.core.evidence`: one slot of the ring): the
    incident it belongs to and its capture."""
    labels = {c.LABEL_COMPONENT: evidence.FULL_COMPONENT}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(pdd, name, labels),
        "data": {"incident": incident_id, "capture": capture},
    }


def agent_token_secret_name(pdd: PDDeployment) -> str:
    """The Secret holding the pod agents' restart token."""
    return f"{pdd.metadata.name}-agent-token"


def build_agent_token_secret(pdd: PDDeployment, token: str) -> Obj:
    """The restart token's Secret (the operator generates the token once)."""
    labels = {c.LABEL_COMPONENT: "agent-token"}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(pdd, agent_token_secret_name(pdd), labels),
        "type": "Opaque",
        "stringData": {c.AGENT_TOKEN_KEY: token},
    }


def _env(pdd: PDDeployment, role: RoleSpec, policy: RolePolicy, epoch: int) -> list[Obj]:
    env: list[Obj] = [{"name": k, "value": v} for k, v in sorted(policy.env.items())]
    env.append({"name": c.ENV_GROUP_EPOCH, "value": str(epoch)})
    env.append({"name": c.ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    env.append(
        {
            "name": c.ENV_AGENT_TOKEN,
            "valueFrom": {
                "secretKeyRef": {"name": agent_token_secret_name(pdd), "key": c.AGENT_TOKEN_KEY}
            },
        }
    )
    for var in policy.user_env:
        item: Obj = {"name": var.name}
        if var.value_from is not None:
            item["valueFrom"] = var.value_from
        else:
            item["value"] = var.value or ""
        env.append(item)
    return env


def build_group_pods(
    pdd: PDDeployment,
    role_name: str,
    group: int,
    epoch: int,
    policy: RolePolicy,
    *,
    avoid_nodes: Sequence[str] = (),
    slot: int = 0,
    runtime_image: str | None = None,
) -> list[Obj]:
    """Every pod of one TP group in one epoch, rank 0 first.

    `runtime_image`: the image the injected runtime is copied from for this group (the
    one its pods already run, `runtime_of`), instead of `spec.runtime.image`.

    The spec-hash annotation names the template, not the epoch (it is the hash of the
    same pod in epoch 0), so a group restarted in place into a new epoch is not stale.
    `avoid_nodes`: nodes the scheduler should avoid when it can (a preferred node
    anti-affinity, after a group was recreated away from a failing rank's node); it is
    not part of the template either.
    """
    if runtime_image is not None and pdd.spec.runtime.inject:
        runtime = pdd.spec.runtime.model_copy(update={"image": runtime_image})
        pdd = pdd.model_copy(update={"spec": pdd.spec.model_copy(update={"runtime": runtime})})
    pods = _group_pods(pdd, role_name, group, epoch, policy, slot)
    template = (
        pods if epoch == 0 and slot == 0 else _group_pods(pdd, role_name, group, 0, policy, 0)
    )
    gang = pdd.spec.role(role_name).placement.gang
    for pod, tmpl in zip(pods, template, strict=True):
        # The Kueue labels are metadata, outside the spec hashed here; the gang settings
        # join the hash (only when set, so other templates keep their hash) so that a new
        # queue rolls the groups. The per-epoch pod-group name never enters it.
        hashed: Any = tmpl["spec"]
        if gang is not None:
            hashed = {"spec": tmpl["spec"], "gang": gang.model_dump(by_alias=True)}
        pod["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH] = spec_hash(hashed)
        if avoid_nodes:
            _prefer_avoiding(pod["spec"], avoid_nodes)
    return pods


def _prefer_avoiding(pod_spec: Obj, nodes: Sequence[str]) -> None:
    """Add preferences against `nodes` to a pod's node affinity, beside what placement
    rendered there (the user's required and preferred terms, the pod affinity)."""
    # A node field selector takes one value per NotIn: one preference per node (a node
    # avoided by none of them scores highest).
    terms = [
        {
            "weight": 100,
            "preference": {
                "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [node]}]
            },
        }
        for node in sorted(set(nodes))
    ]
    node_affinity = pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    preferred = node_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.extend(terms)


def kueue_pod_group_name(pdd: PDDeployment, role: str, group: int, epoch: int) -> str:
    """The Kueue pod group of one group's epoch: a fresh gang per epoch, so a recreated
    group is admitted anew, never counted into the workload of its withdrawn pods."""
    return f"{group_name(pdd, role, group)}-e{epoch}"


def _placement(
    pdd: PDDeployment, role_name: str, group: int, epoch: int, rank: int
) -> tuple[Obj, dict[str, str], dict[str, str]]:
    """What spec.<role>.placement adds to one pod: (pod spec fields, labels,
    annotations)."""
    placement = pdd.spec.role(role_name).placement
    spec: Obj = {}
    affinity: Obj = {}
    if placement.node_affinity:
        affinity["nodeAffinity"] = copy.deepcopy(placement.node_affinity)
    if placement.topology_key:
        # The group's epoch in one domain of topologyKey. The leader's term selects its
        # whole epoch and the leader matches it itself: the scheduler lets the first pod
        # of such a set land anywhere (when no pod matches yet), so the leader places the
        # group, where spread allows. The other ranks' term selects only that leader, which
        # they do not match, so they wait for it and follow it. Were they also to match
        # their own term, a rank 1 scheduled before its leader would pick the domain
        # blind to spread, and a leader under DoNotSchedule could then have nowhere to go.
        selector = {
            **group_selector(pdd, role_name, group),
            c.LABEL_EPOCH: str(epoch),
        }
        if rank != 0:
            selector[c.LABEL_RANK] = "0"
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": selector},
                    "topologyKey": placement.topology_key,
                }
            ]
        }
    if affinity:
        spec["affinity"] = affinity
    if placement.spread and rank == 0:
        # Groups spread, not pods: only leaders carry the constraints and only leaders
        # are counted (every epoch's; the scheduler skips terminating pods), so a group
        # counts once whatever its size. Its other ranks sit where the leader is by the
        # pod affinity above (with topologyKey set).
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": s.max_skew,
                "topologyKey": s.topology_key,
                "whenUnsatisfiable": s.when_unsatisfiable,
                "labelSelector": {"matchLabels": role_selector(pdd, role_name)},
            }
            for s in placement.spread
        ]
    if placement.scheduler_name:
        spec["schedulerName"] = placement.scheduler_name
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    kueue = placement.gang.kueue if placement.gang else None
    if kueue is not None:
        labels[c.KUEUE_QUEUE_NAME] = kueue.queue_name
        labels[c.KUEUE_POD_GROUP_NAME] = kueue_pod_group_name(pdd, role_name, group, epoch)
        annotations[c.KUEUE_POD_GROUP_TOTAL_COUNT] = str(pdd.spec.role(role_name).pods_per_group)
    return spec, labels, annotations


def _group_pods(
    pdd: PDDeployment, role_name: str, group: int, epoch: int, policy: RolePolicy, slot: int
) -> list[Obj]:
    role = pdd.spec.role(role_name)
    pods = []
    for rank in range(role.pods_per_group):
        name = pod_name(pdd, role_name, group, rank, slot)
        labels = {
            c.APP_NAME: "sglang",
            c.APP_COMPONENT: role_name,
            c.LABEL_COMPONENT: "sglang",
            c.LABEL_ROLE: role_name,
            c.LABEL_GROUP: str(group),
            c.LABEL_RANK: str(rank),
            c.LABEL_EPOCH: str(epoch),
        }
        if slot:
            labels[c.LABEL_SLOT] = str(slot)
        placed, placement_labels, placement_annotations = _placement(
            pdd, role_name, group, epoch, rank
        )
        labels.update(placement_labels)
        args = [
            *policy.argv,
            "--node-rank",
            str(rank),
            "--dist-init-addr",
            _dist_init_addr(pdd, role_name, group, epoch, slot),
        ]
        leader = rank == 0
        # Only rank 0 serves HTTP, and its readiness is the deep probe: SGLang answers
        # /model_info while it still warms up, and /health runs a generation each time.
        # The other ranks' readiness is their pod agent's /healthz (its other routes need
        # the operator's token, which a kubelet probe cannot carry).
        probe_path, probe_port = (
            (LEADER_READINESS_PATH, "http") if leader else ("/healthz", "agent")
        )
        runtime = pdd.spec.runtime
        container: Obj = {
            "name": "sglang",
            "image": pdd.spec.image,
            "imagePullPolicy": pdd.spec.image_pull_policy,
            # Injected: the stock image's Python runs the launcher the init container
            # copied; otherwise the image's own lockstep-sglang entrypoint.
            "command": [runtime.python, c.RUNTIME_LAUNCH]
            if runtime.inject
            else ["lockstep-sglang"],
            "args": args,
            "env": _env(pdd, role, policy, epoch),
            "ports": [
                {"name": "http", "containerPort": c.PORT_HTTP, "protocol": "TCP"},
                {"name": "bootstrap", "containerPort": c.PORT_BOOTSTRAP, "protocol": "TCP"},
                {"name": "agent", "containerPort": c.PORT_AGENT, "protocol": "TCP"},
                {"name": "dist", "containerPort": dist_port(epoch), "protocol": "TCP"},
            ],
            "resources": _resources(role),
            "readinessProbe": {
                "httpGet": {"path": probe_path, "port": probe_port},
                "periodSeconds": 5,
                "timeoutSeconds": 3,
                "failureThreshold": 3,
            },
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            # The pod agent's `POST /stacks` runs py-spy on the rank processes.
            "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
        }
        volumes: list[Obj] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
        init_containers: list[Obj] = []
        if runtime.inject:
            container["volumeMounts"].append(
                {"name": c.RUNTIME_VOLUME, "mountPath": c.RUNTIME_MOUNT, "readOnly": True}
            )
            volumes.append({"name": c.RUNTIME_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}})
            init_containers.append(_runtime_init_container(pdd))
        weights = pdd.spec.model.weights
        if weights and (weights.persistent_volume_claim or weights.host_path):
            container["volumeMounts"].append(
                {"name": "weights", "mountPath": weights.mount_path, "readOnly": True}
            )
            if weights.persistent_volume_claim:
                volumes.append(
                    {
                        "name": "weights",
                        "persistentVolumeClaim": {
                            "claimName": weights.persistent_volume_claim,
                            "readOnly": True,
                        },
                    }
                )
            else:
                volumes.append(
                    {
                        "name": "weights",
                        "hostPath": {"path": weights.host_path, "type": "Directory"},
                    }
                )
        pod_spec: Obj = {
            "hostname": name,
            "subdomain": group_name(pdd, role_name, group, slot),
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": POD_GRACE_SECONDS,
            "automountServiceAccountToken": False,
            "readinessGates": [{"conditionType": c.READINESS_GATE}],
            "containers": [container],
            "volumes": volumes,
        }
        if init_containers:
            pod_spec["initContainers"] = init_containers
        if role.node_selector:
            pod_spec["nodeSelector"] = dict(role.node_selector)
        if role.tolerations:
            pod_spec["tolerations"] = [
                t.model_dump(by_alias=True, exclude_none=True) for t in role.tolerations
            ]
        if role.priority_class_name:
            pod_spec["priorityClassName"] = role.priority_class_name
        pod_spec.update(placed)
        meta = _metadata(pdd, name, labels)
        meta["annotations"] = dict(placement_annotations)
        if role_name == "prefill" and leader:
            # sglang-router reads a prefill worker's bootstrap port from this annotation.
            meta["annotations"]["sglang.ai/bootstrap-port"] = str(c.PORT_BOOTSTRAP)
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec})
    return pods


def runtime_of(pod: Mapping[str, Any]) -> str | None:
    """The image a pod's injected runtime was copied from (its runtime init container's
    image); None for a pod without one (the runtime built into the SGLang image)."""
    for init in (pod.get("spec") or {}).get("initContainers") or []:
        if isinstance(init, Mapping) and init.get("name") == c.RUNTIME_VOLUME:
            image = init.get("image")
            return str(image) if image else None
    return None


def group_runtime(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The runtime a group's pods run, as status shows it: the image its runtime was
    copied from, or `<SGLang image> (built in)` when the image carries it; several
    (a group between runtimes) joined; None without pods."""
    images = set()
    for pod in pods:
        copied = runtime_of(pod)
        if copied is not None:
            images.add(copied)
            continue
        images.update(
            f"{x.get('image')} (built in)"
            for x in (pod.get("spec") or {}).get("containers") or []
            if isinstance(x, Mapping) and x.get("name") == "sglang"
        )
    return ", ".join(sorted(images)) or None


def _runtime_init_container(pdd: PDDeployment) -> Obj:
    """The init container that copies lockstep's runtime into the pod's runtime volume
    (`lockstep_sglang.install`), from the operator's image: seconds, no network."""
    return {
        "name": c.RUNTIME_VOLUME,
        "image": pdd.spec.runtime.image or c.DEFAULT_RUNTIME_IMAGE,
        "imagePullPolicy": pdd.spec.image_pull_policy,
        "command": [c.RUNTIME_INSTALL, c.RUNTIME_MOUNT],
        "volumeMounts": [{"name": c.RUNTIME_VOLUME, "mountPath": c.RUNTIME_MOUNT}],
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }


def build_group_service(
    pdd: PDDeployment, role_name: str, group: int, epoch: int, slot: int = 0
) -> Obj:
    """The headless Service of one group in one epoch (DNS for the rendezvous); the epoch
    alone tells the slots' pods apart (a move's new epoch is always the higher)."""
    selector = {**group_selector(pdd, role_name, group), c.LABEL_EPOCH: str(epoch)}
    labels = {
        c.LABEL_ROLE: role_name,
        c.LABEL_GROUP: str(group),
        c.LABEL_EPOCH: str(epoch),
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pdd, group_name(pdd, role_name, group, slot), labels),
        "spec": {
            "clusterIP": "None",
            # Ranks rendezvous before any of them is Ready.
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [
                {"name": "dist", "port": dist_port(epoch), "protocol": "TCP"},
                {"name": "http", "port": c.PORT_HTTP, "protocol": "TCP"},
            ],
        },
    }


def build_group_pdb(pdd: PDDeployment, role_name: str, group: int, slot: int) -> Obj:
    """The PodDisruptionBudget of one group's pods in one name slot: every pod must stay
    available, so the eviction API (`kubectl drain`) refuses to take a pod of a serving
    group, and refuses while its pods are not ready (the default unhealthy-pod policy):
    the group is moved off the node by the operator, which deletes its pods itself once
    they are out of every router. An integer minAvailable needs no scale subresource."""
    role = pdd.spec.role(role_name)
    slot_match = (
        {"key": c.LABEL_SLOT, "operator": "In", "values": ["1"]}
        if slot
        else {"key": c.LABEL_SLOT, "operator": "NotIn", "values": ["1"]}
    )
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(
            pdd,
            group_name(pdd, role_name, group, slot),
            {c.LABEL_ROLE: role_name, c.LABEL_GROUP: str(group)},
        ),
        "spec": {
            "minAvailable": role.pods_per_group,
            "selector": {
                "matchLabels": group_selector(pdd, role_name, group),
                "matchExpressions": [slot_match],
            },
        },
    }


# How the router treats a server that died with requests in flight (measured with
# sglang-router 0.3.2 and the real SGLang 0.5.23 on CPU, docs/router.md): with its
# defaults (health check every 60 s, 5 retries) a request whose decode died was retried
# onto the same dead decode and waited for the prefill's 300 s bootstrap timeout; with
# these the dead server leaves the rotation within ~2 s and the request is retried on
# another one. A flag the user gives in spec.router.args wins.
ROUTER_FAILURE_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("--health-check-interval-secs", "1"),
    ("--health-failure-threshold", "2"),
    ("--retry-max-retries", "2"),
    ("--retry-initial-backoff-ms", "3000"),
)


def _selector_args(selector: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(selector.items())]


def build_router(pdd: PDDeployment) -> list[Obj]:
    """sglang-router in PD mode with Kubernetes service discovery, and what it needs."""
    router = pdd.spec.router
    name = router_name(pdd)
    labels = {c.APP_NAME: "sglang-router", c.LABEL_COMPONENT: "router"}
    namespace = pdd.metadata.namespace
    args = [
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        "--service-discovery",
        "--prefill-selector",
        *_selector_args(role_selector(pdd, "prefill")),
        "--decode-selector",
        *_selector_args(role_selector(pdd, "decode")),
        "--service-discovery-port",
        str(c.PORT_HTTP),
        "--policy",
        router.policy,
        "--host",
        "0.0.0.0",
        "--port",
        str(c.PORT_ROUTER),
        "--prometheus-port",
        str(c.PORT_ROUTER_METRICS),
        # The pod's addresses, so Prometheus can scrape it (said, not left to the default).
        "--prometheus-host",
        "0.0.0.0",
    ]
    if namespace:
        args += ["--service-discovery-namespace", namespace]
    given = {a.split("=", 1)[0] for a in router.args if a.startswith("--")}
    for flag, value in ROUTER_FAILURE_DEFAULTS:
        if flag not in given:
            args += [flag, value]
    args += list(router.args)
    pod_labels = {**deployment_labels(pdd), **labels}
    service_account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(pdd, name, labels),
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(pdd, name, labels),
        # Service discovery watches the worker pods of this namespace; nothing else.
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(pdd, name, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": name,
                **({"namespace": namespace} if namespace else {}),
            }
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pdd, name, labels),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": {c.LABEL_DEPLOYMENT: pdd.metadata.name, **labels}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": name,
                    "containers": [
                        {
                            "name": "router",
                            "image": router.image or pdd.spec.image,
                            "imagePullPolicy": pdd.spec.image_pull_policy,
                            "command": ["python3"],
                            "args": args,
                            "ports": [
                                {"name": "http", "containerPort": c.PORT_ROUTER},
                                {"name": "metrics", "containerPort": c.PORT_ROUTER_METRICS},
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": "http"},
                                "periodSeconds": 5,
                            },
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pdd, name, labels),
        "spec": {
            "selector": {c.LABEL_DEPLOYMENT: pdd.metadata.name, **labels},
            "ports": [{"name": "http", "port": c.PORT_ROUTER, "targetPort": "http"}],
        },
    }
    objects: list[Obj] = [service_account, role, binding, deployment, service]
    for obj in objects:
        # What the operator compares with the live object to patch it on drift.
        body = {k: v for k, v in obj.items() if k != "metadata"}
        obj["metadata"]["annotations"] = {c.ANNOTATION_SPEC_HASH: spec_hash(body)}
    return objects


ROUTER_KINDS = ("ServiceAccount", "Role", "RoleBinding", "Deployment", "Service")


def router_name(pdd: PDDeployment) -> str:
    """The name of every router object of a deployment."""
    return f"{pdd.metadata.name}-router"


def build_all(
    pdd: PDDeployment,
    policy: PolicyResult | None = None,
    epochs: Mapping[tuple[str, int], int] | None = None,
    agent_token: str | None = None,
    shape: Mapping[str, RoleShape] | None = None,
) -> list[Obj]:
    """Every object of a deployment: the agent-token Secret, groups (Service then pods)
    per role, then the router: the groups the operator runs (`shape`, default the
    spec's: the serving groups and the warm spares, none while paused).

    `epochs` maps (role, group) to the group's current epoch (0 when absent);
    `agent_token`: the restart token (None: a fresh random one, as the operator makes).
    """
    policy = policy or evaluate(pdd.spec)
    epochs = epochs or {}
    shape = shape or deployment_shape(pdd.spec)
    token = agent_token if agent_token is not None else secrets.token_urlsafe(32)
    objects: list[Obj] = [build_agent_token_secret(pdd, token)]
    for role_name in c.ROLES:
        for group in range(shape[role_name].runs):
            epoch = epochs.get((role_name, group), 0)
            objects.append(build_group_service(pdd, role_name, group, epoch))
            objects.extend(build_group_pods(pdd, role_name, group, epoch, policy.roles[role_name]))
    if pdd.spec.router.enabled:
        objects.extend(build_router(pdd))
    return objects
