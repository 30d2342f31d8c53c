"""The capture's bound shared fairly (`lockstep.core.evidence.fit_capture`): every pod of the
group keeps its rank states, its stacks and its log tail, and the capture says what was
trimmed (first come first served, the first pod's sections filled the cap and the other
pod's rank states were cut)."""

from __future__ import annotations

import json

from lockstep.core.evidence import (
    EVIDENCE_MARK,
    CapturePart,
    EvidenceEntry,
    fair_shares,
    fit_capture,
    split_capture,
)

CAP = 16384


def ranks_json(pod: int, ranks: range) -> str:
    return json.dumps(
        {
            "pod": f"m-decode-0-{pod}",
            "ranks": [
                {"rank": r, "pid": 4000 + r, "alive": True, "process": "sleeping",
                 "iteration": 120, "collective": {"op": "all_reduce", "seq": 9}}
                for r in ranks
            ],
        }
    )  # fmt: skip


def stacks(pod: int, ranks: range) -> str:
    frames = "".join(f"    frame_{i} (sglang/srt/managers/scheduler.py:{i})\n" for i in range(80))
    return "".join(f"rank {r} innermost first\n{frames}" for r in ranks)


def log(pod: int) -> str:
    pad = "scheduler: decode batch, #running-req 8, #token 4096, gen throughput (token/s) 91.2"
    return "".join(f"{pad} pod {pod} log line {i}\n" for i in range(200))


def tp8_over_two_pods() -> list[CapturePart]:
    """A TP8 group over 2 pods of 4 ranks: ~70 KiB of evidence for a 16 KiB cap."""
    parts = []
    for pod in (0, 1):
        ranks = range(4 * pod, 4 * pod + 4)
        name = f"m-decode-0-{pod}"
        parts += [
            CapturePart(name, "ranks", ranks_json(pod, ranks)),
            CapturePart(name, "stacks", stacks(pod, ranks)),
            CapturePart(name, "log", log(pod), inline=False),
        ]
    return parts


def test_every_pod_keeps_its_rank_states_stacks_and_log_tail_within_the_cap() -> None:
    parts = tp8_over_two_pods()
    assert sum(len(p.text) for p in parts) > 4 * CAP
    text = fit_capture(parts, CAP)
    assert len(text) <= CAP
    got = split_capture(text)
    assert [(p.pod, p.kind) for p in got] == [(p.pod, p.kind) for p in parts]
    for pod in (0, 1):
        ranks, stack, tail = got[3 * pod : 3 * pod + 3]
        # Every rank's state, whole (the plugin and the judgement parse it back).
        assert [r["rank"] for r in json.loads(ranks.text)["ranks"]] == list(
            range(4 * pod, 4 * pod + 4)
        )
        # A stack keeps its head (innermost frames first), a log its tail (the last lines).
        assert stack.text.startswith(f"rank {4 * pod} innermost first") and "trimmed]" in stack.text
        assert tail.text.rstrip().endswith(f"pod {pod} log line 199") and tail.text.startswith(
            "[... "
        )
        # Fair: each pod's stacks and log got about the same room.
        assert len(stack.text) > CAP / 8 and len(tail.text) > CAP / 8
    last = text.splitlines()[-1]
    assert last.startswith("[evidence] trimmed to fit 16384 bytes: ")
    for pod in (0, 1):
        assert f"m-decode-0-{pod} stacks -" in last and f"m-decode-0-{pod} log -" in last
    assert "ranks -" not in last


def test_a_capture_within_the_cap_is_kept_as_it_is() -> None:
    parts = [CapturePart("m-decode-0-0", "ranks", ranks_json(0, range(2))),
             CapturePart("m-decode-0-0", "log", "one\ntwo\n", inline=False),
             CapturePart("m-decode-0-1", "log", "unavailable (ApiException)")]  # fmt: skip
    text = fit_capture(parts, CAP)
    assert "trimmed" not in text
    assert split_capture(text) == parts
    assert fit_capture(split_capture(text), CAP) == text


def test_status_fits_the_capture_after_the_summary_keeping_every_pod() -> None:
    """The status view (summary, then the capture) re-shares the room the summary
    leaves: the last pod's rank states are not the part cut."""
    summary = "Desynced: decision sequences differ\n" + "x" * 3000
    entry = EvidenceEntry(verdict=summary, captured=fit_capture(tp8_over_two_pods(), CAP))
    shown = entry.render(CAP)
    assert len(shown) <= CAP
    captured = shown.partition(EVIDENCE_MARK)[2]
    got = split_capture(captured)
    assert [p.kind for p in got if p.pod == "m-decode-0-1"] == ["ranks", "stacks", "log"]
    assert len(json.loads(got[3].text)["ranks"]) == 4


def test_fair_shares_give_what_a_small_one_leaves_to_the_others() -> None:
    assert fair_shares([100, 5000, 5000], 3000) == [100, 1450, 1450]
    assert fair_shares([10, 20], 1000) == [10, 20]
    assert fair_shares([], 100) == []
    assert sum(fair_shares([7, 9, 11, 13], 20)) <= 20


# ------------------------------------------------ the whole capture, when it does not fit


def test_a_capture_over_the_cap_takes_a_free_slot_then_the_oldest_incidents() -> None:
    from lockstep.core.evidence import choose_full_slot

    def held(**slots: str) -> dict[str, EvidenceEntry]:
        return {i: EvidenceEntry(captured="x", full=f"m-evidence-{s}") for i, s in slots.items()}

    order = ["decode-0-1", "decode-0-2", "prefill-0-1"]
    new = "prefill-0-1"
    # A free slot first, in slot order.
    assert choose_full_slot("m", new, {}, order, 3) == ("m-evidence-0", ())
    entries = held(**{"decode-0-1": "1", "decode-0-2": "0"})
    assert choose_full_slot("m", new, entries, order, 3) == ("m-evidence-2", ())
    # All held: the oldest incident's slot, and that incident loses its whole capture.
    assert choose_full_slot("m", new, entries, order, 2) == ("m-evidence-1", ("decode-0-1",))
    # A slot another capture of this round took is not given twice.
    assert choose_full_slot("m", new, entries, order, 2, taken={"m-evidence-1"}) == (
        "m-evidence-0",
        ("decode-0-2",),
    )
    both = {"m-evidence-0", "m-evidence-1"}
    assert choose_full_slot("m", new, entries, order, 2, taken=both) is None
    assert choose_full_slot("m", new, {}, order, 0) is None  # fullCaptures: 0 keeps none
    # An incident captured again keeps its own slot and evicts nobody.
    assert choose_full_slot("m", "decode-0-2", entries, order, 2) == ("m-evidence-0", ())
    # A slot left above a lowered fullCaptures is never given again.
    high = held(**{"decode-0-1": "5"})
    assert choose_full_slot("m", "decode-0-1", high, order, 1) == ("m-evidence-0", ())


def test_a_whole_capture_is_bounded_in_bytes_not_characters() -> None:
    from lockstep.core.evidence import fit_capture_bytes

    wide = [CapturePart("m-decode-0-0", "log", "ünïcødé log line ✓\n" * 4000, inline=False)]
    text = fit_capture_bytes(wide, 20000)
    assert len(text.encode()) <= 20000 < len(fit_capture(wide, 20000).encode())
    assert text.splitlines()[-1].startswith("[evidence] trimmed to fit")


def test_a_whole_capture_not_kept_is_said_after_the_capture_in_status() -> None:
    from lockstep.core.evidence import MISSED_NOTE, from_data, to_data

    captured = fit_capture(tp8_over_two_pods(), CAP)
    entry = EvidenceEntry(verdict="v", captured=captured, full_missed="70000 chars, no free slot")
    shown = entry.render(CAP)
    assert len(shown) <= CAP
    assert shown.endswith(f"\n{MISSED_NOTE}70000 chars, no free slot")
    assert from_data(to_data({"i": entry})) == {"i": entry}


def test_the_status_text_says_where_the_whole_capture_is_and_the_store_keeps_it() -> None:
    from lockstep.core.evidence import FULL_NOTE, from_data, to_data

    captured = fit_capture(tp8_over_two_pods(), CAP)
    entry = EvidenceEntry(verdict="Desynced", captured=captured, full="m-evidence-0")
    shown = entry.render(CAP)
    assert len(shown) <= CAP and shown.endswith(f"\n{FULL_NOTE}m-evidence-0")
    # Every pod's sections still in the fitted text before the note.
    got = split_capture(shown.partition(EVIDENCE_MARK)[2])
    assert [(p.pod, p.kind) for p in got][-3:] == [
        ("m-decode-0-1", "ranks"),
        ("m-decode-0-1", "stacks"),
        ("m-decode-0-1", "log"),
    ]
    assert from_data(to_data({"decode-0-1": entry})) == {"decode-0-1": entry}
    # An entry of an older operator (no `full`) reads back as none.
    assert from_data({"a": json.dumps({"verdict": "v", "captured": "c"})})["a"].full is None
    assert FULL_NOTE not in EvidenceEntry(verdict="v", captured=captured).render(CAP)
