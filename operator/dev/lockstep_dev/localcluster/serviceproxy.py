"""The API server's route to Services on the local cluster (what kube-proxy gives it).

A real API server calls a webhook (or an aggregated API) behind a Service at the Service's
ClusterIP, which kube-proxy routes to a ready endpoint. The local cluster has no
kube-proxy, and its pods live on loopback addresses, which Endpoints and EndpointSlices
may not hold (so `--enable-aggregator-routing`, which resolves through EndpointSlices,
cannot help either). `ServiceProxy` closes that gap with the API server's own mechanism:
its egress selector (`--egress-selector-config-file`) sends every connection to the
cluster (webhooks, aggregated APIs, kubelets' logs) through an HTTP CONNECT proxy on a
unix socket, and the proxy

- routes `CONNECT <ClusterIP>:<port>` to a ready pod of the Service: the pods its
  selector matches that are Running, Ready and not being deleted, at the Service port's
  `targetPort` (a number, or a container port's name), as kube-proxy would;
- passes any other address through unchanged (a webhook's `url`, a kubelet).

Each connection looks the Service and its pods up through the API (the admin client), so
a replaced pod is found at once; the API server's keep-alive connections make that rare.
`LocalControlPlane(route_services=True)` starts one and wires the API server to it.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

EGRESS_CONFIG = """\
apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
  - name: cluster
    connection:
      proxyProtocol: HTTPConnect
      transport:
        uds:
          udsName: {socket}
"""

_HEADER_LIMIT = 16 * 1024
_IO_TIMEOUT = 10.0
_BUFFER = 64 * 1024

HttpFactory = Callable[[], httpx.Client]


class RouteError(RuntimeError):
    """A Service address that has no ready endpoint (the message says why)."""


def pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or not status.get("podIP"):
        return False
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def target_port(pod: Mapping[str, Any], target: Any) -> int | None:
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return int(port["containerPort"])
    return None


def resolve(
    services: list[Mapping[str, Any]],
    pods_of: Callable[[str, Mapping[str, str]], list[Mapping[str, Any]]],
    host: str,
    port: int,
) -> tuple[str, int] | None:
    """Where a connection to `host:port` goes: None when `host` is no Service's ClusterIP
    (the caller dials it as it is); raises `RouteError` for a Service without a ready
    endpoint on that port."""
    for svc in services:
        spec = svc.get("spec") or {}
        ips = set(spec.get("clusterIPs") or []) | {spec.get("clusterIP")}
        if host not in ips:
            continue
        meta = svc["metadata"]
        name = f"{meta['namespace']}/{meta['name']}"
        ports = [p for p in spec.get("ports") or [] if int(p.get("port", 0)) == port]
        if not ports:
            raise RouteError(f"service {name} has no port {port}")
        selector = spec.get("selector") or {}
        if not selector:
            raise RouteError(f"service {name} has no selector (no endpoints to route to)")
        target = ports[0].get("targetPort", port)
        ready = []
        for pod in pods_of(str(meta["namespace"]), selector):
            number = target_port(pod, target) if pod_ready(pod) else None
            if number is not None:
                ready.append((str(pod["status"]["podIP"]), number))
        if not ready:
            raise RouteError(f"service {name} has no ready endpoint for port {port}")
        return random.choice(ready)
    return None


class ServiceProxy:
    """An HTTP CONNECT proxy on a unix socket, for the API server's egress to the cluster.

    `start()` listens (before the API server starts, which only connects on use);
    `attach()` hands it the API once the control plane is ready; `stop()` closes the
    socket and every tunnel and removes the socket's directory."""

    def __init__(self) -> None:
        # A unix socket's path is limited to about 100 bytes: a short directory of its own.
        self._dir = Path(tempfile.mkdtemp(prefix="lk-egress-"))
        self.socket_path = self._dir / "egress.sock"
        self._listener: socket.socket | None = None
        self._http: HttpFactory | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        """Connections the proxy refused, newest last (a route that failed, and why)."""

    def egress_config(self) -> str:
        """The API server's EgressSelectorConfiguration pointing at this proxy."""
        return EGRESS_CONFIG.format(socket=self.socket_path)

    def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        listener.listen(64)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name="service-proxy", daemon=True)
        self._thread.start()

    def attach(self, http: HttpFactory) -> None:
        """Resolve Services through the API from now on (`http` makes an admin client)."""
        self._http = http

    def stop(self) -> None:
        self._stopping.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            open_sockets = list(self._open)
            self._open.clear()
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- connections -------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            listener = self._listener
            if listener is None:
                return
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(conn,), name="service-proxy-conn", daemon=True
            ).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            if self._stopping.is_set():
                sock.close()
                raise OSError("service proxy stopping")
            self._open.add(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            self._track(client)
            client.settimeout(_IO_TIMEOUT)
            host, port = self._read_connect(client)
            try:
                target = self._route(host, port) or (host, port)
                upstream = socket.create_connection(target, timeout=_IO_TIMEOUT)
            except (RouteError, OSError, httpx.HTTPError) as exc:
                self._refuse(client, f"CONNECT {host}:{port}: {exc}")
                return
            self._track(upstream)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            client.settimeout(None)
            upstream.settimeout(None)
            back = threading.Thread(
                target=_pump, args=(upstream, client), name="service-proxy-back", daemon=True
            )
            back.start()
            _pump(client, upstream)
            back.join(timeout=_IO_TIMEOUT)
        except (OSError, ValueError):
            pass
        finally:
            if upstream is not None:
                self._untrack(upstream)
            self._untrack(client)

    def _read_connect(self, client: socket.socket) -> tuple[str, int]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = client.recv(4096)
            if not chunk or len(data) > _HEADER_LIMIT:
                raise ValueError("no complete CONNECT request")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        if rest:
            raise ValueError("data after the CONNECT request")  # the client speaks after 200
        method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if method != "CONNECT":
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            raise ValueError(f"{method} is not CONNECT")
        host, _, port = target.rpartition(":")
        return host.strip("[]"), int(port)

    def _route(self, host: str, port: int) -> tuple[str, int] | None:
        if self._http is None:
            return None  # not attached yet: nothing is a Service
        with self._http() as http:

            def get(path: str, **params: str) -> list[Mapping[str, Any]]:
                response = http.get(path, params=params)
                response.raise_for_status()
                items: list[Mapping[str, Any]] = response.json().get("items") or []
                return items

            def pods_of(namespace: str, selector: Mapping[str, str]) -> list[Mapping[str, Any]]:
                labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
                return get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=labels)

            return resolve(get("/api/v1/services"), pods_of, host, port)

    def _refuse(self, client: socket.socket, why: str) -> None:
        self.errors.append(why)
        del self.errors[:-50]
        with contextlib.suppress(OSError):
            client.sendall(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{why}\n".encode())


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy until `src` ends, then end `dst`'s write side."""
    try:
        while chunk := src.recv(_BUFFER):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
