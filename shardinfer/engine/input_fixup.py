"""A step's inputs that are not known on the host when it is launched (asynchronous scheduling).

The engine plans step N+1 before it has read step N back, so some of N+1's inputs exist only on
the device when N+1 is queued:

  tokens      the token N sampled for a request (its placeholder in the host copy);
  shifts      with speculative decoding, how many of N's draft tokens the verification
              rejected. The host lays N+1 out as if every draft were accepted; each rejected
              draft moves the request's N+1 tokens one position back, so their positions, KV
              slots, sequence lengths and sampling positions are corrected on the device;
  drafts      N+1's draft tokens where they depend on N's outcome: the MTP layer's proposal
              (computed on the device from N's hidden states) or, for a host drafter, the row
              of its proposals that matches the shift (`DraftChoice`).

`InputFixup.apply` does these corrections with a few small device operations before the
forward (or before a CUDA graph's replay), without any host-device synchronisation.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn.functional as F

from shardinfer.engine.device_copy import values_to_device


@dataclass
class PreviousStep:
    """What step N left on the device for step N+1, per request of N (in N's sampling order)."""

    sampled: torch.Tensor  # [S] int64 sampled tokens
    first_rows: list[int]  # per request: its first sampling row
    last_rows: torch.Tensor | None = None  # per request: row of its newest accepted token (None: first_rows)
    shifts: torch.Tensor | None = None  # per request: rejected drafts (None: no request drafted)
    mtp_drafts: torch.Tensor | None = None  # [P, D] the MTP layer's next drafts per request, or None


@dataclass
class DraftChoice:
    """Host drafts that depend on how many of the previous step's drafts are rejected: request q
    offers table[q, r] when r of its drafts were rejected (row 0 for every r when it does not care)."""

    table: list[list[list[int]]]  # [Q][R][K]
    rows: list[int] = field(default_factory=list)  # flat input rows that take a draft
    entries: list[tuple[int, int, int]] = field(
        default_factory=list
    )  # per row: (q, draft j, previous index or -1)


@dataclass
class InputFixup:
    previous: PreviousStep
    token_rows: list[int]  # flat input rows that take a previous step's newest token
    token_prev: list[int]  # per such row: the request's index in the previous step
    # Per flat input token / batch request / sampling row: the previous step's request index, -1: none.
    token_shift_of: list[int] = field(default_factory=list)
    request_shift_of: list[int] = field(default_factory=list)
    sample_shift_of: list[int] = field(default_factory=list)
    token_owner: list[int] = field(default_factory=list)  # per flat input token: its batch request
    mtp_rows: list[int] = field(default_factory=list)  # flat input rows taking the MTP draft
    mtp_prev: list[int] = field(default_factory=list)
    mtp_cols: list[int] = field(default_factory=list)  # which of the request's MTP drafts
    choice: DraftChoice | None = None

    def spread(self, rows: list[int], total: int, width: int) -> InputFixup:
        """This fixup for the step's inputs laid out `width` rows per request (cuda_graphs.pad_to_width):
        flat input row k moves to rows[k]; the padding rows (total in all) belong to their slot's
        request and are never shifted, so their KV store stays skipped."""
        choice = self.choice
        moved = dataclasses.replace(
            self,
            token_rows=[rows[k] for k in self.token_rows],
            mtp_rows=[rows[k] for k in self.mtp_rows],
            choice=None
            if choice is None
            else dataclasses.replace(choice, rows=[rows[k] for k in choice.rows]),
        )
        if self.token_shift_of:
            shift_of, owner = [-1] * total, [r // width for r in range(total)]
            for k, row in enumerate(rows):
                shift_of[row] = self.token_shift_of[k]
                owner[row] = self.token_owner[k]
            moved.token_shift_of, moved.token_owner = shift_of, owner
        return moved

    @cached_property
    def shifted(self) -> bool:
        return self.previous.shifts is not None and any(i >= 0 for i in self.request_shift_of)

    def _packed(self) -> tuple[dict[str, list[int]], dict[str, int]]:
        """Every host-side index list apply() needs, by name (sent to the device in one copy), and
        the parts of "shift_of", which gathers every shift apply() reads in one lookup: by name
        ("token", "request", "sample" rows when shifted, "choice" rows of the draft choices), in
        order, how many rows each."""
        prev = self.previous
        lists: dict[str, list[int]] = {}
        if self.token_rows:
            lists["token_rows"] = self.token_rows
            lists["token_src"] = (
                self.token_prev
                if prev.last_rows is not None
                else [prev.first_rows[i] for i in self.token_prev]
            )
        if self.mtp_rows:
            assert prev.mtp_drafts is not None
            width = prev.mtp_drafts.shape[1]
            lists["mtp_rows"] = self.mtp_rows
            lists["mtp_flat"] = [p * width + c for p, c in zip(self.mtp_prev, self.mtp_cols, strict=True)]
        shift_of: list[int] = []
        parts: dict[str, int] = {}
        if self.shifted:
            lists["token_owner"] = self.token_owner
            shift_of = self.token_shift_of + self.request_shift_of + self.sample_shift_of
            parts = {
                "token": len(self.token_shift_of),
                "request": len(self.request_shift_of),
                "sample": len(self.sample_shift_of),
            }
        choice = self.choice
        if choice is not None and choice.rows:
            r_max = max(len(t) for t in choice.table)
            k_max = max((len(row) for t in choice.table for row in t), default=0)
            table: list[int] = []
            for t in choice.table:  # [Q, R, K], padded by repeating the last row / token 0
                for r in range(r_max):
                    row = t[min(r, len(t) - 1)]
                    table.extend(row + [0] * (k_max - len(row)))
            lists["choice_table"] = table
            lists["choice_base"] = [q * r_max * k_max + j for q, j, _ in choice.entries]
            lists["choice_rows"] = choice.rows
            lists["choice_dims"] = [r_max, k_max]
            if prev.shifts is not None and r_max > 1:
                shift_of = shift_of + [p for _, _, p in choice.entries]
                parts["choice"] = len(choice.entries)
        if shift_of:
            lists["shift_of"] = shift_of
        return lists, parts

    def apply(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        slot_mapping: torch.Tensor | None = None,
        block_tables: torch.Tensor | None = None,
        block_size: int = 0,
    ) -> torch.Tensor | None:
        """Correct the step's flat inputs in place (the first len(token_shift_of) rows are real).
        All index lists travel to the device in one copy, and every shift is read in one gather.
        Returns, per sampling row of the step, how far its position moves back (what sampling's
        noise must be drawn at; known only on the device), or None where nothing moves."""
        prev = self.previous
        lists, parts = self._packed()
        if not lists:
            return None
        data = values_to_device(
            list(itertools.chain.from_iterable(lists.values())), torch.long, input_ids.device
        )
        view = dict(zip(lists, data.split([len(v) for v in lists.values()]), strict=True))
        shifts: dict[str, torch.Tensor] = {}
        if parts:
            assert prev.shifts is not None
            # -1 (a row whose request had no drafts) reads the appended 0.
            gathered = F.pad(prev.shifts, (0, 1))[view["shift_of"]]
            shifts = dict(zip(parts, gathered.split(list(parts.values())), strict=True))
        if self.token_rows:
            src = view["token_src"] if prev.last_rows is None else prev.last_rows[view["token_src"]]
            input_ids[view["token_rows"]] = _as(prev.sampled[src], input_ids.dtype)
        if self.mtp_rows:
            assert prev.mtp_drafts is not None
            drafts = prev.mtp_drafts.reshape(-1)[view["mtp_flat"]]
            input_ids[view["mtp_rows"]] = _as(drafts, input_ids.dtype)
        if "choice_rows" in view:
            r_max, k_max = lists["choice_dims"]
            index = view["choice_base"]
            if "choice" in shifts:
                index = index + shifts["choice"].clamp(max=r_max - 1) * k_max
            input_ids[view["choice_rows"]] = _as(view["choice_table"][index], input_ids.dtype)
        if not self.shifted:
            return None
        shift = shifts["token"]
        sample_shift = shifts["sample"] if self.sample_shift_of else None
        if positions is None:
            return sample_shift
        assert seq_lens is not None and slot_mapping is not None and block_tables is not None
        n = len(self.token_shift_of)
        positions[:n] -= shift
        seq_lens[: len(self.request_shift_of)] -= shifts["request"].to(seq_lens.dtype)
        # A shifted token's KV goes to the slot of its corrected position.
        pos = positions[:n]
        block = block_tables[view["token_owner"], pos // block_size].to(torch.int64)
        moved = block * block_size + pos % block_size
        slot_mapping[:n] = torch.where(shift > 0, moved, slot_mapping[:n])
        return sample_shift


def _as(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values in dtype, without a conversion (and its launch) where it has it already."""
    return values if values.dtype == dtype else values.to(dtype)
