"""The position rules of a backfill (pure logic, against a given view of the cluster)."""

from __future__ import annotations

import pytest

from streamkit.errors import ConfigError
from streamkit.spark.preflight import ClusterView, TopicView, check_final_positions, check_given_positions

VIEW = ClusterView(
    "127.0.0.1:1",
    {
        "t": TopicView(
            "t",
            physical=6,
            read=(0, 1, 2, 3),
            high_watermarks={0: 10, 1: 20, 2: 0, 3: 5, 4: 0, 5: 0},
            n0=4,
            active=4,
            epoch=1,
        )
    },  # fmt: skip
)


def test_given_positions_cover_every_read_partition_and_fit_the_log() -> None:
    full = {("t", 0): 10, ("t", 1): 20, ("t", 3): 5}
    assert check_given_positions(full, VIEW, ["t"], from_start=False, derive=False) == {**full, ("t", 2): 0}
    with pytest.raises(ConfigError, match=r"no position for 2 partition\(s\): t:1 \(high watermark 20\), t:3"):
        check_given_positions({("t", 0): 10}, VIEW, ["t"], from_start=False, derive=False)
    with pytest.raises(ConfigError, match=r"t:1=21 is beyond the partition's end \(high watermark 20\)"):
        check_given_positions({**full, ("t", 1): 21}, VIEW, ["t"], from_start=False, derive=False)
    with pytest.raises(ConfigError, match="t has no partition 9"):
        check_given_positions({**full, ("t", 9): 1}, VIEW, ["t"], from_start=False, derive=False)
    with pytest.raises(ConfigError, match="does not read partition 4"):
        check_given_positions({**full, ("t", 4): 0}, VIEW, ["t"], from_start=False, derive=False)
    with pytest.raises(ConfigError, match="from_start=True says none"):
        check_given_positions(full, VIEW, ["t"], from_start=True, derive=False)
    # an offset column gives the others (checked once the history has been read)
    assert check_given_positions({}, VIEW, ["t"], from_start=False, derive=True) == {("t", 2): 0}


def test_final_positions_agree_with_the_offset_column() -> None:
    given = {("t", 2): 0}
    derived = {("t", 0): 9, ("t", 1): 19, ("t", 3): 4}
    assert check_final_positions(given, derived, VIEW, ["t"], from_start=False) == {
        ("t", 0): 10, ("t", 1): 20, ("t", 2): 0, ("t", 3): 5}  # fmt: skip
    with pytest.raises(ConfigError, match=r"t:0: the history holds offset 9 but the position given is 7: records 7..9"):
        check_final_positions({("t", 0): 7}, derived, VIEW, ["t"], from_start=False)
    with pytest.raises(
        ConfigError,
        match=r"t:0: the history ends at offset 9 but the position given is 12: records 10..11 are in neither",
    ):
        check_final_positions({("t", 0): 12}, derived, VIEW, ["t"], from_start=False)
    with pytest.raises(ConfigError, match=r"t:3: the history holds offset 7 but the partition ends at 5"):
        check_final_positions({}, {**derived, ("t", 3): 7}, VIEW, ["t"], from_start=False)
    with pytest.raises(ConfigError, match=r"no position for 1 partition\(s\): t:1 \(high watermark 20\)"):
        check_final_positions({}, {("t", 0): 9, ("t", 3): 4}, VIEW, ["t"], from_start=False)
