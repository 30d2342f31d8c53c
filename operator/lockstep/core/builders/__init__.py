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

from lockstep.core.builders.common import (
    POD_GRACE_SECONDS,
    Obj,
    agent_token_secret_name,
    build_agent_token_secret,
    build_evidence_configmap,
    build_full_capture_configmap,
    deployment_labels,
    dist_port,
    group_name,
    group_selector,
    owner_references,
    pod_name,
    pod_slot,
    role_selector,
    spec_hash,
)
from lockstep.core.builders.pods import (
    LEADER_READINESS_PATH,
    build_group_pods,
    group_runtime,
    kueue_pod_group_name,
    runtime_of,
)
from lockstep.core.builders.render import build_all
from lockstep.core.builders.router import (
    ROUTER_FAILURE_DEFAULTS,
    ROUTER_KINDS,
    build_router,
    router_name,
)
from lockstep.core.builders.services import build_group_pdb, build_group_service

__all__ = [
    "LEADER_READINESS_PATH",
    "POD_GRACE_SECONDS",
    "ROUTER_FAILURE_DEFAULTS",
    "ROUTER_KINDS",
    "Obj",
    "agent_token_secret_name",
    "build_agent_token_secret",
    "build_all",
    "build_evidence_configmap",
    "build_full_capture_configmap",
    "build_group_pdb",
    "build_group_pods",
    "build_group_service",
    "build_router",
    "deployment_labels",
    "dist_port",
    "group_name",
    "group_runtime",
    "group_selector",
    "kueue_pod_group_name",
    "owner_references",
    "pod_name",
    "pod_slot",
    "role_selector",
    "router_name",
    "runtime_of",
    "spec_hash",
]
