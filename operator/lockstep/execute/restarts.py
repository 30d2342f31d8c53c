"""Manager: in-place restarts (`RestartInPlace`).

Every pod of the group is relabelled with the next epoch (UID as precondition), then
every pod agent is asked to restart its container into it at the same moment, so the
group's ranks go down together. What could not be asked is remembered
(`Deps.restart_failures`) for the planner's next round (`GroupInput.restart_failures`);
the agents are idempotent per epoch, so a repeated ask restarts nothing twice."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lockstep.api import constants as c
from lockstep.core.recovery import RestartInPlace
from lockstep.execute.scene import GroupId, Scene, short

log = logging.getLogger(__name__)


@dataclass
class RestartManager:
    scene: Scene

    def restart_in_place(self, group: GroupId, action: RestartInPlace) -> None:
        """Relabel every pod with the new epoch, then ask every pod agent to restart into
        it at the same moment. What could not be asked is remembered for the planner."""
        scene, deps = self.scene, self.scene.deps
        role, index = group
        deps.metrics.restarts.labels(role).inc()
        key = (scene.namespace, scene.pdd.metadata.name, role, index, action.epoch)
        with deps.lock:
            failures = deps.restart_failures.setdefault(key, {})
            # A fresh ask of these pods: what an earlier ask of them met no longer counts.
            for ref in action.pods:
                failures.pop(ref.uid, None)
        try:
            token = scene.token()
        except Exception as err:
            for ref in action.pods:
                failures[ref.uid] = (f"restart token unavailable: {short(err)}", False)
            return
        ips = scene.pod_ips()
        asks: list[tuple[str, str, str]] = []  # (uid, name, pod IP)
        for ref in action.pods:
            try:
                deps.kube.relabel_pod(
                    scene.namespace, ref.name, ref.uid, {c.LABEL_EPOCH: str(action.epoch)}
                )
            except Exception as err:
                failures[ref.uid] = (f"relabel refused: {short(err)}", False)
                continue
            ip = ips.get(ref.name)
            if not ip:
                failures[ref.uid] = ("the pod has no IP", True)
                continue
            asks.append((ref.uid, ref.name, ip))
        if not asks:
            return

        def ask(item: tuple[str, str, str]) -> tuple[str, tuple[str, bool] | None]:
            uid, _, ip = item
            answer = deps.agents.restart(ip, action.epoch, action.reason, token)
            if answer.accepted:
                return uid, None
            if answer.unauthorized:
                scene.forget_token()
            return uid, (answer.error or "refused", answer.silent)

        # Every agent in the same moment: the ranks of the group go down together.
        with ThreadPoolExecutor(max_workers=min(len(asks), 32)) as pool:
            for uid, error in pool.map(ask, asks):
                if error is not None:
                    failures[uid] = error
        for uid, name, _ in asks:
            if uid in failures:
                log.warning("in-place restart of %s not accepted: %s", name, failures[uid][0])
