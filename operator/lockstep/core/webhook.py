"""Admission: the same validation and flag policy as `lockstep check`, at the door.

`review` is pure: a PDDeployment object in, a decision out (allowed or not, the message
naming each rule, field and fix, and under safety mode `Enforce` the adjusted `args` per
role that the mutating webhook writes back into the spec). `self_signed_certificate`
builds the webhook's serving certificate when cert-manager is not used; the operator then
puts the CA into the webhook configurations (`inject_ca_bundle`).

`cryptography` builds the certificates: it is the maintained standard for X.509 in
Python (kopf's own self-signed path needs certbuilder/oscrypto, which are not kept up).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import InvalidPDDeployment, parse_pddeployment
from lockstep.core.policy import evaluate


@dataclass(frozen=True)
class AdmissionDecision:
    """What the webhooks answer for one object."""

    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    # role -> the user args after the policy (Enforce only; None when nothing changes)
    adjusted_args: Mapping[str, list[str]] = field(default_factory=dict)
    # role -> the user env after the policy (Enforce only: what loosened a guard dropped)
    adjusted_env: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)


def review(obj: Mapping[str, Any]) -> AdmissionDecision:
    """Judge a PDDeployment exactly as `lockstep check` does."""
    try:
        pdd = parse_pddeployment(obj)
    except InvalidPDDeployment as err:
        lines = [f"{p.field}: {p.message} (fix: {p.fix})" for p in err.problems]
        return AdmissionDecision(False, "invalid PDDeployment: " + "; ".join(lines))
    result = evaluate(pdd.spec)
    if not result.accepted:
        refused = [str(f) for f in result.findings if f.action == "rejected"]
        mode = pdd.spec.safety.mode
        return AdmissionDecision(
            False, f"refused by the lockstep flag policy (mode {mode}): " + "; ".join(refused)
        )
    warnings = tuple(
        str(f) for f in result.findings if f.severity != "info" and f.action != "rejected"
    )
    adjusted: dict[str, list[str]] = {}
    adjusted_env: dict[str, list[dict[str, Any]]] = {}
    if pdd.spec.safety.mode == "Enforce":
        for role in c.ROLES:
            new = list(result.roles[role].user_args)
            if new != list(pdd.spec.role(role).args):
                adjusted[role] = new
            env = list(result.roles[role].user_env)
            if env != list(pdd.spec.role(role).env):
                adjusted_env[role] = [
                    v.model_dump(by_alias=True, exclude_none=True, mode="json") for v in env
                ]
    return AdmissionDecision(True, "", warnings, adjusted, adjusted_env)


@dataclass(frozen=True)
class Certificate:
    """A serving certificate and the CA that signed it (PEM)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def self_signed_certificate(
    dns_names: Sequence[str], ip_addresses: Sequence[str] = (), days: int = 365
) -> Certificate:
    """A fresh CA and a server certificate for `dns_names` (and IPs), signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lockstep-webhook-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    subject = dns_names[0] if dns_names else (ip_addresses[0] if ip_addresses else "lockstep")
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return Certificate(
        ca_pem=ca.public_bytes(pem),
        cert_pem=cert.public_bytes(pem),
        key_pem=key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use to reach a webhook Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
