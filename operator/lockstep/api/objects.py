"""Reading Kubernetes objects as the dicts the API server and the watch caches return,
and the time format their fields use. Pure; the one copy every module reads with."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's metadata ({} when absent)."""
    return obj.get("metadata") or {}


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """An object's labels ({} when absent)."""
    return meta(obj).get("labels") or {}


def label(obj: Mapping[str, Any], key: str) -> str | None:
    """One label of an object, or None."""
    return labels(obj).get(key)


Precision = Literal["seconds", "milliseconds", "microseconds"]


def rfc3339(ts: float, precision: Precision = "seconds") -> str:
    """A UNIX time as RFC 3339 in UTC with a `Z`, as Kubernetes writes times: whole
    seconds for its `Time` fields (conditions), microseconds for the moments lockstep
    measures (an incident's first failure, verdict and recovery: their differences are
    the figures)."""
    text = datetime.fromtimestamp(ts, UTC).isoformat(timespec=precision)
    return text.replace("+00:00", "Z")


def parse_time(text: Any) -> float | None:
    """An RFC 3339 time (status, Events, Leases, audit records) as a UNIX time, a time
    without a zone read as UTC; None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
