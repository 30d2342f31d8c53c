"""Every object of a deployment at once (`lockstep render`)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment
from lockstep.core.builders.common import Obj, build_agent_token_secret
from lockstep.core.builders.pods import build_group_pods
from lockstep.core.builders.router import build_router
from lockstep.core.builders.services import build_group_service
from lockstep.core.policy import PolicyResult, evaluate
from lockstep.core.shape import RoleShape, deployment_shape


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
