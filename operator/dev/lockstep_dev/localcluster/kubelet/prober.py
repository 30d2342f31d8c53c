"""Readiness probes: whether a running container is ready.

Stands in for the real kubelet's prober (`pkg/kubelet/prober`: a worker per probe that
runs it every `periodSeconds` after `initialDelaySeconds` and flips readiness after
`successThreshold` successes or `failureThreshold` failures in a row). Only readiness
probes, `httpGet` and `tcpSocket`, against the pod's own address; a container without one
is ready once it runs. The pod's thread calls `update_readiness` each tick.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import httpx

from lockstep_dev.localcluster.kubelet.runtime import PodContainer


def run_probe(
    probe: Mapping[str, Any], container: Mapping[str, Any], ip: str, timeout: float
) -> bool:
    """One readiness check (httpGet or tcpSocket) against the pod's address."""
    ports = {
        p["name"]: int(p["containerPort"]) for p in container.get("ports") or [] if "name" in p
    }

    def port_of(value: Any) -> int | None:
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            return int(value)
        return ports.get(str(value))

    if "httpGet" in probe:
        get = probe["httpGet"]
        port = port_of(get.get("port"))
        if port is None:
            return False
        scheme = str(get.get("scheme", "HTTP")).lower()
        host = get.get("host") or ip
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
        url = f"{scheme}://{host}:{port}{get.get('path', '/')}"
        try:
            response = httpx.get(
                url, headers=headers, timeout=timeout, verify=False, trust_env=False
            )
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 400
    if "tcpSocket" in probe:
        port = port_of(probe["tcpSocket"].get("port"))
        if port is None:
            return False
        try:
            with socket.create_connection((probe["tcpSocket"].get("host") or ip, port), timeout):
                return True
        except OSError:
            return False
    return False


def arm_probe(container: PodContainer) -> None:
    """A container just started: not ready, no results yet, its first probe after the
    probe's initial delay."""
    container.ready = False
    container.probe_failures = container.probe_successes = 0
    probe = container.spec.get("readinessProbe") or {}
    container.probe_next = container.started_mono + float(probe.get("initialDelaySeconds", 0))


def update_readiness(container: PodContainer, now: float, ip: str) -> None:
    """Probe a running container if its probe is due (`now`: monotonic seconds) and
    update its readiness; a container without a readiness probe is ready."""
    probe = container.spec.get("readinessProbe")
    if not probe:
        container.ready = True
        return
    if now < container.probe_next:
        return
    period = float(probe.get("periodSeconds", 10))
    container.probe_next = now + period
    ok = run_probe(probe, container.spec, ip, float(probe.get("timeoutSeconds", 1)))
    if ok:
        container.probe_failures = 0
        container.probe_successes += 1
        if container.probe_successes >= int(probe.get("successThreshold", 1)):
            container.ready = True
    else:
        container.probe_successes = 0
        container.probe_failures += 1
        if container.probe_failures >= int(probe.get("failureThreshold", 3)):
            container.ready = False
