"""Where the process kubelet learns of pods: a list, then a watch, of every pod.

Stands in for the real kubelet's API server pod source (`pkg/kubelet/config/apiserver.go`,
a reflector over the pods bound to its node feeding the sync loop): list every pod, then
watch from the list's resourceVersion (with bookmarks); on 410 Gone list again, and after
any other failure list again after a bounded back-off. Each pod seen goes to `observe`
(with whether it was deleted); after each list, `relisted` gets the UIDs it held, so pods
deleted while nobody watched are noticed. The kubelet filters by node itself.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable

import httpx

from lockstep_dev.localcluster.kubelet.common import REQUEST_TIMEOUT, KubeletError, Obj, checked

WATCH_SECONDS = 30
"""How long one watch request lasts (the server ends it; the next one resumes)."""


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class PodSource:
    """The list and watch of every pod, run by `run` on the kubelet's watch thread until
    `stopping` is set; `interrupt` ends a blocked read at once."""

    def __init__(
        self,
        *,
        observe: Callable[[Obj, bool], None],
        relisted: Callable[[set[str]], None],
        stopping: threading.Event,
        record: Callable[[str], None],
    ) -> None:
        self._observe = observe
        self._relisted = relisted
        self._stopping = stopping
        self._record = record
        self._socket: socket.socket | None = None

    def interrupt(self) -> None:
        """Shut the watch's socket down, which ends its blocking read at once."""
        if self._socket is not None:
            self._socket.shutdown(socket.SHUT_RDWR)

    def run(self, http: httpx.Client) -> None:
        """List every pod, then watch from the list's resourceVersion; relist on 410 or
        after a failure, with a bounded back-off between attempts."""
        delay = 0.2
        while not self._stopping.is_set():
            try:
                version = self._relist(http)
                while not self._stopping.is_set():
                    version = self._watch_once(http, version)
                return
            except Gone:
                delay = 0.2
            except Exception as exc:
                self._record(f"pod watch: {exc!r}")
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)

    def _relist(self, http: httpx.Client) -> str:
        listed = checked(http.get("/api/v1/pods"), "listing pods")
        seen = set()
        for pod in listed.get("items") or []:
            seen.add(pod["metadata"]["uid"])
            self._observe(pod, False)
        self._relisted(seen)
        return str(listed["metadata"]["resourceVersion"])

    def _watch_once(self, http: httpx.Client, version: str) -> str:
        params = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        timeout = httpx.Timeout(REQUEST_TIMEOUT, read=WATCH_SECONDS + 15.0)
        with http.stream("GET", "/api/v1/pods", params=params, timeout=timeout) as response:
            stream = response.extensions.get("network_stream")
            self._socket = stream.get_extra_info("socket") if stream else None
            if self._stopping.is_set():
                return version
            if response.status_code == 410:
                raise Gone()
            if not response.is_success:
                response.read()
                raise KubeletError(f"watching pods: HTTP {response.status_code}: {response.text}")
            for line in response.iter_lines():
                if self._stopping.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise KubeletError(f"pod watch error: {obj.get('message')}")
                version = obj["metadata"].get("resourceVersion", version)
                if kind != "BOOKMARK":
                    self._observe(obj, kind == "DELETED")
        return version
