"""The tiling every kernel family chooses over a grid of problems, as JSON.

Run as a script (`TRITON_INTERPRET=1 python tests/kernels/tuning_choices.py > tests/kernels/tuning_choices.json`)
it writes the fixture that test_tuning.py compares against. The committed fixture was written by
the tile-selection code as it was before the three families shared kernels/tuning.py, so the test
shows that sharing the selection changed no problem's tiling.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any
from unittest import mock

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Matmul shapes: the defaults' boundaries (N 256 / 2048, K 1024) and every shape measured on the H200.
MATMUL_SHAPES = (
    (64, 1024),
    (64, 512),
    (256, 2048),
    (257, 4096),
    (512, 128),
    (2048, 2048),
    (2049, 1024),
    (576, 2048),
    (1024, 2048),
    (1024, 3072),
    (2048, 2816),
    (3072, 2048),
    (4096, 1024),
    (4096, 4096),
    (4096, 12288),
    (5632, 2048),
    (6144, 1024),
    (6144, 4096),
    (24576, 4096),
    (151936, 1024),
    (151936, 4096),
    (163840, 2048),
)
MATMUL_GPUS = (None, "NVIDIA H200")
BATCH_SIZES = (None, 1, 16, 17, 128, 129, 256, 257, 1024, 1025, 65536)
MOE_SHAPES = ((2048, 1408), (7168, 2048), (30, 1408), (1024, 40), (64, 64))
MOE_CAPABILITIES = (None, (8, 0), (9, 0), (10, 0))
ROWS_PER_EXPERT = (0.0, 1.0, 6 / 64, 63.0, 63.99, 64.0, 64.01, 187.5, 10_000.0)
HEADS_SHAPES = ((16, 128, 512), (16, 512, 128), (128, 128, 512), (128, 512, 128), (3, 16, 32))


def choices() -> dict[str, Any]:
    """{"configs": every distinct tiling, once; per family, rows of the problem's fields followed by
    the index of its tiling in "configs"} (indices keep the fixture small)."""
    from shardinfer.kernels import heads_matmul as hm
    from shardinfer.kernels import matmul as mm
    from shardinfer.kernels import moe

    configs: list[dict[str, Any]] = []

    def index(config: Any) -> int:
        plain = {"kind": type(config).__name__, **dataclasses.asdict(config)}
        if plain not in configs:
            configs.append(plain)
        return configs.index(plain)

    matmul, moe_rows, heads = [], [], []
    for n, k in MATMUL_SHAPES:
        for dtype in DTYPES:
            for gpu in MATMUL_GPUS:
                for m in BATCH_SIZES:
                    matmul.append([n, k, str(dtype), gpu, m, index(mm.tile_config(n, k, dtype, gpu, m))])
    for hidden, inter in MOE_SHAPES:
        for dtype in DTYPES:
            for cap in MOE_CAPABILITIES:
                device = None if cap is None else torch.device("cuda", 0)
                with mock.patch.object(moe, "capability", lambda index, cap=cap: cap):
                    for rows in ROWS_PER_EXPERT:
                        tiles = moe.moe_tiles(hidden, inter, dtype, rows, device)
                        moe_rows.append([hidden, inter, str(dtype), cap and list(cap), rows, index(tiles)])
    for h, k, n in HEADS_SHAPES:
        for dtype in DTYPES:
            heads.append([h, k, n, str(dtype), index(hm.heads_tiles(h, k, n, dtype))])
    return {"configs": configs, "matmul": matmul, "moe": moe_rows, "heads_matmul": heads}


if __name__ == "__main__":
    table = choices()
    sys.stdout.write("{\n")
    for i, (key, rows) in enumerate(table.items()):
        body = ",\n".join("  " + json.dumps(row, separators=(",", ":")) for row in rows)
        sys.stdout.write(f"{json.dumps(key)}: [\n{body}\n]{',' if i < len(table) - 1 else ''}\n")
    sys.stdout.write("}\n")
