"""The operator's configuration: one typed object, built by the CLI from its flags and
handed to the kopf handlers through kopf's `memo` (never through environment writes).

`lockstep operator --help` documents every field; the chart sets them as flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lockstep.clients.leader import ElectionConfig

# kopf's memo key the configuration travels under.
MEMO_KEY = "config"


@dataclass(frozen=True)
class WebhookConfig:
    """The admission webhook's server (`lockstep.handlers.admission`)."""

    port: int
    addr: str = "0.0.0.0"
    # cert-manager's tls.crt/tls.key, or None for a self-signed certificate whose CA the
    # operator injects into `config_name`'s webhook configurations.
    cert_dir: str | None = None
    service: str = "lockstep-webhook"
    namespace: str = "default"
    config_name: str | None = None
    # The Secret (in `namespace`) the self-signed certificate is kept in, shared by every
    # replica (None: `<service>-cert`).
    cert_secret: str | None = None


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the running operator is configured with."""

    metrics_port: int = 0  # 0: no /metrics
    bind_address: str = "0.0.0.0"  # where /metrics (and /healthz, the webhook) listen
    # A control round this often even when nothing woke it (the safety net).
    resync_seconds: float = 10.0
    # Watching exact namespaces: kopf must not list namespaces (or CRDs) cluster-wide.
    exact_namespaces: bool = False
    webhook: WebhookConfig | None = None
    # The image SGLang pods copy lockstep's runtime from when spec.runtime.image is unset
    # (None: lockstep.api.constants.DEFAULT_RUNTIME_IMAGE); the chart passes its own image.
    runtime_image: str | None = None
    # Several replicas: the leader election (None: one replica, which always acts).
    election: ElectionConfig | None = None


def operator_config(memo: Mapping[str, Any]) -> OperatorConfig:
    """The CLI's configuration from kopf's memo; the defaults under a plain `kopf run`."""
    config = memo.get(MEMO_KEY)
    return config if isinstance(config, OperatorConfig) else OperatorConfig()
