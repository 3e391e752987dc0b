"""What the split worker needs from the stages around it, as Protocols.

The worker drives any engine that can take requests and step, and commits to any store that can
write a part and create its marker; these classes say exactly which calls that means. The real
ones are `engine.llm_engine.LLMEngine` and `writers.output_store.OutputStore`; tests pass small
fakes that refuse requests or fail commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from shardinfer.engine.outputs import RequestOutput
    from shardinfer.engine.sampling_params import SamplingParams
    from shardinfer.pipeline.rows import Tokenizer
    from shardinfer.splits import Split
    from shardinfer.writers.parts import PartInfo


class Engine(Protocol):
    """A streaming engine: requests in with add_request, finished outputs out of step."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def num_unfinished(self) -> int: ...

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Queue one request; raise ValueError (a ShardinferError carries its row error code) to refuse it."""
        ...

    def step(self) -> list[RequestOutput]: ...

    def abort(self, request_id: str) -> object:
        """Drop a request (the worker does so for every request in flight when it stops)."""
        ...

    def has_unfinished(self) -> bool: ...

    def stats(self) -> Mapping[str, float]: ...


class SplitStore(Protocol):
    """The part of the output store a split worker uses: see what is done, write, commit."""

    def committed_indexes(self) -> set[int]: ...

    def write_part(
        self, split: Split, attempt: str, table: pa.Table, metadata: dict[str, str]
    ) -> PartInfo: ...

    def commit(self, split: Split, part: PartInfo) -> bool:
        """Create the split's marker naming `part` only if absent; True if this call won the split."""
        ...
