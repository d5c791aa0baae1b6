"""How every RocksDB store is configured: the base options (raw mode, bloom filters,
small background work) and the memory a process's stores share (:class:`SharedMemory`)."""

from __future__ import annotations

from collections.abc import Callable

from rocksdict import BlockBasedIndexType, BlockBasedOptions, Cache, Options, WriteBufferManager

__all__ = ["BLOOM_BITS_PER_KEY", "Configure", "SharedMemory", "store_options"]

#: A hook that tunes the store's rocksdict ``Options`` (already raw mode).
Configure = Callable[[Options], None]


BLOOM_BITS_PER_KEY = 10
"""A point read of a key the store lacks (a new key: most reads at millions of keys)
costs one filter probe instead of a read of every level: about 1% false positives."""


MEMTABLE_BLOOM_RATIO = 0.1
"""The share of a memtable's size given to its bloom filter."""


MEMTABLE_BYTES_EACH = 2 << 20
"""One memtable's size at most. A checkpoint inserts its dirty keys into a memtable, a
skip list, in no order: each insert walks the list from the top, and in a big one every
step is a miss of the CPU's caches. Measured with a million keys and 50,000 per batch:
1.8 µs per key into 16 MiB memtables, 0.9 µs into 2 MiB ones (reads of missing keys
0.48 and 0.41 µs); the worker's throughput at a million keys rose 9% (median of 4). The
flushes of many small memtables, and their compactions, run on RocksDB's threads."""

MEMTABLES_EACH = 4
"""Memtables a table may hold at once (one being written, the others being flushed): with
small ones, RocksDB's two would stall a checkpoint behind a flush."""


def store_options(configure: Configure | None = None) -> Options:
    """The raw-mode ``Options`` every store (and every SST for it) uses."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    # Many small stores share a 2-core box: keep background work and logs small.
    opts.set_max_background_jobs(2)
    opts.set_keep_log_file_num(2)
    opts.set_max_log_file_size(1 << 20)
    opts.set_block_based_table_factory(_table_options())
    # A point read looks in the memtables first: a bloom filter over their whole keys
    # spares the skip-list search for a key they lack (a new key, or one flushed).
    opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
    opts.set_memtable_whole_key_filtering(True)
    if configure is not None:
        configure(opts)
    return opts


class SharedMemory:
    """RocksDB memory shared by every store of a process, so that it does not grow with
    the number of stores: one block cache (data, index and filter blocks) and one
    write-buffer manager that flushes memtables when all of them together pass
    ``memtable_bytes``. Without it each store, and each of its tables, gets RocksDB's
    defaults: a 64 MiB memtable (two of them while one flushes) and its own block cache.

    Pass it as ``configure`` to :meth:`RocksDBStore.open`."""

    def __init__(self, block_cache_bytes: int = 64 << 20, memtable_bytes: int = 64 << 20) -> None:
        self.block_cache_bytes = block_cache_bytes
        self.memtable_bytes = memtable_bytes
        self.cache = Cache(block_cache_bytes)
        self.write_buffers = WriteBufferManager(memtable_bytes, False)

    def __call__(self, opts: Options) -> None:
        table = _table_options()
        table.set_block_cache(self.cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        # Partitioned index and filters: a point read loads one 4 KiB partition of each,
        # not a whole SST's filter. With whole filters in a bounded cache, 10M keys made
        # every read of a missing key load (and free) megabytes of filter from disk.
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_metadata_block_size(4096)
        table.set_pin_top_level_index_and_filter(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_manager(self.write_buffers)
        opts.set_write_buffer_size(max(1 << 20, min(MEMTABLE_BYTES_EACH, self.memtable_bytes // 4)))
        opts.set_max_write_buffer_number(MEMTABLES_EACH)

    def usage(self) -> tuple[int, int]:
        """Bytes in use: (block cache, memtables)."""
        return self.cache.get_usage(), self.write_buffers.get_usage()


def _table_options() -> BlockBasedOptions:
    table = BlockBasedOptions()
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    return table
