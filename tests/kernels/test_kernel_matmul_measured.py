"""The measured tilings of the GPU in use (kernels/matmul_configs/<gpu>.json) on that GPU: a shape
whose tilings change by M must give a row the same bits under each of them, alone or in a batch,
or the engine's rows would depend on their batch. The CPU suite checks the files' declared rules
(test_kernel_matmul.py); this checks the bits the GPU computes."""

from __future__ import annotations

import pytest
import torch

from shardinfer.kernels import matmul as mm


@pytest.mark.gpu
def test_measured_tilings_of_this_gpu_give_a_row_the_same_bits() -> None:
    gpu = torch.cuda.get_device_name(0)
    mm.measured_configs.cache_clear()
    table = mm.measured_configs(gpu)
    if not table:
        pytest.skip(f"no measured tilings for {gpu} in {mm.CONFIG_DIR}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    checked = 0
    for (n, k, dtype), tiling in sorted(table.items(), key=lambda item: item[0][:2]):
        configs = list(dict.fromkeys(tiling.configs))
        if len(configs) < 2:
            continue
        x = torch.randn(300, k, device="cuda", dtype=dtype, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k**0.5
        reference = mm.linear_with_config(x, w, None, configs[0])
        for config in configs:
            batch = mm.linear_with_config(x, w, None, config)
            assert torch.equal(batch, reference), f"N={n} K={k}: {config} against {configs[0]}"
            for start, rows in ((0, 1), (129, 1), (200, 7)):
                alone = mm.linear_with_config(x[start : start + rows], w, None, config)
                assert torch.equal(alone, reference[start : start + rows]), (
                    f"N={n} K={k}: {config}, rows {start}..{start + rows} alone"
                )
        checked += 1
        del x, w, reference
    assert checked > 0, f"no shape of {gpu}'s measured tilings changes tiling by M"
