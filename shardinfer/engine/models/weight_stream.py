"""Checkpoint tensors streamed from safetensors files into the model's device, at file-read speed.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
byte range), then the tensors' bytes. The stream reads those bytes with positional reads (several
threads: a read releases the interpreter lock) and hands out tensors that are views of device
memory; the model's `load_weights` copies each view into its parameter on the device. No tensor
is ever materialised as a host-side torch object, converted, or moved twice.

    file     [len][header][ tensor bytes ............................................ ]
    chunks            [ t0 t1 t2 | t3 | t4 t5 ... ]   whole tensors, up to CHUNK_BYTES each
                                                      (a bigger tensor is a chunk of its own);
                                                      one device buffer per chunk, tensors view it
    pieces            [p0][p1][p2][p3]...             each at most PIECE_BYTES, read in order

On CUDA a piece is read into one of a ring of pinned host buffers and copied to its chunk's device
buffer asynchronously; the next reads proceed meanwhile, and a ring buffer is reused once its copy
has completed. On the host the pieces are read straight into the chunk's buffer. A chunk's tensors
are yielded once all its pieces are read (and, on CUDA, their copies queued on the current stream,
so the consumer's copies on that stream run after them).

A header that does not parse, or byte ranges that do not fit the file, is a CheckpointError
naming the file, raised before any tensor data is read.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from shardinfer.engine.models.loader import check_unique_names, checkpoint_files
from shardinfer.errors import CheckpointError

CHUNK_BYTES = 256 << 20
PIECE_BYTES = 32 << 20
READ_THREADS = 4
_HEADER_LIMIT = 100 << 20  # the safetensors library refuses larger headers too

_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


@dataclass
class _Chunk:
    fd: int
    entries: list[TensorEntry]
    buffer: torch.Tensor | None = None  # [nbytes] uint8 on the target device, allocated at its first read

    @property
    def start(self) -> int:
        return self.entries[0].start

    @property
    def nbytes(self) -> int:
        return self.entries[-1].end - self.start


def _damaged(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"{path} is not a readable safetensors file ({why}); download or convert it again")


def read_header(path: Path) -> list[TensorEntry]:
    """The file's tensors in byte order, checked against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _damaged(path, f"{size} bytes: shorter than the header length field")
        (length,) = struct.unpack("<Q", prefix)
        if length > _HEADER_LIMIT or 8 + length > size:
            raise _damaged(path, f"header length {length} does not fit in its {size} bytes")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _damaged(path, f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise _damaged(path, "header is not a JSON object")
    base = 8 + length
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _damaged(path, f"tensor {name!r} has a bad header entry {info!r}: {exc!r}") from None
        nbytes = math.prod(shape) * dtype.itemsize
        if min(shape, default=0) < 0 or begin < 0 or end - begin != nbytes or base + end > size:
            raise _damaged(
                path,
                f"tensor {name!r}: bytes [{begin}, {end}) do not hold a {info['dtype']} "
                f"{list(shape)} inside the file's {size - base} data bytes",
            )
        entries.append(TensorEntry(name, dtype, shape, base + begin, base + end))
    return sorted(entries, key=lambda e: e.start)


def _chunks(fd: int, entries: list[TensorEntry], chunk_bytes: int) -> list[_Chunk]:
    chunks: list[_Chunk] = []
    for entry in entries:
        last = chunks[-1] if chunks else None
        # A chunk is one run of bytes: a tensor left out of the stream starts a new chunk after it.
        if last is not None and last.entries[-1].end == entry.start and entry.end - last.start <= chunk_bytes:
            last.entries.append(entry)
        else:
            chunks.append(_Chunk(fd, [entry]))
    return chunks


def _view(buffer: torch.Tensor, entry: TensorEntry, chunk_start: int) -> torch.Tensor:
    """The entry's bytes in its chunk's buffer, as a tensor of its dtype and shape."""
    raw = buffer[entry.start - chunk_start : entry.end - chunk_start]
    if (entry.start - chunk_start) % entry.dtype.itemsize:
        raw = raw.clone()  # a byte offset the dtype cannot view in place
    return raw.view(entry.dtype).view(entry.shape)


def _pread_into(fd: int, target: memoryview, offset: int, path: Path) -> None:
    done = 0
    while done < len(target):
        got = os.preadv(fd, [target[done:]], offset + done)
        if got == 0:
            raise _damaged(path, f"ends before byte {offset + len(target)} that its header promised")
        done += got


def stream_checkpoint_tensors(
    model_dir: str | Path,
    device: torch.device,
    chunk_bytes: int = CHUNK_BYTES,
    piece_bytes: int = PIECE_BYTES,
    threads: int = READ_THREADS,
    wanted: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor on `device`) for every tensor of every shard (module docstring), or for
    those whose name `wanted` accepts: the others' bytes are never read."""
    files = checkpoint_files(model_dir)
    headers = [read_header(path) for path in files]  # every header checked before any data is read
    check_unique_names(
        (path, (entry.name for entry in entries)) for path, entries in zip(files, headers, strict=True)
    )
    if wanted is not None:
        headers = [[entry for entry in entries if wanted(entry.name)] for entries in headers]
    fds = [os.open(path, os.O_RDONLY) for path in files]
    try:
        chunks = [
            c for fd, entries in zip(fds, headers, strict=True) for c in _chunks(fd, entries, chunk_bytes)
        ]
        paths = dict(zip(fds, files, strict=True))
        yield from _stream(chunks, paths, device, piece_bytes, max(1, threads))
    finally:
        for fd in fds:
            os.close(fd)


def _stream(
    chunks: list[_Chunk], paths: dict[int, Path], device: torch.device, piece_bytes: int, threads: int
) -> Iterator[tuple[str, torch.Tensor]]:
    staged = device.type == "cuda"
    # (chunk index, offset in chunk, length) of every read, in file order.
    # (chunk index, offset in chunk, length) of every read, in file order; a chunk of empty
    # tensors still gets one (empty) read, which is what yields its tensors.
    pieces = [
        (i, off, min(piece_bytes, c.nbytes - off))
        for i, c in enumerate(chunks)
        for off in range(0, max(c.nbytes, 1), piece_bytes)
    ]
    ring = (
        [torch.empty(piece_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(threads)]
        if staged
        else []
    )
    ring_free: list[torch.cuda.Event | None] = [None] * len(ring)
    pending: deque[Future[None]] = deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="weight-read") as pool:

        def submit(p: int) -> None:
            i, off, n = pieces[p]
            chunk = chunks[i]
            if chunk.buffer is None:
                chunk.buffer = torch.empty(chunk.nbytes, dtype=torch.uint8, device=device)
            if staged:
                slot = p % threads
                event = ring_free[slot]
                if event is not None:
                    event.synchronize()  # the copy out of this buffer has completed
                target = ring[slot].numpy().data[:n]
            else:
                target = chunk.buffer.numpy().data[off : off + n]
            pending.append(pool.submit(_pread_into, chunk.fd, target, chunk.start + off, paths[chunk.fd]))

        ahead = min(threads, len(pieces))
        for p in range(ahead):
            submit(p)
        for p, (i, off, n) in enumerate(pieces):
            pending.popleft().result()
            chunk = chunks[i]
            assert chunk.buffer is not None
            if staged:
                slot = p % threads
                chunk.buffer[off : off + n].copy_(ring[slot][:n], non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                ring_free[slot] = event
            if p + ahead < len(pieces):
                submit(p + ahead)
            if off + n == chunk.nbytes:
                buffer, chunk.buffer = chunk.buffer, None
                for entry in chunk.entries:
                    yield entry.name, _view(buffer, entry, chunk.start)
                del buffer
