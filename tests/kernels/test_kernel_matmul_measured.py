"""The measured tilings of the GPU in use, on that GPU: a shape whose tilings change by M must give
a row the same bits under each of them, alone or in a batch, or the engine's rows would depend on
their batch. The bf16 GEMM's (kernels/matmul_configs/<gpu>.json) agree among themselves; the FP8
GEMM's (kernels/fp8_matmul_configs/<gpu>.json) also with the default tiling's, as their writer
chose them. The CPU suite checks the files' declared rules (test_kernel_matmul.py,
test_kernel_fp8_measured.py); this checks the bits the GPU computes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch

from shardinfer.kernels import fp8_matmul
from shardinfer.kernels import matmul as mm
from shardinfer.kernels.reference_fp8 import quantize_blocks

# One problem: (its input, its tilings, the reference rows of the input, run(x, config)).
Problem = tuple[torch.Tensor, list, torch.Tensor, Callable[[torch.Tensor, object], torch.Tensor]]


def _check_rows(problems: Iterable[Problem]) -> int:
    """Each tiling gives every row the reference's bits, in the whole batch and alone; returns the
    number of problems checked."""
    checked = 0
    for x, configs, reference, run in problems:
        n, k = reference.shape[1], x.shape[1]
        for config in configs:
            assert torch.equal(run(x, config), reference), f"N={n} K={k}: {config}"
            for start, rows in ((0, 1), (129, 1), (200, 7)):
                alone = run(x[start : start + rows], config)
                assert torch.equal(alone, reference[start : start + rows]), (
                    f"N={n} K={k}: {config}, rows {start}"
                )
        checked += 1
    return checked


def _rows(k: int, dtype: torch.dtype) -> torch.Tensor:
    """300 rows of K channels."""
    return torch.randn(300, k, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(k))


def _measured(kernel: Any) -> dict:
    """The kernel module's measured tilings for this GPU, read afresh; skips where it has none."""
    gpu = torch.cuda.get_device_name(0)
    kernel.measured_configs.cache_clear()
    table = kernel.measured_configs(gpu)
    if not table:
        pytest.skip(f"no measured tilings for {gpu} in {kernel.CONFIG_DIR}")
    return table


@pytest.mark.gpu
def test_measured_tilings_of_this_gpu_give_a_row_the_same_bits() -> None:
    table = _measured(mm)

    def problems() -> Iterable[Problem]:
        for (n, k, dtype), tiling in sorted(table.items(), key=lambda item: item[0][:2]):
            configs = list(dict.fromkeys(tiling.configs))
            if len(configs) < 2:
                continue
            x, w = _rows(k, dtype), torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
            run = lambda x, c, w=w: mm.linear_with_config(x, w, None, c)  # noqa: E731
            yield x, configs, run(x, configs[0]), run

    assert _check_rows(problems()) > 0, "no shape of this GPU's measured tilings changes tiling by M"


@pytest.mark.gpu
def test_measured_fp8_tilings_of_this_gpu_give_the_default_bits() -> None:
    table = _measured(fp8_matmul)

    def problems() -> Iterable[Problem]:
        for (n, k), tiling in sorted(table.items()):
            x, (wq, ws) = _rows(k, torch.bfloat16), quantize_blocks(torch.randn(n, k, device="cuda") / k**0.5)
            run = lambda x, c, wq=wq, ws=ws: fp8_matmul.linear_fp8(x, wq, ws, config=c)  # noqa: E731
            default = fp8_matmul.tile_config(n, k, 300)  # no GPU name: the default tiling
            yield x, list(dict.fromkeys(tiling.configs)), run(x, default), run

    assert _check_rows(problems()) == len(table)
