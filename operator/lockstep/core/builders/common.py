"""What every builder shares: the objects' names, labels, selectors and owner references,
the spec hash, and the deployment's small objects (the agent-token Secret, the evidence
ConfigMaps)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment
from lockstep.api.objects import label
from lockstep.core import evidence

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


def spec_hash(obj: Any) -> str:
    """A short stable hash of a JSON-able object (pod template changes roll groups)."""
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


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
