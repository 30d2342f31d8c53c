"""The pods of one group's epoch (one per node: SGLang's argv with the policy's flags,
the runtime's entrypoint or its injection, placement), and reading back which runtime
a group's pods run."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment, RoleSpec
from lockstep.core.builders.common import (
    POD_GRACE_SECONDS,
    Obj,
    _metadata,
    agent_token_secret_name,
    dist_port,
    group_name,
    group_selector,
    pod_name,
    role_selector,
    spec_hash,
)
from lockstep.core.policy import RolePolicy

# The deep probe with a timeout under the readiness probe's own (3 s).
LEADER_READINESS_PATH = "/lockstep/probe?timeout=2"


def _dist_init_addr(pdd: PDDeployment, role: str, group: int, epoch: int, slot: int) -> str:
    host = f"{pod_name(pdd, role, group, 0, slot)}.{group_name(pdd, role, group, slot)}"
    if pdd.metadata.namespace:
        host += f".{pdd.metadata.namespace}.svc"
    return f"{host}:{dist_port(epoch)}"


def _resources(role: RoleSpec) -> Obj:
    gpus = str(role.gpus_per_pod)
    requests = {k: v for k, v in role.resources.requests.items()}
    limits = {k: v for k, v in role.resources.limits.items()}
    requests["nvidia.com/gpu"] = gpus
    limits["nvidia.com/gpu"] = gpus
    return {"requests": requests, "limits": limits}


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
    if all(var.name != c.ENV_SGLANG_CACHE_DIR for var in policy.user_env):
        # The user's own cache location (a shared volume, say) wins over the pod's.
        env.append({"name": c.ENV_SGLANG_CACHE_DIR, "value": c.CACHE_MOUNT})
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
            "volumeMounts": [
                {"name": "dshm", "mountPath": "/dev/shm"},
                {"name": c.CACHE_VOLUME, "mountPath": c.CACHE_MOUNT},
            ],
            # The pod agent's `POST /stacks` runs py-spy on the rank processes.
            "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
        }
        # The compile and JIT caches outlive the container (an emptyDir lives as long as
        # the pod): an in-place restart finds the kernels its last start built.
        volumes: list[Obj] = [
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": c.CACHE_VOLUME, "emptyDir": {}},
        ]
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
