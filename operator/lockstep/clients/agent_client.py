"""The pod agent's client: the only code that calls a pod agent or reads its JSON.

Every SGLang pod runs lockstep's pod agent (`lockstep_sglang.agent`) on
`constants.PORT_AGENT`. The operator uses four of its routes, all through this module:

- `GET /ranks` (schema `lockstep.dev/rank-state/v1`, `lockstep_sglang.rank_state`): the
  local ranks' state; also `previous` (the last incarnation's ranks), `previous_epoch`
  (the group epoch that incarnation ran), `engine_exit` (how the SGLang server process of
  this incarnation ended). Read by the prober when a probe fails (async) and by the
  control round (sync);
- `POST /stacks`: `py-spy` dumps, for an incident's evidence;
- `POST /restart` (bearer token): the in-place group restart.

And on a leader's SGLang HTTP port (`constants.PORT_HTTP`), lockstep's runtime routes:
`GET /lockstep/inflight` (how many work requests it holds, for a planned drain) and,
with the same token, `GET /lockstep/requests` and `POST /lockstep/abort` (the requests it
holds, and ending them at once with a retryable 503: `lockstep.core.failover`).

Parsing is pure (`report_from_ranks`, `report_from_text`, `rank_state_from_json`, and
`captured_ranks`/`captured_stacks` for the answers kept in an incident's evidence); a
renamed field is a change here only, and a contract test feeds this module the real
`PodAgent`'s answer. httpx is the HTTP client (sync and async, per-request timeouts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from lockstep.api import constants as c
from lockstep.core.evidence import Capture
from lockstep.core.failover import HeldRequest
from lockstep.core.verdicts import AgentReport, Collective, Decision, RankState, clip_evidence

SCHEMA = "lockstep.dev/rank-state/v1"
# An evidence answer is bounded (16 ranks x a few hundred bytes, or a py-spy dump).
MAX_ANSWER_CHARS = 4000
UNREACHABLE = "unreachable"


class AgentDataError(ValueError):
    """A pod agent answered with something that is not a rank state."""


def agent_url(pod_ip: str) -> str:
    """The base URL of a pod's agent."""
    return f"http://{pod_ip}:{c.PORT_AGENT}"


# ----------------------------------------------------------------------------- parsing


def rank_state_from_json(
    obj: Mapping[str, Any], *, pod: str, agent_now: float | None = None
) -> RankState:
    """One rank of a `GET /ranks` answer::

        {"rank": int, "tp_rank": int, "pid": int, "alive": bool (optional, default true),
         "process": null | str (optional: the OS state, "stopped", "zombie", ...),
         "iteration": int, "updated_at": float,
         "last_decision": null | {"kind", "forward_mode", "batch_size", "rids_hash", "seq"},
         "collective": null | {"op", "group", "seq", "since"},
         "step": {"since": float | null, "count": int, "recent_s": [float, ...]} (optional),
         "consensus_failure": null | str | {"detected_at", "rank", "first_divergence", ...}}

    Other fields are ignored. A running step's age is taken against `agent_now` (the
    answer's own `now`: both from the pod's clock, whatever the operator's says). A consensus failure given as an object is summarised into a
    bounded string. Raises `AgentDataError` naming the pod when a required field is
    missing or has the wrong type.
    """
    try:
        decision_obj = obj.get("last_decision")
        decision = None
        if decision_obj is not None:
            decision = Decision(
                kind=str(decision_obj["kind"]),
                seq=_int(decision_obj["seq"]),
                forward_mode=_opt_str(decision_obj.get("forward_mode")),
                batch_size=_int(decision_obj.get("batch_size", 0)),
                rids_hash=str(decision_obj.get("rids_hash", "")),
            )
        coll_obj = obj.get("collective")
        collective = None
        if coll_obj is not None:
            collective = Collective(
                op=str(coll_obj["op"]),
                group=str(coll_obj["group"]),
                seq=_int(coll_obj["seq"]),
                since=float(coll_obj["since"]),
            )
        updated = obj.get("updated_at")
        step = obj.get("step") or {}
        since = step.get("since")
        age = None if since is None or agent_now is None else max(0.0, agent_now - float(since))
        return RankState(
            pod=pod,
            rank=_int(obj["rank"]),
            iteration=_int(obj["iteration"]),
            tp_rank=_opt_int(obj.get("tp_rank")),
            pid=_opt_int(obj.get("pid")),
            alive=bool(obj.get("alive", True)),
            process=_opt_str(obj.get("process")),
            last_decision=decision,
            collective=collective,
            consensus_failure=_failure_summary(obj.get("consensus_failure")),
            updated_at=None if updated is None else float(updated),
            step_age_s=age,
            recent_steps_s=tuple(float(d) for d in step.get("recent_s") or ()),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise AgentDataError(f"pod {pod}: bad rank state: {err!r}") from None


def same_epoch_previous(body: Mapping[str, Any], epoch: int) -> list[Any]:
    """The last incarnation's ranks, when that incarnation ran `epoch`: the one an
    in-place restart ended ran an older epoch, and its failure is not this epoch's. (A
    runtime that does not report `previous_epoch` is taken at its word.)"""
    previous = body.get("previous") or []
    ran = body.get("previous_epoch")
    if not isinstance(previous, list) or (ran is not None and str(ran) != str(epoch)):
        return []
    return previous


def report_from_ranks(pod: str, body: Any, epoch: int, error: str | None = None) -> AgentReport:
    """A pod agent's `GET /ranks` answer (None: it did not answer, `error` says why) as
    the verdicts read it: the live ranks, plus the ranks of a crashed incarnation of the
    same epoch that carry a consensus failure (the divergence is why they are gone).
    A bare list of rank states is accepted too. Never raises: a malformed answer is an
    unreachable agent with the parse error."""
    if body is None:
        return AgentReport(pod, None, error)
    items: Any = body
    agent_now = None
    if isinstance(body, Mapping):
        raw_now = body.get("now")
        agent_now = float(raw_now) if isinstance(raw_now, int | float) else None
        crashed = [
            r
            for r in same_epoch_previous(body, epoch)
            if isinstance(r, Mapping) and r.get("consensus_failure")
        ]
        items = [*(body.get("ranks") or []), *crashed]
    if not isinstance(items, list):
        return AgentReport(pod, None, f"pod {pod}: expected a list of rank states")
    try:
        return AgentReport(
            pod, tuple(rank_state_from_json(i, pod=pod, agent_now=agent_now) for i in items)
        )
    except AgentDataError as err:
        return AgentReport(pod, None, str(err))


def report_from_text(pod: str, text: str, epoch: int) -> AgentReport:
    """A `GET /ranks` answer as the evidence capture keeps it (`AgentClient.evidence`:
    the raw text, or why there is none) parsed as `report_from_ranks` parses a live one."""
    try:
        body = json.loads(text)
    except ValueError:
        return AgentReport(pod, None, f"pod {pod}: {text[:200]}")
    return report_from_ranks(pod, body, epoch)


def captured_reports(capture: Capture) -> tuple[AgentReport, ...]:
    """The rank states an evidence capture read (`CaptureBook`), one report per pod that
    had an address, parsed as a live answer is, against the incident's epoch."""
    return tuple(report_from_text(pod, text, capture.epoch) for pod, text in capture.answers)


@dataclass(frozen=True)
class CapturedRanks:
    """A `GET /ranks` answer kept in an incident's evidence (`kubectl lockstep evidence`)."""

    hostname: str | None
    epoch: str | None  # the group epoch the container ran when asked
    now: float | None  # the agent's clock when it answered: ages are read against it
    ranks: tuple[RankState, ...]
    previous: tuple[RankState, ...]  # the last incarnation's ranks
    previous_epoch: str | None
    engine_exit: str | None  # how this incarnation's SGLang server ended (None: running)
    previous_engine_exit: str | None


def captured_ranks(text: str, pod: str) -> CapturedRanks:
    """A `GET /ranks` answer as captured into evidence (the raw text). Raises
    `AgentDataError` when it is not one (truncated, an error, not JSON)."""
    try:
        body = json.loads(text)
    except ValueError:
        raise AgentDataError(f"pod {pod}: not a rank-state answer") from None
    if not isinstance(body, Mapping) or not isinstance(body.get("ranks"), list):
        raise AgentDataError(f"pod {pod}: not a rank-state answer")
    raw_now = body.get("now")
    now = float(raw_now) if isinstance(raw_now, int | float) else None

    def ranks(key: str) -> tuple[RankState, ...]:
        items = body.get(key) or []
        if not isinstance(items, list):
            raise AgentDataError(f"pod {pod}: {key} is not a list")
        return tuple(rank_state_from_json(i, pod=pod, agent_now=now) for i in items)

    return CapturedRanks(
        hostname=_opt_str(body.get("hostname")),
        epoch=_opt_str(body.get("epoch")),
        now=now,
        ranks=ranks("ranks"),
        previous=ranks("previous"),
        previous_epoch=_opt_str(body.get("previous_epoch")),
        engine_exit=_exit_summary(body.get("engine_exit")),
        previous_engine_exit=_exit_summary(body.get("previous_engine_exit")),
    )


@dataclass(frozen=True)
class StackDump:
    """One rank's `py-spy dump` from a `POST /stacks` answer."""

    rank: int
    pid: int | None
    ok: bool
    duration_s: float | None
    stack: str
    error: str | None


def captured_stacks(text: str, pod: str) -> list[StackDump]:
    """A `POST /stacks` answer as captured into evidence (the raw text). Raises
    `AgentDataError` when it is not one."""
    try:
        body = json.loads(text)
        items = body["stacks"]
        return [
            StackDump(
                rank=_int(i["rank"]),
                pid=_opt_int(i.get("pid")),
                ok=bool(i.get("ok")),
                duration_s=None if i.get("duration_s") is None else float(i["duration_s"]),
                stack=str(i.get("stack") or ""),
                error=_opt_str(i.get("error")),
            )
            for i in items
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise AgentDataError(f"pod {pod}: not a stacks answer ({err!r})") from None


def _exit_summary(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return None
    how = (
        f"signal {value.get('signal')}"
        if value.get("exit_code") is None
        else f"exit code {value.get('exit_code')}"
    )
    return f"pid {value.get('pid')} ended by {how}"


# ----------------------------------------------------------------------------- calling


@dataclass(frozen=True)
class RanksAnswer:
    """What one pod agent answered to `GET /ranks` (`body` None: no usable answer)."""

    pod: str
    body: Any = None
    error: str | None = None


@dataclass(frozen=True)
class RestartAnswer:
    """The answer to `POST /restart`: `accepted` (202, or 200 for an epoch already
    running or under way); otherwise `error`, and `silent` when nothing answered at all
    (the agent may be starting again: asking again may work) as opposed to a refusal."""

    accepted: bool
    error: str | None = None
    silent: bool = False
    unauthorized: bool = False


def _bearer(token: str) -> dict[str, str]:
    # No token known: ask without one (the agent answers 401/403, which is the truth).
    return {"Authorization": f"Bearer {token}"} if token else {}


async def read_ranks_async(
    client: httpx.AsyncClient, pod: str, base_url: str, timeout: float, token: str
) -> RanksAnswer:
    """`GET /ranks` of one agent (the prober's path), bounded by `timeout`."""
    try:
        resp = await client.get(f"{base_url}/ranks", timeout=timeout, headers=_bearer(token))
    except httpx.HTTPError as err:
        return RanksAnswer(pod, None, f"{type(err).__name__}: {err}")
    return _ranks_answer(pod, resp)


class AgentClient:
    """The control round's (synchronous) calls to pod agents."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def ranks(self, pod: str, pod_ip: str, token: str, timeout: float = 1.0) -> RanksAnswer:
        """`GET /ranks` of one agent."""
        try:
            resp = self.http.get(
                f"{agent_url(pod_ip)}/ranks", timeout=timeout, headers=_bearer(token)
            )
        except httpx.HTTPError as err:
            return RanksAnswer(pod, None, f"{type(err).__name__}: {err}")
        return _ranks_answer(pod, resp)

    def inflight(self, pod_ip: str, timeout: float = 1.0) -> int | None:
        """The work requests a leader's SGLang server holds (`GET /lockstep/inflight` on
        its HTTP port, served by lockstep's runtime); None when it does not answer."""
        try:
            resp = self.http.get(
                f"http://{pod_ip}:{c.PORT_HTTP}/lockstep/inflight", timeout=timeout
            )
            value = resp.json().get("inflight") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return value if isinstance(value, int) and value >= 0 else None

    def held_requests(
        self, pod_ip: str, token: str, timeout: float = 1.0
    ) -> tuple[HeldRequest, ...] | None:
        """The requests a leader holds (`GET /lockstep/requests`); None when it does not
        answer (down, wedged HTTP, or a runtime without the route)."""
        try:
            resp = self.http.get(
                f"http://{pod_ip}:{c.PORT_HTTP}/lockstep/requests",
                timeout=timeout,
                headers=_bearer(token),
            )
            if resp.status_code != 200:
                return None
            return held_from_json(resp.json().get("requests"))
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    def _post_leader(
        self, pod_ip: str, route: str, token: str, body: Mapping[str, Any], timeout: float
    ) -> tuple[Any, str | None]:
        """`POST` to a leader's runtime route with the operator's token: (the decoded
        JSON answer, None), or (None, why there is none)."""
        try:
            resp = self.http.post(
                f"http://{pod_ip}:{c.PORT_HTTP}{route}",
                json=dict(body),
                timeout=httpx.Timeout(timeout, connect=1.0),
                headers=_bearer(token),
            )
        except httpx.HTTPError as err:
            return None, f"{type(err).__name__}: {err}"[:200]
        if resp.status_code != 200:
            return None, f"HTTP {resp.status_code}: {resp.text[:200]}"
        try:
            return resp.json(), None
        except ValueError as err:
            return None, f"malformed answer: {err}"

    def end_requests(
        self, pod_ip: str, token: str, body: Mapping[str, Any], timeout: float = 2.0
    ) -> tuple[HeldRequest, ...] | str:
        """`POST /lockstep/abort`: what the leader ended, or why it did not answer."""
        answer, error = self._post_leader(pod_ip, "/lockstep/abort", token, body, timeout)
        if error is not None:
            return error
        try:
            return held_from_json(answer.get("aborted"))
        except (ValueError, AttributeError) as err:
            return f"malformed answer: {err}"

    def free_ended_kv(
        self, pod_ip: str, token: str, reason: str, timeout: float = 2.0
    ) -> tuple[int, int, int] | str:
        """`POST /lockstep/kv/free` (`lockstep_sglang.ended_kv`): (tokens freed, requests
        freed, tokens still held after it), or why the leader did not answer."""
        answer, error = self._post_leader(
            pod_ip, "/lockstep/kv/free", token, {"reason": reason}, timeout
        )
        if error is not None:
            return error
        try:
            return _int(answer["tokens"]), _int(answer["requests"]), _int(answer["left"]["tokens"])
        except (KeyError, TypeError, AttributeError) as err:
            return f"malformed answer: {err}"

    def evidence(self, pod_ip: str, route: str, token: str) -> str:
        """The raw answer of `GET /ranks` or `POST /stacks`, bounded, for an incident's
        evidence; `unreachable (...)` when the agent did not answer, `HTTP <status>: ...`
        when it refused."""
        method = "POST" if route == "/stacks" else "GET"
        try:
            resp = self.http.request(
                method,
                f"{agent_url(pod_ip)}{route}",
                timeout=httpx.Timeout(15.0, connect=3.0),
                headers=_bearer(token),
            )
        except httpx.HTTPError as err:
            return f"{UNREACHABLE} ({type(err).__name__}: {err})"
        if resp.status_code != 200:
            return f"HTTP {resp.status_code}: {resp.text}"[:MAX_ANSWER_CHARS]
        return resp.text[:MAX_ANSWER_CHARS]

    def restart(self, pod_ip: str, epoch: int, reason: str, token: str) -> RestartAnswer:
        """`POST /restart` into `epoch` with the deployment's bearer token."""
        try:
            resp = self.http.post(
                f"{agent_url(pod_ip)}/restart",
                json={"epoch": str(epoch), "reason": reason},
                headers=_bearer(token),
                timeout=5.0,
            )
        except httpx.HTTPError as err:
            return RestartAnswer(False, f"{type(err).__name__}: {err}", silent=True)
        if resp.status_code in (200, 202):
            return RestartAnswer(True)
        return RestartAnswer(
            False,
            f"HTTP {resp.status_code}: {resp.text[:200]}",
            unauthorized=resp.status_code == 401,
        )


def held_from_json(items: Any) -> tuple[HeldRequest, ...]:
    """The runtime's list of held requests (`lockstep_sglang.failover.HeldRequest`
    JSON); ValueError on anything else."""
    if not isinstance(items, list):
        raise ValueError("requests: not a list")
    out = []
    for item in items:
        if not isinstance(item, Mapping) or not isinstance(item.get("rid"), str):
            raise ValueError("requests: an entry without a rid")
        room = item.get("room")
        boot = item.get("bootstrap")
        host = (
            boot.rpartition(":")[0].strip("[]") if isinstance(boot, str) and ":" in boot else None
        )
        age = item.get("age_s")
        out.append(
            HeldRequest(
                rid=item["rid"],
                room=room if isinstance(room, int) and not isinstance(room, bool) else None,
                bootstrap_host=host or None,
                age_s=float(age) if isinstance(age, int | float) else 0.0,
                stream=item.get("stream") is True,
            )
        )
    return tuple(out)


def _ranks_answer(pod: str, resp: httpx.Response) -> RanksAnswer:
    if resp.status_code != 200:
        return RanksAnswer(pod, None, f"HTTP {resp.status_code}")
    try:
        return RanksAnswer(pod, resp.json())
    except ValueError as err:
        return RanksAnswer(pod, None, f"{type(err).__name__}: {err}")


def _failure_summary(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, Mapping):
        div = value.get("first_divergence")
        text = f"divergence after {value.get('events_checked', '?')} events"
        if isinstance(div, Mapping):
            text += f" at index {div.get('index')}: {dict(div.get('events') or {})}"
        return clip_evidence(text)
    return clip_evidence(str(value))


def _int(value: Any) -> int:
    # bool is an int in Python; a rank or counter given as true/false is malformed.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
