"""PDRoleScale: one scale target per role, and the rule that settles who sets the count.

A custom resource has one `scale` subresource, but the prefill and the decode role of a
PDDeployment must be scaled independently (by the HorizontalPodAutoscaler, KEDA or
`kubectl scale`). So the operator keeps, per deployment `m` and role `r`, a small
custom resource `PDRoleScale` named `m-r` (`lockstep.dev/v1alpha1`, short name `pdrs`),
owned by the PDDeployment (controller owner reference; deleting the deployment deletes
it). Its `scale` subresource maps `.spec.replicas` (the count the autoscaler wants),
`.status.replicas` (the groups that exist) and `.status.selector` (the role's serving
pods, so the HPA can read their metrics).

THE RULE (who decides how many groups a role runs). Two values can say it:
- the person's value: the PDDeployment's `spec.<role>.replicas`;
- the autoscaler's value: the PDRoleScale's `spec.replicas` (HPA, KEDA, `kubectl scale`).
The operator records, in the PDRoleScale's `status.specReplicas`, the PDDeployment value
it last reconciled from. On every round:
1. No PDRoleScale yet: it is created with the PDDeployment's value, which is served.
2. The PDDeployment's value differs from `status.specReplicas` (or nothing is recorded):
   a person changed it since the last round, so the person's value wins: the
   PDRoleScale's `spec.replicas` is set to it, then the new value is recorded.
3. Otherwise the PDDeployment was not edited since: the PDRoleScale's `spec.replicas` is
   the desired count (the autoscaler's or `kubectl scale`'s decision wins).
`status.source` says whose value is served: `PDDeployment` when the desired count equals
the PDDeployment's value, `Scale` when the PDRoleScale overrides it.

Consequences worth knowing:
- The operator never writes the autoscaler's count back into the PDDeployment's spec, so
  a GitOps tool that keeps applying the same PDDeployment does not fight the autoscaler;
  a commit that changes `replicas` is a person's edit and wins once, after which the
  autoscaler decides again from there (an HPA's next decision may move it at once:
  delete or pause the autoscaler to pin a count).
- An edit back to the recorded value is no change (the rule compares values, not
  writes): to force a count while an autoscaler runs, `kubectl scale` the PDRoleScale.
- All state lives in the two objects (nothing in the operator's memory), so an operator
  restart changes nothing. The operator must write the PDRoleScale's `spec.replicas`
  BEFORE it records `status.specReplicas` (the status subresource is a separate write):
  a crash between the two then repeats rule 2 on the next round (the same outcome),
  whereas the other order would lose the person's edit.

Pure: no I/O, no kopf; `resolve` reads the PDRoleScale as the plain mapping the API
server returned, so a malformed object (no spec, a bad count) is treated as missing
fields rather than an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from annotated_types import Le
from pydantic import Field

from lockstep.api import constants as c
from lockstep.api.models import CRDModel, RoleSpec

KIND = "PDRoleScale"
PLURAL = "pdrolescales"
SINGULAR = "pdrolescale"
SHORT_NAME = "pdrs"
CRD_NAME = f"{PLURAL}.{c.GROUP}"


def _role_replicas_bound() -> int:
    for rule in RoleSpec.model_fields["replicas"].metadata:
        if isinstance(rule, Le) and isinstance(rule.le, int):
            return rule.le
    raise AssertionError("RoleSpec.replicas has no upper bound")


# The scale object may ask for any count the PDDeployment's role accepts: one bound, so
# the person's value can always be written into the scale object (rule 2).
MAX_REPLICAS = _role_replicas_bound()

Source = Literal["PDDeployment", "Scale"]
SOURCE_DEPLOYMENT: Source = "PDDeployment"
SOURCE_SCALE: Source = "Scale"


class PDRoleScaleSpec(CRDModel):
    """What the autoscaler (or `kubectl scale`) wants."""

    replicas: int = Field(
        ge=0,
        le=MAX_REPLICAS,
        description="Desired TP groups of the role (the scale subresource's spec.replicas).",
    )


class PDRoleScaleStatus(CRDModel):
    """What the operator observed and last reconciled from."""

    replicas: int = Field(0, ge=0, description="TP groups of the role that exist.")
    ready_groups: int | None = Field(
        None, ge=0, description="Groups that are Healthy and admitted to the router."
    )
    selector: str | None = Field(
        None,
        description="Label selector (string form) of the role's serving (rank-0) pods: one "
        "pod per group, whose metrics the HPA reads.",
    )
    spec_replicas: int | None = Field(
        None,
        ge=0,
        description="The PDDeployment's spec.<role>.replicas the operator last reconciled "
        "from; a different value there means a person edited it, and it wins.",
    )
    source: Source | None = Field(
        None,
        description="Whose value is served: PDDeployment (the person's) or Scale (the "
        "autoscaler's, or kubectl scale).",
    )


def role_scale_name(deployment: str, role: str) -> str:
    """`<deployment>-<role>`: the PDRoleScale of one role."""
    return f"{deployment}-{role}"


def selector_string(selector: Mapping[str, str]) -> str:
    """A label selector in the string form of `status.selector` (`k=v,k=v`, sorted)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def role_scale_labels(deployment: str, role: str) -> dict[str, str]:
    """Labels on a PDRoleScale (the deployment's labels plus the role)."""
    return {
        c.APP_INSTANCE: deployment,
        c.APP_MANAGED_BY: c.MANAGER,
        c.LABEL_DEPLOYMENT: deployment,
        c.LABEL_ROLE: role,
    }


def build_role_scale(
    pdd_name: str,
    namespace: str,
    uid: str | None,
    role: str,
    replicas: int,
    selector: Mapping[str, str],
    *,
    observed_replicas: int = 0,
    ready_groups: int | None = None,
) -> dict[str, Any]:
    """The PDRoleScale of a new role (rule 1): spec.replicas is the PDDeployment's value.

    `selector` is the role's serving-pod selector (`builders.role_selector`). The object
    carries the status the operator writes right after creating it: the API server drops
    `status` on create (status subresource), so it is a second write.
    """
    if role not in c.ROLES:
        raise ValueError(f"role must be one of {c.ROLES}, not {role!r}")
    spec = PDRoleScaleSpec(replicas=replicas)
    status = PDRoleScaleStatus(
        replicas=observed_replicas,
        ready_groups=ready_groups,
        selector=selector_string(selector),
        spec_replicas=replicas,
        source=SOURCE_DEPLOYMENT,
    )
    metadata: dict[str, Any] = {
        "name": role_scale_name(pdd_name, role),
        "namespace": namespace,
        "labels": role_scale_labels(pdd_name, role),
    }
    if uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": c.API_VERSION,
                "kind": c.KIND,
                "name": pdd_name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": c.API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": spec.model_dump(exclude_none=True),
        "status": status.model_dump(exclude_none=True),
    }


@dataclass(frozen=True)
class Resolution:
    """What one round decides for one role.

    - `replicas`: the groups the role should run;
    - `source`: whose value that is (`PDDeployment` or `Scale`);
    - `create`: no PDRoleScale exists: create `build_role_scale(..., replicas)`;
    - `scale_spec_patch`: a merge patch for the PDRoleScale (main resource) when the
      person's value must be written into its spec.replicas, else None; write it first;
    - `status`: the status fields the rule owns (`specReplicas`, the record, and
      `source`); `status_patch` adds the observations. Written after the spec.
    """

    replicas: int
    source: Source
    create: bool
    scale_spec_patch: dict[str, Any] | None
    status: dict[str, Any]


def _count(obj: Mapping[str, Any], part: str, key: str) -> int | None:
    """`obj[part][key]` when it is a count the CRD accepts; None when absent or malformed
    (the rule reads nothing else, so fields written by newer operators do not matter)."""
    section = obj.get(part)
    value = section.get(key) if isinstance(section, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REPLICAS:
        return value
    return None


def resolve(spec_replicas: int, scale: Mapping[str, Any] | None) -> Resolution:
    """Apply THE RULE (module docstring) to the PDDeployment's `spec.<role>.replicas`
    and the role's PDRoleScale as read from the API server (None: it does not exist)."""
    if scale is None:
        return Resolution(
            replicas=spec_replicas,
            source=SOURCE_DEPLOYMENT,
            create=True,
            scale_spec_patch=None,
            status=_record(spec_replicas, SOURCE_DEPLOYMENT),
        )
    wanted = _count(scale, "spec", "replicas")
    recorded = _count(scale, "status", "specReplicas")
    if wanted is None or recorded is None or recorded != spec_replicas:
        # Rule 2: a person's edit since the last round (or nothing trustworthy recorded,
        # e.g. a crash between create and the first status write): the person wins.
        patch = None
        if wanted != spec_replicas:
            patch = {"spec": {"replicas": spec_replicas}}
        return Resolution(
            replicas=spec_replicas,
            source=SOURCE_DEPLOYMENT,
            create=False,
            scale_spec_patch=patch,
            status=_record(spec_replicas, SOURCE_DEPLOYMENT),
        )
    # Rule 3: the PDDeployment is as last seen; the scale object's count is served.
    source = SOURCE_DEPLOYMENT if wanted == spec_replicas else SOURCE_SCALE
    return Resolution(
        replicas=wanted,
        source=source,
        create=False,
        scale_spec_patch=None,
        status=_record(spec_replicas, source),
    )


def _record(spec_replicas: int, source: Source) -> dict[str, Any]:
    return {"specReplicas": spec_replicas, "source": source}


def status_patch(
    resolution: Resolution,
    *,
    replicas: int,
    ready_groups: int | None,
    selector: Mapping[str, str],
) -> dict[str, Any]:
    """The merge patch for the PDRoleScale's status subresource after a round: the
    rule's record and source, the groups that exist and are ready, and the serving-pod
    selector the HPA counts (`builders.role_selector`)."""
    status = PDRoleScaleStatus(
        replicas=replicas,
        ready_groups=ready_groups,
        selector=selector_string(selector),
        **resolution.status,
    )
    return {"status": status.model_dump()}
