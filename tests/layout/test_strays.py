"""Which records a plain producer misplaced: the stray rule over a topic's history (pure)."""

from __future__ import annotations

import zlib

import pytest

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.layout import transitions
from streamkit.layout.strays import (
    BATCH_HASH_FROM,
    SeenStrays,
    activation,
    altered_by,
    in_place_until,
    parse_origin,
    stray_rule,
    sweep_end,
)

HASHES = [key_hash(f"key-{i}".encode()) for i in range(200)]


def test_every_layout_topic_has_a_rule_for_librdkafkas_partitioner_places_keys_elsewhere() -> None:
    """A topic never changed and without capacity: murmur2 modulo the count places keys
    like the layout, CRC32 (librdkafka's default) does not; a plain topic is not checked."""
    assert stray_rule(None, 0) is None
    rule = stray_rule(transitions.create("t", 4, now_ms=0), 1)
    assert rule is not None and stray_rule(transitions.create("t", 4, capacity=8, now_ms=0), 1) is not None
    keys = [f"key-{i}".encode() for i in range(200)]
    assert not any(rule.is_stray(0, key_hash(k)) for k in keys if key_hash(k) % 4 == 1)
    crc_in_1 = [k for k in keys if zlib.crc32(k) % 4 == 1]
    assert any(rule.is_stray(0, key_hash(k)) for k in crc_in_1)
    assert all(rule.is_stray(0, key_hash(k)) == (key_hash(k) % 4 != 1) for k in crc_in_1)


def test_reserved_and_swept_partitions_hold_only_strays() -> None:
    lay = transitions.create("t", 2, capacity=4, now_ms=0)
    reserved = stray_rule(lay, 3)
    assert reserved is not None
    assert all(reserved.is_stray(o, h) for o, h in enumerate(HASHES)) and reserved.is_stray(5, None)
    swept = stray_rule(lay, 3, swept=True)
    assert swept is not None and swept.everything


def test_an_expansion_changes_the_rule_at_its_offsets() -> None:
    """2 -> 3 partitions: partition 2 is created at offset 7 (what lies below is stray);
    partition 0 is split, its old-layout records end at its seal (20); between its
    announce (15) and its seal both layouts are in force."""
    lay = transitions.create("t", 2, capacity=4, now_ms=0)
    lay = transitions.expand(lay, 3, announce_offsets={0: 15, 1: 9, 2: 7}, now_ms=1)
    lay = transitions.seal(lay, {0: 20, 1: 9, 2: 7})
    new, split = stray_rule(lay, 2), stray_rule(lay, 0)
    assert new is not None and split is not None
    for h in HASHES:
        assert new.is_stray(3, h)  # reserved then
        assert new.is_stray(8, h) == (lh_bucket(h, 2, 3) != 2)
        assert split.is_stray(10, h) == (lh_bucket(h, 2, 2) != 0)
        assert split.is_stray(17, h) == (lh_bucket(h, 2, 2) != 0 and lh_bucket(h, 2, 3) != 0)
        assert split.is_stray(25, h) == (lh_bucket(h, 2, 3) != 0)
    assert new.is_stray(3, None) and not new.is_stray(8, None)


def test_where_a_sweep_ended_the_layout_is_in_force_on_the_activated_partition() -> None:
    """Partition 2 activated at offset 7, but the sweep forwarded up to 12 before it
    learnt of the expansion: below 12 every unstamped record is a stray (its copy was
    applied), from 12 the new layout places them. Other partitions are not affected."""
    lay = transitions.create("t", 2, capacity=4, now_ms=0)
    lay = transitions.expand(lay, 3, announce_offsets={0: 15, 1: 9, 2: 7}, now_ms=1)
    lay = transitions.seal(lay, {0: 20, 1: 9, 2: 7})
    assert activation(lay, 2) == 7 and activation(lay, 0) is None and activation(lay, 3) is None
    swept, plain = stray_rule(lay, 2, sweep_ends={7: 12}), stray_rule(lay, 2)
    split = stray_rule(lay, 0, sweep_ends={7: 12})
    assert swept is not None and plain is not None and split is not None
    placed = [h for h in HASHES if lh_bucket(h, 2, 3) == 2]
    assert placed
    for h in placed:
        assert not plain.is_stray(8, h) and swept.is_stray(8, h) and swept.is_stray(11, h)
        assert not swept.is_stray(12, h)
    assert swept.is_stray(8, None) and not swept.is_stray(12, None)
    for h in HASHES:
        assert split.is_stray(25, h) == (lh_bucket(h, 2, 3) != 0)
    records = [_Rec(o, f"key-{i}".encode()) for o, i in zip(range(5, 15), range(10), strict=True)]
    assert [r.offset for r in swept.strays_in(records) if lh_bucket(key_hash(r.key), 2, 3) == 2] == [
        r.offset for r in records if r.offset < 12 and lh_bucket(key_hash(r.key), 2, 3) == 2
    ]


def test_the_first_in_place_reader_after_a_sweep_decides_where_it_ended() -> None:
    lay = transitions.create("t", 2, capacity=4, now_ms=0)
    lay = transitions.seal(transitions.expand(lay, 3, announce_offsets={0: 15, 1: 9, 2: 7}, now_ms=1), {0: 20})
    assert sweep_end(lay, 2, {}, True, 12) == (7, 12)  # the sweep got past the activation
    assert sweep_end(lay, 2, {}, True, 3) == (7, 7)  # it had not reached it: the rest are strays anyway
    assert sweep_end(lay, 2, {7: 10}, True, 12) is None  # decided already: the log's first wins
    assert sweep_end(lay, 2, {}, False, 12) is None  # applied in place up to there: not a sweep's end
    assert sweep_end(lay, 0, {}, True, 12) is None  # never reserved
    assert sweep_end(None, 2, {}, True, 12) is None


class _Rec:
    def __init__(self, offset: int, key: bytes) -> None:
        self.offset, self.key = offset, key


def test_a_drained_partition_holds_strays_after_its_seal() -> None:
    lay = transitions.create("t", 2, capacity=4, now_ms=0)
    lay = transitions.seal(transitions.expand(lay, 3, announce_offsets={0: 0, 1: 0, 2: 0}, now_ms=1), {0: 0, 1: 0})
    lay = transitions.shrink(lay, 2, announce_offsets={0: 4, 1: 4, 2: 10}, now_ms=2)
    lay = transitions.seal(lay, {0: 4, 1: 4, 2: 12})
    drained = stray_rule(lay, 2)
    assert drained is not None
    placed = [h for h in HASHES if lh_bucket(h, 2, 3) == 2]
    assert placed and not any(drained.is_stray(11, h) for h in placed)
    assert all(drained.is_stray(12, h) for h in HASHES) and drained.is_stray(12, None)


def test_an_unsealed_change_keeps_the_old_layout_in_force() -> None:
    lay = transitions.create("t", 2, capacity=4, now_ms=0)
    lay = transitions.expand(lay, 3, announce_offsets={0: 5, 1: 5, 2: 0}, now_ms=1)
    split = stray_rule(lay, 0)
    assert split is not None
    for h in HASHES:
        assert split.is_stray(100, h) == (lh_bucket(h, 2, 2) != 0 and lh_bucket(h, 2, 3) != 0)


def test_origins_and_second_copies() -> None:
    assert parse_origin(b"3:17:0123abcd") == (3, 17)  # what the header claims (its seal: layout.seal)
    assert parse_origin(b"nonsense") is None
    seen = SeenStrays()
    assert seen.first_time("t", 0, (3, 5), 40) and seen.first_time("t", 0, (3, 6), 41)
    assert not seen.first_time("t", 0, (3, 5), 42)
    assert seen.first_time("t", 1, (3, 5), 7)  # another partition it was forwarded to
    # a checkpoint has the copies below its positions only, and keeps them once it is in the store
    assert seen.table_at({("t", 0): 41, ("t", 1): 0}, {}) == {"t:3:0": 5}
    assert seen.table_at({("t", 0): 41, ("t", 1): 0}, {("t", 1): [(6, 7)]}) == {"t:3:0": 5, "t:3:1": 5}  # IC range
    seen.compact({("t", 0): 41, ("t", 1): 0}, {})
    assert seen.table_at({}, {}) == {"t:3:0": 5}
    assert seen.table_at({("t", 0): 42, ("t", 1): 8}, {}) == {"t:3:0": 6, "t:3:1": 5}


@pytest.mark.parametrize("size", [30, 300])
def test_a_batch_is_judged_as_record_by_record(size: int) -> None:
    """``strays_in`` (one modulo per record, per run of offsets under the same layouts)
    finds exactly the records ``is_stray`` finds, across every rule above; with 300
    records the long runs' keys are hashed at once (``BATCH_HASH_FROM``)."""
    from dataclasses import dataclass

    @dataclass
    class Rec:
        offset: int
        key: bytes | None

    base = transitions.create("t", 2, capacity=4, now_ms=0)
    split = transitions.seal(transitions.expand(base, 3, announce_offsets={0: 15, 1: 9, 2: 7}, now_ms=1), {0: 20})
    shrunk = transitions.seal(transitions.expand(base, 3, announce_offsets={0: 0, 1: 0, 2: 0}, now_ms=1), {0: 0})
    shrunk = transitions.seal(transitions.shrink(shrunk, 2, announce_offsets={0: 4, 1: 4, 2: 10}, now_ms=2), {2: 12})
    keys = [f"key-{i}".encode() for i in range(200)]
    batch = [Rec(o, None if o % 17 == 0 else keys[o % len(keys)]) for o in range(size)]
    assert (size - 20 >= BATCH_HASH_FROM) == (size == 300)
    rules = [stray_rule(base, 3), stray_rule(split, 0), stray_rule(split, 2), stray_rule(shrunk, 2)]
    for rule in rules:
        assert rule is not None
        expected = [r for r in batch if rule.is_stray(r.offset, None if r.key is None else key_hash(r.key))]
        assert rule.strays_in(batch) == expected
        assert rule.strays_in(batch[11:23]) == [r for r in expected if 11 <= r.offset < 23]
    assert any(0 < len(rule.strays_in(batch)) < len(batch) for rule in rules if rule is not None)


def test_keys_found_in_place_now_are_remembered_and_only_there() -> None:
    lay = transitions.create("t", 2, capacity=4, now_ms=0)
    lay = transitions.seal(transitions.expand(lay, 3, announce_offsets={0: 15, 1: 9, 2: 7}, now_ms=1), {0: 20})
    rule = stray_rule(lay, 0)
    assert rule is not None
    assert rule.known_in_place(19) is None  # two layouts in force there: not tracked
    known = rule.known_in_place(20)
    assert known == set()
    records = [_Rec(20 + i, f"key-{i}".encode()) for i in range(50)]
    strays = rule.strays_in(records)
    placed = {r.key for r in records if lh_bucket(key_hash(r.key), 2, 3) == 0}
    assert placed and {r.key for r in strays} == {r.key for r in records} - placed
    assert known == placed  # learnt: the strays are not among them
    assert stray_rule(lay, 3, swept=True).known_in_place(100) is None  # type: ignore[union-attr]


def test_a_partition_with_more_keys_than_it_remembers_pauses_learning_them() -> None:
    from streamkit.layout.strays import KNOWN_IN_PLACE, LEARN_AGAIN_AFTER

    rule = stray_rule(transitions.create("t", 1, capacity=1, now_ms=0), 0)  # every key in place
    assert rule is not None
    known = rule.known_in_place(0)
    assert known is not None
    offset = 0

    def read(n: int) -> None:
        nonlocal offset
        assert rule.strays_in([_Rec(offset + i, f"key-{offset + i}".encode()) for i in range(n)]) == []
        offset += n

    read(KNOWN_IN_PLACE + 1)
    assert len(known) == KNOWN_IN_PLACE + 1  # full: the next run forgets them and pauses
    read(1000)
    assert known == set()
    read(LEARN_AGAIN_AFTER - 1000)
    assert known == set()  # a million keys: nothing learnt for a while
    read(1000)
    read(500)
    assert len(known) == 500  # then learnt again


def test_a_catch_up_stops_where_a_reserved_partitions_strays_begin() -> None:
    """4 -> 6 -> 8 over capacity 8: partition 6 is reserved until the second expansion
    activates it at offset 860, so none of its records below is in place and a catch-up
    reads none of them; partition 2, split by the second expansion at its seal (300),
    holds records in place below it; a plain topic and a partition whose history has no
    reserved span are not changed."""
    first = {0: 100, 1: 100, 2: 90, 3: 80, 4: 40, 5: 50, 6: 400, 7: 200}  # every partition's end
    second = {0: 250, 1: 260, 2: 290, 3: 280, 4: 140, 5: 150, 6: 860, 7: 480}
    lay = transitions.create("t", 4, capacity=8, now_ms=0)
    lay = transitions.expand(lay, 6, announce_offsets=first, now_ms=1)
    lay = transitions.seal(lay, {**first, 0: 110, 1: 120})
    lay = transitions.expand(lay, 8, announce_offsets=second, now_ms=2)
    lay = transitions.seal(lay, {**second, 2: 300, 3: 290})
    assert in_place_until(lay, 6, 0, 860) == 0 and in_place_until(lay, 7, 0, 480) == 0
    assert in_place_until(lay, 4, 0, 40) == 0  # reserved until the first expansion
    assert in_place_until(lay, 2, 0, 300) == 300 and in_place_until(lay, 0, 0, 110) == 110
    assert in_place_until(None, 6, 0, 860) == 860


def test_a_partition_given_up_by_a_shrink_and_activated_again_keeps_its_in_place_history() -> None:
    """Partition 4 is read in place until a shrink seals it at 70; given up after its
    drain, plain producers go on writing strays there until an expansion activates it
    again at 200: a catch-up reads up to 70, not into the strays."""
    lay = transitions.create("t", 4, capacity=8, now_ms=0)
    lay = transitions.expand(lay, 5, announce_offsets={0: 10, 4: 0}, now_ms=1)
    lay = transitions.seal(lay, {0: 12, 4: 0})
    lay = transitions.shrink(lay, 4, announce_offsets={0: 60, 4: 65}, now_ms=2)
    lay = transitions.seal(lay, {0: 62, 4: 70})
    lay = transitions.finish_drain(lay, 4, now_ms=3, force=True)
    lay = transitions.expand(lay, 5, announce_offsets={0: 150, 4: 200}, now_ms=4)
    lay = transitions.seal(lay, {0: 160, 4: 200})
    assert in_place_until(lay, 4, 0, 200) == 70 and in_place_until(lay, 4, 30, 200) == 70
    assert in_place_until(lay, 4, 100, 200) == 100  # from inside the strays: nothing


def test_records_between_an_activations_announce_and_its_seal_do_not_hide_the_strays_below() -> None:
    """Records written to partition 6 between the second expansion's announce (860) and
    its seal (870) are in place: the strays below 860 still stop a catch-up at its start."""
    first = {0: 100, 1: 100, 2: 90, 3: 80, 4: 40, 5: 50, 6: 400, 7: 200}
    second = {0: 250, 1: 260, 2: 290, 3: 280, 4: 140, 5: 150, 6: 860, 7: 480}
    lay = transitions.create("t", 4, capacity=8, now_ms=0)
    lay = transitions.expand(lay, 6, announce_offsets=first, now_ms=1)
    lay = transitions.seal(lay, {**first, 0: 110, 1: 120, 4: 45})
    lay = transitions.expand(lay, 8, announce_offsets=second, now_ms=2)
    lay = transitions.seal(lay, {**second, 2: 300, 3: 290, 6: 870, 7: 490})
    assert in_place_until(lay, 6, 0, 870) == 0 and in_place_until(lay, 7, 300, 490) == 300
    assert in_place_until(lay, 4, 0, 45) == 0


def test_an_announced_change_alters_the_partitions_whose_keys_it_moves() -> None:
    """4 -> 6 splits 0 and 1 into 4 and 5: those four are held from the announcement to
    the seal; 2 and 3 keep their keys. A shrink back merges the same ones. Nothing is
    held once the change is sealed, nor for a topic with no change under way."""
    lay = transitions.create("t", 4, capacity=8, now_ms=0)
    assert altered_by(lay) == frozenset()
    lay = transitions.expand(lay, 6, announce_offsets={p: 0 for p in range(8)}, now_ms=1)
    assert altered_by(lay) == {0, 1, 4, 5}
    lay = transitions.seal(lay, {p: 0 for p in range(8)})
    assert altered_by(lay) == frozenset()
    lay = transitions.expand(lay, 7, announce_offsets={p: 0 for p in range(8)}, now_ms=2)
    assert altered_by(lay) == {2, 6}
    lay = transitions.seal(lay, {p: 0 for p in range(8)})
    lay = transitions.shrink(lay, 6, announce_offsets={p: 0 for p in range(8)}, now_ms=3)
    assert altered_by(lay) == {2, 6}
