"""Block tables kept on the device: one persistent int64 tensor whose rows are sequences' tables,
updated where they change.

A `BlockManager` records every change to a table it manages (`TableChanges`: allocation, new blocks,
a trimmed tail, blocks released out of a sliding window, free and swap-out) once a `DeviceBlockTables`
follows it. Before a step's metadata is built, `sync` writes the changed entries into their rows in
one host-to-device copy (pinned, asynchronous on CUDA) and one `index_copy_`: the traffic of a step is
the entries that changed (a decode step: the blocks it allocated), not every table of the batch. A
sequence gets a row when its table first changes and gives it back when its table is emptied
(finish, abort, preemption by recompute or swap). `gather` then reads the batch's tables as one
index_select of their rows, on the device.

A row holds its sequence's table in its first len(table) entries (OUT_OF_WINDOW as block 0: the
attention never reads it); the entries past that are block ids of earlier tables, never read, since
the attention reads a row only up to its context length.
"""

from __future__ import annotations

import array

import torch

from engine.block_manager import BlockManager, TableChanges
from engine.device import host_to_device
from engine.request import Sequence


class DeviceBlockTables:
    def __init__(self, max_blocks: int, device: torch.device, rows: int = 8):
        self.device = device
        self.tensor = torch.zeros(max(rows, 1), max(max_blocks, 1), dtype=torch.int64, device=device)
        self.changes = TableChanges()
        self.table_name = "block_table"
        self.rows: dict[int, tuple[Sequence, int]] = {}  # id(seq) -> (seq, its row)
        self._free_rows = list(range(self.tensor.shape[0] - 1, -1, -1))  # a stack: low rows first
        self.entries_written = 0  # table entries copied host to device, in all
        self.last_written = 0  # ... by the last sync

    def follow(self, manager: BlockManager) -> None:
        """Keep the tables of `manager`'s sequences (it records their changes here from now on)."""
        manager.changes = self.changes
        self.table_name = manager.table_name

    def table(self, seq: Sequence) -> list[int]:
        table: list[int] = getattr(seq, self.table_name)
        return table

    def row(self, seq: Sequence) -> int:
        entry = self.rows.get(id(seq))
        if entry is None:
            raise KeyError(f"{seq.request_id} has no block-table row (its block manager is not followed)")
        return entry[1]

    def sync(self) -> None:
        """Write every table entry changed since the last sync into its row."""
        self.last_written = 0
        if not self.changes:
            return
        changed = list(self.changes.values())
        self.changes.clear()
        for seq, _ in changed:  # emptied tables give their rows back before any is handed out
            if not self.table(seq):
                entry = self.rows.pop(id(seq), None)
                if entry is not None:
                    self._free_rows.append(entry[1])
        width = max(len(self.table(seq)) for seq, _ in changed)
        if width > self.tensor.shape[1]:  # before any flat index is taken at the old width
            self._grow(self.tensor.shape[0], max(width, 2 * self.tensor.shape[1]))
        index, values = array.array("q"), array.array("q")
        for seq, first in changed:
            table = self.table(seq)
            if not table:
                continue
            entry = self.rows.get(id(seq))
            if entry is None:
                if not self._free_rows:
                    self._grow(2 * self.tensor.shape[0], self.tensor.shape[1])
                entry = self.rows[id(seq)] = (seq, self._free_rows.pop())
                first = 0
            base = entry[1] * self.tensor.shape[1]
            index.extend(range(base + first, base + len(table)))
            values.extend(table[first:])
        if not index:
            return
        n = len(index)
        host = torch.frombuffer(index + values, dtype=torch.int64).view(2, n)
        host[1].clamp_(min=0)  # OUT_OF_WINDOW -> block 0
        moved = host_to_device(host, self.device)  # one copy: indices and values together
        self.tensor.view(-1).index_copy_(0, moved[0], moved[1])
        self.last_written = n
        self.entries_written += n

    def gather(self, seqs: list[Sequence], width: int) -> torch.Tensor:
        """[len(seqs), width] the first `width` entries of each sequence's row, on the device."""
        if width > self.tensor.shape[1]:
            self._grow(self.tensor.shape[0], width)
        index = host_to_device(torch.tensor([self.row(seq) for seq in seqs]), self.device)
        return self.tensor[:, :width].index_select(0, index)

    def _grow(self, rows: int, cols: int) -> None:
        old = self.tensor
        self.tensor = torch.zeros(rows, cols, dtype=torch.int64, device=self.device)
        self.tensor[: old.shape[0], : old.shape[1]] = old
        self._free_rows = list(range(rows - 1, old.shape[0] - 1, -1)) + self._free_rows
