"""Admission review: the same verdicts and messages as `lockstep check`."""

from __future__ import annotations

from cryptography import x509
from factories import load_example

from lockstep.core.webhook import review, self_signed_certificate, service_dns_names


def test_good_examples_are_admitted_without_changes_when_nothing_is_adjusted() -> None:
    decision = review(load_example("dp-attention"))
    assert decision.allowed and decision.message == ""


def test_unsafe_example_refused_with_rule_field_and_fix() -> None:
    decision = review(load_example("unsafe/operator-owned-flag"))
    assert not decision.allowed
    assert "operator-owned-flag" in decision.message
    assert "spec.decode.args[0]" in decision.message
    assert "spec.decode.tp" in decision.message  # the fix names the field to use


def test_invalid_spec_refused_with_field_path() -> None:
    obj = load_example("pd-small")
    obj["spec"]["decode"]["tp"] = 3
    decision = review(obj)
    assert not decision.allowed and "spec.decode.tp" in decision.message


def test_reject_mode_refuses_what_enforce_adjusts() -> None:
    obj = load_example("unsafe/overlap-schedule")
    obj["spec"]["safety"] = {"mode": "Reject"}
    decision = review(obj)
    assert not decision.allowed and "overlap-schedule" in decision.message


def test_enforce_returns_the_adjusted_args_and_warnings() -> None:
    decision = review(load_example("unsafe/watchdog-unbounded"))
    assert decision.allowed
    assert decision.adjusted_args["prefill"][:2] == ["--watchdog-timeout", "300"]
    assert any("watchdog-timeout" in w for w in decision.warnings)
    # Re-reviewing the adjusted spec changes nothing more: the mutation is idempotent.
    obj = load_example("unsafe/watchdog-unbounded")
    for role, args in decision.adjusted_args.items():
        obj["spec"][role]["args"] = args
    again = review(obj)
    assert again.allowed and again.adjusted_args == {}


def test_self_signed_certificate_is_signed_by_its_ca_for_the_service_names() -> None:
    cert = self_signed_certificate(service_dns_names("lk-webhook", "ops"), ["127.0.0.1"])
    ca = x509.load_pem_x509_certificate(cert.ca_pem)
    leaf = x509.load_pem_x509_certificate(cert.cert_pem)
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "lk-webhook.ops.svc" in sans.get_values_for_type(x509.DNSName)
    assert [str(i) for i in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
