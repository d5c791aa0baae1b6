"""The stores of processors a shrink retired are deleted once nobody holds them, and so is
a store a restore set aside (``taken_store``) that a crash left behind."""

from __future__ import annotations

from pathlib import Path

from stores.rocksdb import RocksDBStore
from streamkit.runtime.key_sets import delete_retired_stores


def test_retired_stores_and_stores_set_aside_are_deleted_the_hosted_and_held_ones_kept(tmp_path: Path) -> None:
    for pid in range(4):
        RocksDBStore.open(str(tmp_path / f"processor-{pid}"), ["t"]).close()
    RocksDBStore.open(str(tmp_path / "processor-3.behind"), ["t"]).close()
    RocksDBStore.open(str(tmp_path / "processor-1.behind"), ["t"]).close()  # (1 is hosted: its restore's own)
    held = RocksDBStore.open(str(tmp_path / "processor-2"), ["t"])  # another worker on this disk holds it
    try:
        assert delete_retired_stores(tmp_path, 2) == [3]
    finally:
        held.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "processor-0",
        "processor-1",
        "processor-1.behind",
        "processor-2",
    ]
