"""The group assignor's pure parts: a job's placement, and when an assignment is outdated."""

from __future__ import annotations

from assignors.group import ProcessorAssignment, TopicShape, place_job


def test_a_job_s_placement_knows_which_processors_share_partitions_only_among_themselves() -> None:
    # 4 partitions, 6 processors (p0 = 4): processors 0 and 4 split partition 0 by key,
    # 1 and 5 split partition 1; 2 and 3 read theirs whole
    placed = place_job({"t": TopicShape(4, 4)}, 4, 6)
    assert placed.sharers == {("t", 0): (0, 4), ("t", 1): (1, 5)}
    assert placed.shared_only_among((0, 4))
    assert placed.shared_only_among((2,))
    assert not placed.shared_only_among((0, 5))  # 0 shares with 4, 5 with 1
    assert not placed.shared_only_among((1,))


def test_an_assignment_placed_by_an_older_job_or_layout_is_outdated() -> None:
    a = ProcessorAssignment(0, 2, 2, {0: [("t", 0, None)], 1: [("t", 1, None)]}, epochs={"t": 3})
    assert a.outdated(2, {"t": TopicShape(2, 2, epoch=3)}) is None
    assert a.outdated(2, {"t": TopicShape(2, 2, epoch=2)}) is None  # a member behind: not newer
    assert a.outdated(3, {"t": TopicShape(2, 2, epoch=3)}) == "assignment placed 2 processors, the job has 3"
    assert a.outdated(2, {"t": TopicShape(2, 4, epoch=4)}) == "assignment used epoch 3 of t, the layout is at 4"
    assert a.outdated(2, {"u": TopicShape(1, 1, epoch=0)}) == "assignment used epoch None of u, the layout is at 0"
