"""A group's headless Service (the rendezvous address of its epoch) and its
PodDisruptionBudgets."""

from __future__ import annotations

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment
from lockstep.core.builders.common import Obj, _metadata, dist_port, group_name, group_selector


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
