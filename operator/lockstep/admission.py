"""The admission webhook handlers (kopf), registered only when the webhook is enabled.

kopf refuses to start when admission handlers exist without a webhook server, so this
module is imported by `lockstep operator --webhook-port ...` only. Configuration comes
from the CLI's `lockstep.settings.WebhookConfig`, in kopf's memo.

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

from lockstep import constants as c
from lockstep.handlers import api_client, operator_config
from lockstep.webhook import review, self_signed_certificate, service_dns_names

log = logging.getLogger(__name__)


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
        ips = [addr] if addr not in ("0.0.0.0", "::") else []
        cert = self_signed_certificate(service_dns_names(webhook.service, webhook.namespace), ips)
        tmp = Path(tempfile.mkdtemp(prefix="lockstep-webhook-"))
        certfile, keyfile = tmp / "tls.crt", tmp / "tls.key"
        certfile.write_bytes(cert.cert_pem)
        keyfile.write_bytes(cert.key_pem)
        keyfile.chmod(0o600)
        if webhook.config_name:
            inject_ca_bundle(api_client(), webhook.config_name, cert.ca_pem)
    settings.admission.server = kopf.WebhookServer(
        addr=addr, port=webhook.port, certfile=str(certfile), pkeyfile=str(keyfile)
    )
    # The chart (or the test) owns the webhook configurations; kopf only serves.
    settings.admission.managed = None


def inject_ca_bundle(api: k8s.ApiClient, name: str, ca_pem: bytes) -> None:
    """Put the CA into every webhook of the named validating and mutating configurations."""
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
            for i in range(len(config.webhooks or []))
        ]
        if ops:
            patch(name, ops)
            log.info("injected the webhook CA into %s", name)


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
    c.GROUP, c.VERSION, c.PLURAL, id="mutate-pddeployment", operations=["CREATE", "UPDATE"]
)
def mutate_pddeployment(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Under Enforce, write each role's adjusted args and env back into the spec."""
    decision = review(body)
    for role, args in decision.adjusted_args.items():
        patch.setdefault("spec", {}).setdefault(role, {})["args"] = args
    for role, env in decision.adjusted_env.items():
        patch.setdefault("spec", {}).setdefault(role, {})["env"] = env
