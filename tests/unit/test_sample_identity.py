"""Each probe counts once: a sample carries an identity, and the failure threshold counts
distinct samples, however often a round looks and however the clocks drift.

The bug this pins: a sample's wall time was recomputed every round as its monotonic time
plus (wall - monotonic) read at that moment; the offset drifts by a fraction of a
microsecond between rounds, so the same sample looked newer than the one already
counted, and one failed probe moved the failure count from 1 to 2.
"""

from __future__ import annotations

import itertools

import httpx

from lockstep.clients.metrics import Metrics
from lockstep.clients.prober import ProbeBook, ProbeSample, ProbeTarget
from lockstep.control import Runtime, observe_group
from lockstep.core.records import ANNOTATION_RECORDS, dump_records, load_records
from lockstep.core.recovery import GroupInput, RoleSettings, Step, new_group_record, plan_group
from lockstep.core.verdicts import PodView

KEY = ("ns", "m", "decode", 0)
POD = {
    "metadata": {
        "name": "m-decode-0-0",
        "uid": "u0",
        "labels": {"lockstep.dev/epoch": "0", "lockstep.dev/rank": "0"},
    },
    "status": {
        "phase": "Running",
        "podIP": "127.0.9.9",
        "containerStatuses": [{"state": {"running": {}}, "restartCount": 0}],
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}


def drifting_runtime(book: ProbeBook) -> Runtime:
    ticks = itertools.count()
    # wall - monotonic, read afresh each time: it creeps forward 0.3 us per read.
    return Runtime(
        kube=None,  # type: ignore[arg-type]  # not reached on this path
        book=book,
        metrics=Metrics(),
        http=httpx.Client(),
        probe_clock_offset=lambda: 1_000_000.0 + next(ticks) * 3e-7,
    )


def failed_sample(book: ProbeBook, at: float) -> ProbeSample:
    recorded = book.record(ProbeSample(KEY, 0, at, False, 1.0, "timed out after 1s"))
    assert recorded is not None and recorded.id
    return recorded


def test_one_failed_probe_counts_once_under_a_drifting_clock() -> None:
    book = ProbeBook()
    book.set_targets("ns", "m", [ProbeTarget(KEY, 0, "http://x", (), 1.0, 1.0)])
    rt = drifting_runtime(book)
    settings = RoleSettings("decode", 1)  # failureThreshold 3
    record = new_group_record("decode", 0, now=0.0).model_copy(update={"step": Step.HEALTHY})
    pods = (PodView("m-decode-0-0", "u0", 0, 0),)
    first = failed_sample(book, 10.0)
    failures = []
    for _ in range(5):  # five rounds, one sample: e.g. woken by pod events
        verdict = observe_group(rt, KEY, record, [POD], 1, now=1_000_010.0)
        plan = plan_group(record, GroupInput(pods, verdict), settings, now=1_000_010.0)
        record = plan.record
        failures.append(record.detection.failures)
    assert failures == [1, 1, 1, 1, 1]
    assert record.detection.last_sample == first.id
    # A new sample is new: the count moves, once per sample, and the threshold (3) is
    # reached on the third distinct failed probe, not before.
    for n, at in ((2, 11.0), (3, 12.0)):
        failed_sample(book, at)
        for _ in range(3):
            verdict = observe_group(rt, KEY, record, [POD], 1, now=1_000_000.0 + at)
            record = plan_group(record, GroupInput(pods, verdict), settings, now=at).record
        assert record.detection.failures == n or record.step is Step.DRAINING
    assert record.step is Step.DRAINING


def test_sample_ids_are_unique_across_operator_processes_and_epochs() -> None:
    one, two = ProbeBook(), ProbeBook()
    for book in (one, two):
        book.set_targets("ns", "m", [ProbeTarget(KEY, 0, "http://x", (), 1.0, 1.0)])
    ids = {failed_sample(b, 1.0).id for b in (one, two, one, two)}
    assert len(ids) == 4
    # A sample of an epoch the target left is not recorded (and gets no id).
    assert one.record(ProbeSample(KEY, 7, 2.0, False)) is None


def test_passing_probes_of_a_healthy_group_do_not_change_what_is_persisted() -> None:
    """Which sample was counted last lives in memory only: a healthy group's persisted
    record stays the same from one passing probe to the next (nothing to write), and an
    operator that loads it counts the first sample of its own (new) book."""
    book = ProbeBook()
    book.set_targets("ns", "m", [ProbeTarget(KEY, 0, "http://x", (), 1.0, 1.0)])
    rt = drifting_runtime(book)
    settings = RoleSettings("decode", 1)
    record = new_group_record("decode", 0, now=0.0).model_copy(update={"step": Step.HEALTHY})
    pods = (PodView("m-decode-0-0", "u0", 0, 0),)
    dumps = []
    for at in (10.0, 11.0, 12.0):
        book.record(ProbeSample(KEY, 0, at, True, 0.002, wall=1_000_000.0 + at))
        verdict = observe_group(rt, KEY, record, [POD], 1, now=1_000_000.0 + at)
        record = plan_group(record, GroupInput(pods, verdict), settings, now=at).record
        dumps.append(dump_records({"decode/0": record}))
    assert record.detection.last_sample is not None  # counted, in memory
    assert dumps[0] == dumps[1] == dumps[2]
    (loaded,) = load_records(
        {"metadata": {"annotations": {ANNOTATION_RECORDS: dumps[-1]}}}
    ).values()
    assert loaded.detection.last_sample is None and loaded.step is Step.HEALTHY
