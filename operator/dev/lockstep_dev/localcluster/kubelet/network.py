"""Pod addresses: each pod gets a loopback address of its own.

Stands in for the network plugin of a real node (CNI and its IPAM, which the container
runtime asks for a pod's IP): every pod here shares this machine's network, so a pod's
"own" address is one of a loopback network (127.0.64.0/18 by default) that its
processes bind to; `argv.with_pod_host` points a wildcard `--host` at it.
"""

from __future__ import annotations

import ipaddress
import random
import threading

from lockstep_dev.localcluster.kubelet.common import HOST_IP, KubeletError


class AddressPool:
    """Loopback addresses for pods, handed out round robin so that a released address
    (whose sockets may linger in TIME_WAIT) is not reused at once. The round starts at
    a random address unless `first` is given: two local clusters on one machine (CI
    jobs, engineers' drills) then almost never hand out the same address, whose fixed
    ports (HTTP, agent, rendezvous) would collide."""

    def __init__(self, network: str, *, first: int | None = None) -> None:
        self._network = ipaddress.IPv4Network(network)
        if not self._network.is_loopback:
            raise ValueError(f"{network} is not a loopback network")
        self._hosts = [str(h) for h in self._network.hosts() if str(h) != HOST_IP]
        self._used: set[str] = set()
        self._next = random.randrange(len(self._hosts)) if first is None else first
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            for step in range(len(self._hosts)):
                candidate = self._hosts[(self._next + step) % len(self._hosts)]
                if candidate not in self._used:
                    self._used.add(candidate)
                    self._next = (self._next + step + 1) % len(self._hosts)
                    return candidate
        raise KubeletError(f"address pool {self._network} is exhausted")

    def release(self, address: str) -> None:
        with self._lock:
            self._used.discard(address)
