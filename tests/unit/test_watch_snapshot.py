"""What the watch-fed indexes keep of a pod: everything the round reads, as a private
copy, without `managedFields` (half a pod's size, read by nothing here)."""

from __future__ import annotations

import pytest

from lockstep.handlers.operator import snapshot

pytestmark = pytest.mark.unit


def test_snapshot_is_a_private_copy_without_managed_fields() -> None:
    pod = {
        "metadata": {
            "name": "m-decode-0-0",
            "labels": {"lockstep.dev/deployment": "m"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"containers": [{"name": "sglang"}]},
        "status": {"podIP": "10.0.0.1", "containerStatuses": [{"restartCount": 2}]},
    }
    kept = snapshot(pod)
    assert "managedFields" not in kept["metadata"]
    assert kept["status"] == pod["status"] and kept["spec"] == pod["spec"]
    assert kept["metadata"]["labels"] == {"lockstep.dev/deployment": "m"}
    # The watch event's object may be reused: the index's copy does not follow it.
    pod["status"]["containerStatuses"][0]["restartCount"] = 3
    assert kept["status"]["containerStatuses"][0]["restartCount"] == 2
    assert "managedFields" in pod["metadata"]
