"""The admission webhook handlers (kopf), registered only when the webhook is enabled.

kopf refuses to start when admission handlers exist without a webhook server, so this
module is imported by `lockstep operator --webhook-port ...` only. Configuration comes
from the CLI's `lockstep.handlers.settings.WebhookConfig`, in kopf's memo.

Every replica serves the webhook, the leader and the standbys (`lockstep.handlers.ha` runs the
standbys' kopf with `STANDBY`, a registry of these handlers only), with one certificate:
without cert-manager the first replica makes a CA and a serving certificate and keeps
them in a Secret (create-or-read: of two replicas starting at once one creates, the other
reads), every replica serves that one, and its CA goes into the webhook configurations
when it is not there yet.

- `validate-pddeployment` (path `/validate-pddeployment`): refuses invalid specs and specs
  the flag policy refuses, naming rule, field and fix; warnings for what it adjusts.
- `mutate-pddeployment` (path `/mutate-pddeployment`): under safety mode `Enforce`, writes
  the adjusted `args` and `env` of each role back into the spec.
"""

from __future__ import annotations

import base64
import logging
import tempfile
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from lockstep.api import constants as c
from lockstep.clients.kube import api_client
from lockstep.core.webhook import Certificate, review, self_signed_certificate, service_dns_names
from lockstep.handlers.settings import operator_config

log = logging.getLogger(__name__)

# The standby replicas' kopf registry: the webhook and nothing that acts (lockstep.handlers.ha).
STANDBY = kopf.OperatorRegistry()


@kopf.on.startup(registry=STANDBY)
@kopf.on.startup()
def webhook_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Start kopf's webhook server with cert-manager's or a self-signed certificate."""
    webhook = operator_config(memo).webhook
    if webhook is None:
        raise kopf.PermanentError("the admission handlers are loaded without a webhook config")
    addr = webhook.addr
    if webhook.cert_dir:
        certfile, keyfile = Path(webhook.cert_dir) / "tls.crt", Path(webhook.cert_dir) / "tls.key"
    else:
        api = api_client()
        cert = shared_certificate(
            api, webhook.namespace, webhook.cert_secret or f"{webhook.service}-cert",
            service_dns_names(webhook.service, webhook.namespace),
            [addr] if addr not in ("0.0.0.0", "::") else [],
        )  # fmt: skip
        tmp = Path(tempfile.mkdtemp(prefix="lockstep-webhook-"))
        certfile, keyfile = tmp / "tls.crt", tmp / "tls.key"
        certfile.write_bytes(cert.cert_pem)
        keyfile.write_bytes(cert.key_pem)
        keyfile.chmod(0o600)
        if webhook.config_name:
            inject_ca_bundle(api, webhook.config_name, cert.ca_pem)
    settings.admission.server = kopf.WebhookServer(
        addr=addr, port=webhook.port, certfile=str(certfile), pkeyfile=str(keyfile)
    )
    # The chart (or the test) owns the webhook configurations; kopf only serves.
    settings.admission.managed = None


def shared_certificate(
    api: k8s.ApiClient, namespace: str, secret: str, dns_names: list[str], ips: list[str]
) -> Certificate:
    """The webhook certificate every replica serves: read from `secret`, or made and
    stored there when there is none (409: another replica made it first; read that).
    The API server reaches the webhook by its Service's name (`dns_names`); `ips`: the
    address a webhook URL names, where one does (the maker's)."""
    core = k8s.CoreV1Api(api)
    for _ in range(3):
        try:
            found = core.read_namespaced_secret(secret, namespace)
        except ApiException as err:
            if err.status != 404:
                raise
        else:
            data = found.data or {}
            try:
                return Certificate(
                    ca_pem=base64.b64decode(data["ca.crt"]),
                    cert_pem=base64.b64decode(data["tls.crt"]),
                    key_pem=base64.b64decode(data["tls.key"]),
                )
            except KeyError as err:
                raise kopf.PermanentError(
                    f"Secret {namespace}/{secret} has no {err.args[0]}: delete it, the "
                    "operator makes a new one"
                ) from None
        cert = self_signed_certificate(dns_names, ips)
        body = k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(
                name=secret,
                namespace=namespace,
                labels={
                    "app.kubernetes.io/managed-by": "lockstep",
                    "app.kubernetes.io/component": "webhook",
                },
            ),
            type="kubernetes.io/tls",
            data={
                "ca.crt": base64.b64encode(cert.ca_pem).decode(),
                "tls.crt": base64.b64encode(cert.cert_pem).decode(),
                "tls.key": base64.b64encode(cert.key_pem).decode(),
            },
        )
        try:
            core.create_namespaced_secret(namespace, body)
        except ApiException as err:
            if err.status == 409:
                continue  # another replica made it: read that one
            raise
        log.info("made the webhook certificate, kept in Secret %s/%s", namespace, secret)
        return cert
    raise kopf.TemporaryError(f"Secret {namespace}/{secret} keeps changing", delay=5)


def inject_ca_bundle(api: k8s.ApiClient, name: str, ca_pem: bytes) -> None:
    """Put the CA into every webhook of the named validating and mutating configurations
    (only where it is not there already: replicas sharing one CA write it once)."""
    bundle = base64.b64encode(ca_pem).decode()
    adm = k8s.AdmissionregistrationV1Api(api)
    for read, patch in (
        (
            adm.read_validating_webhook_configuration,
            adm.patch_validating_webhook_configuration,
        ),
        (adm.read_mutating_webhook_configuration, adm.patch_mutating_webhook_configuration),
    ):
        try:
            config = read(name)
        except ApiException as err:
            if err.status == 404:
                continue  # e.g. no mutating webhook unless safety mode Enforce is used
            raise
        ops = [
            {"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
            for i, hook in enumerate(config.webhooks or [])
            if getattr(getattr(hook, "client_config", None), "ca_bundle", None) != bundle
        ]
        if ops:
            patch(name, ops)
            log.info("injected the webhook CA into %s", name)
        else:
            log.info("the webhook CA is already in %s", name)


@kopf.on.validate(
    c.GROUP, c.VERSION, c.PLURAL, id="validate-pddeployment", operations=["CREATE", "UPDATE"],
    registry=STANDBY,
)  # fmt: skip
@kopf.on.validate(
    c.GROUP, c.VERSION, c.PLURAL, id="validate-pddeployment", operations=["CREATE", "UPDATE"]
)
def validate_pddeployment(body: kopf.Body, warnings: list[str], **_: Any) -> None:
    """Refuse what `lockstep check` refuses, with the same messages."""
    decision = review(body)
    if not decision.allowed:
        raise kopf.AdmissionError(decision.message, code=422)
    warnings.extend(decision.warnings[:10])


@kopf.on.mutate(
    c.GROUP, c.VERSION, c.PLURAL, id="mutate-pddeployment", operations=["CREATE", "UPDATE"],
    registry=STANDBY,
)  # fmt: skip
@kopf.on.mutate(
    c.GROUP, c.VERSION, c.PLURAL, id="mutate-pddeployment", operations=["CREATE", "UPDATE"]
)
def mutate_pddeployment(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Under Enforce, write each role's adjusted args and env back into the spec."""
    decision = review(body)
    for role, args in decision.adjusted_args.items():
        patch.setdefault("spec", {}).setdefault(role, {})["args"] = args
    for role, env in decision.adjusted_env.items():
        patch.setdefault("spec", {}).setdefault(role, {})["env"] = env
