"""Manager: the requests an incident catches (`EndRequests`).

Right after a broken group left every router, nothing in flight may wait on it: the
group's own requests end (every leader, fenced: new work refused) and so do the halves
its PD peers hold for it (`lockstep.core.failover` decides which), each with a retryable
503 so the router retries it on a healthy pair; one Event says what ended where."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from lockstep.api import constants as c
from lockstep.api import objects
from lockstep.core.failover import (
    ORPHAN_GRACE_SECONDS,
    EndOrder,
    Leader,
    plan_peers,
    still_orphaned,
)
from lockstep.core.recovery import EndRequests, Reason
from lockstep.core.verdicts import KVFree, KVReading
from lockstep.execute.scene import GroupId, Scene, short

log = logging.getLogger(__name__)


@dataclass
class RequestManager:
    scene: Scene

    def _leaders(
        self, names: set[str] | None = None, *, exclude: frozenset[str] | set[str] = frozenset()
    ) -> list[tuple[str, str, str]]:
        """(name, role, IP) of the serving leader pods (rank 0) with an address."""
        out = []
        for pod in self.scene.pods:
            name = str(objects.meta(pod).get("name"))
            ip = (pod.get("status") or {}).get("podIP")
            role = objects.label(pod, c.LABEL_ROLE)
            if objects.label(pod, c.LABEL_RANK) != "0" or role not in c.ROLES or not ip:
                continue
            if (names is not None and name not in names) or name in exclude:
                continue
            out.append((name, str(role), str(ip)))
        return out

    def end(self, group: GroupId, action: EndRequests) -> None:
        """End the group's own requests (every leader, fenced), then the halves its PD
        peers hold for it (`lockstep.core.failover`); one Event says what ended where."""
        role, index = group
        scene = self.scene
        try:
            token = scene.token()
        except Exception as err:
            log.warning("ending the requests of %s/%d: no token: %s", role, index, short(err))
            return
        agents = scene.deps.agents
        names = {p.name for p in action.pods}
        own = self._leaders(names)
        group_ips = {
            str((p.get("status") or {}).get("podIP"))
            for p in scene.pods
            if p["metadata"]["name"] in names and (p.get("status") or {}).get("podIP")
        }
        ended: dict[str, int] = {}
        rooms: set[int] = set()
        problems: list[str] = []
        body = {"all": True, "fence": True, "reason": action.reason}
        for name, _, ip in own:
            answer = agents.end_requests(ip, token, body)
            if isinstance(answer, str):
                problems.append(f"{name}: {answer}")  # a dead leader holds nothing
                continue
            if answer:
                ended[name] = len(answer)
            rooms |= {r.room for r in answer if r.room is not None}
        others = self._leaders(exclude={n for n, _, _ in own} | names)
        # Prefills first, then decodes: a room listed on a prefill has its decode half
        # listed by the time the decodes are read (lockstep.core.failover).
        others.sort(key=lambda leader: leader[1] != "prefill")
        leaders = [
            Leader(name, peer_role, ip, agents.held_requests(ip, token))
            for name, peer_role, ip in others
        ]
        plan = plan_peers(role, group_ips, rooms, leaders)
        by_name = {leader.name: leader for leader in leaders}
        self._send(plan.orders, by_name, token, action.reason, ended, problems)
        if plan.young:
            # Too young to tell from a live pair: look once more when they are not.
            time.sleep(ORPHAN_GRACE_SECONDS)
            decodes = [
                Leader(n, "decode", leader.ip, agents.held_requests(leader.ip, token))
                for n, leader in by_name.items()
                if leader.role == "decode"
            ]
            orders = still_orphaned(plan.young, decodes)
            self._send(orders, by_name, token, action.reason, ended, problems)
        if plan.unknown:
            problems.append(
                f"decode leader(s) {', '.join(plan.unknown)} did not list their requests: "
                "prefill halves without a decode were left to SGLang's bootstrap timeout"
            )
        for problem in problems:
            log.warning("ending the requests of %s/%d: %s", role, index, problem)
        if ended:
            own_count = sum(n for name, n in ended.items() if name in names)
            peers = ", ".join(f"{k}: {v}" for k, v in sorted(ended.items()) if k not in names)
            scene.events(
                "Normal",
                "RequestsEnded",
                f"{role} group {index}: ended {own_count} request(s) it held"
                + (f" and the halves its peers held for it ({peers})" if peers else "")
                + " with 503 (retryable): the router retries them on a healthy pair",
            )
            scene.deps.metrics.requests_ended.labels(role).inc(sum(ended.values()))

    def free_ended_kv(
        self, role: str, index: int, epoch: int, held: KVReading | None, at: float
    ) -> KVFree:
        """Have the group's leader (of `epoch`) free the KV its ended requests hold
        (`POST /lockstep/kv/free`, the runtime's abort); a Warning Event says what was
        held, what was freed and what is left. The answer (None left: no answer) is what
        the judge weighs next (`verdicts.ended_kv`)."""
        scene = self.scene
        leader = next(
            (
                str((p.get("status") or {}).get("podIP"))
                for p in scene.pods
                if objects.label(p, c.LABEL_ROLE) == role
                and objects.label(p, c.LABEL_GROUP) == str(index)
                and objects.label(p, c.LABEL_EPOCH) == str(epoch)
                and objects.label(p, c.LABEL_RANK) == "0"
                and (p.get("status") or {}).get("podIP")
                and not objects.meta(p).get("deletionTimestamp")
            ),
            None,
        )
        what = (
            f"{held.tokens} KV tokens for {held.requests} ended request(s), the oldest "
            f"ended {held.oldest_s:.0f}s ago"
            if held is not None
            else "KV for ended requests"
        )
        grace = scene.pdd.spec.health.ended_kv.grace_seconds
        answer: tuple[int, int, int] | str
        if leader is None:
            answer = "no leader pod with an address"
        else:
            try:
                token = scene.token()
            except Exception as err:
                answer = f"no token: {short(err)}"
            else:
                reason = f"lockstep: KV held by ended requests for more than {grace}s"
                answer = scene.deps.agents.free_ended_kv(leader, token, reason)
        if isinstance(answer, str):
            log.warning("freeing the ended KV of %s/%d: %s", role, index, answer)
            scene.events(
                "Warning",
                Reason.ENDED_KV_FREED,
                f"{role} group {index} holds {what}, for more than {grace}s; the free "
                f"through its runtime did not answer ({answer})",
            )
            return KVFree(at, None)
        freed, requests, left = answer
        scene.events(
            "Warning",
            Reason.ENDED_KV_FREED,
            f"{role} group {index} held {what}, for more than {grace}s: freed {freed} "
            f"tokens of {requests} request(s) through its runtime's abort, {left} left",
        )
        scene.deps.metrics.ended_kv_freed.labels(
            scene.namespace, scene.pdd.metadata.name, role
        ).inc(freed)
        return KVFree(at, left, freed)

    def _send(
        self,
        orders: Mapping[str, EndOrder],
        leaders: Mapping[str, Leader],
        token: str,
        reason: str,
        ended: dict[str, int],
        problems: list[str],
    ) -> None:
        for name, order in orders.items():
            if not order:
                continue
            answer = self.scene.deps.agents.end_requests(
                leaders[name].ip, token, order.body(reason)
            )
            if isinstance(answer, str):
                problems.append(f"{name}: {answer}")
            elif answer:
                ended[name] = ended.get(name, 0) + len(answer)
