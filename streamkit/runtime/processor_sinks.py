"""A group member's side of its processors' sinks (``streamkit.sinks``): each processor's
outbox while hosted, the claim of its writer when the member takes it, and the rows
written at a checkpoint (step 2c).

A processor's writer is claimed in every sink before the member reads the processor's
state (``TaskManager._open``): a zombie (the worker that had it, paused through the
rebalance) wrote its checkpoint's rows before the claim, and its changelog batch before
them, so its rows are in the state read; or after, and the sink refuses them (it fails
that checkpoint as a zombie's: ``ZombieCheckpointError``). Without the claim, a zombie's
batch could take the number the new owner gives its own next batch, which the sink then
skipped as held: its rows lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from streamkit.runtime.checkpointing import ZombieCheckpointError
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState
from streamkit.sinks.base import Owner, Sink, SinkFencedError
from streamkit.sinks.outbox import SinkOutbox, checkpoint_due, claim_sinks

__all__ = ["ProcessorSinks"]


class ProcessorSinks:
    """See the module docstring. ``app``: the app's name (writers are ``app/processor``)."""

    def __init__(self, app: str, sinks: Mapping[str, Sink], output: Output) -> None:
        self.app, self.sinks, self.output = app, sinks, output
        self._claimed: dict[int, int] = {}
        """Per processor claimed and not hosted yet, the highest number the sinks held."""

    def writer(self, pid: int) -> str:
        return f"{self.app}/{pid}"

    async def claim(self, pid: int, owner: Owner) -> None:
        """Claim processor ``pid``'s writer for ``owner`` (before its state is read)."""
        self._claimed[pid] = await asyncio.to_thread(claim_sinks, self.sinks, self.writer(pid), owner)

    def host(self, proc: ProcessorState, owner: Owner) -> None:
        """``proc``'s outbox, numbered beyond what the sinks hold for its writer."""
        if (floor := self._claimed.pop(proc.id, None)) is None:  # (a processor not taken by ``claim``)
            floor = max(sink.progress(self.writer(proc.id)) for sink in self.sinks.values())
        keys = {name: sink.upsert_key for name, sink in self.sinks.items()}
        keeping = frozenset(name for name, sink in self.sinks.items() if sink.keeps_left_out)
        proc.sink_outbox = SinkOutbox(self.writer(proc.id), proc.loaded.extra, floor, keys, owner, keeping)
        self.output.sink_outboxes[proc.id] = proc.sink_outbox

    def unhost(self, proc: ProcessorState) -> None:
        if proc.sink_outbox is not None and self.output.sink_outboxes.get(proc.id) is proc.sink_outbox:
            del self.output.sink_outboxes[proc.id]
        proc.sink_outbox = None

    def due(self, procs: Iterable[ProcessorState], rows: int) -> bool:
        """Whether the processors' sink rows call for a checkpoint (``checkpoint_due``)."""
        return checkpoint_due((p.sink_outbox for p in procs if p.sink_outbox is not None), rows)

    async def commit_rows(self, procs: Iterable[ProcessorState]) -> None:
        """Step 2c: every processor's rows its store holds and no sink is known to hold go
        to their sinks; a sink's refusal (a newer owner claimed the writer) is a zombie's."""
        for proc in procs:
            if proc.sink_outbox is not None:
                try:
                    await proc.sink_outbox.flush(self.sinks)
                except SinkFencedError as exc:
                    raise ZombieCheckpointError(str(exc)) from None
