"""Fused MoE kernel against reference_moe.moe_experts; expert alignment; batch invariance."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import TOL, rel_err

from shardinfer.kernels import moe, reference_moe
from shardinfer.kernels.moe import MoeTiles, align_to_experts, fused_moe, padded_slots


def _problem(
    t: int, hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=gen).to(dtype)
    logits = torch.randn(t, experts, generator=gen)
    weights, ids = reference_moe.grouped_topk(logits, None, top_k, renormalize=True)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype)
    w_down = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
    return x, ids, weights, w_gate_up, w_down


def test_align_groups_slots_by_expert() -> None:
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])
    slots, block_expert, positions = align_to_experts(ids, n_experts=4, block_m=4)
    # slot t*k+j: expert 0 has slots 1, 4; expert 1 slot 3; expert 2 slots 0, 2, 5; expert 3 none.
    assert slots.tolist()[:12] == [1, 4, -1, -1, 3, -1, -1, -1, 0, 2, 5, -1]
    assert all(s == -1 for s in slots.tolist()[12:])
    assert block_expert.tolist()[:3] == [0, 1, 2] and all(e == 4 for e in block_expert.tolist()[3:])
    assert positions.tolist() == [8, 0, 9, 4, 1, 10]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference(device: torch.device, dtype: torch.dtype) -> None:
    x, ids, w, wgu, wd = _problem(t=10, hidden=48, inter=24, experts=5, top_k=2, dtype=dtype, seed=1)
    ref = reference_moe.moe_experts(x, ids, w, wgu, wd)
    out = fused_moe(*(a.to(device) for a in (x, ids, w, wgu, wd))).cpu()
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 4 * TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_alone_equals_token_in_batch(device: torch.device, dtype: torch.dtype) -> None:
    # 3 experts, top-2 of 9 tokens: every expert serves several tokens, so a token's slots sit at
    # different rows of its experts' tiles alone (row 0) and in the batch. The interpreter's GEMM
    # path sums over K in order like the GPU's, so both check bits.
    x, ids, w, wgu, wd = _problem(t=9, hidden=32, inter=16, experts=3, top_k=2, dtype=dtype, seed=2)
    args = [a.to(device) for a in (x, ids, w, wgu, wd)]
    full = fused_moe(*args)
    for i in (0, 4, 8):
        alone = fused_moe(args[0][i : i + 1], args[1][i : i + 1], args[2][i : i + 1], args[3], args[4])
        assert torch.equal(alone, full[i : i + 1]), f"token {i}"
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0)).to(device)
    assert torch.equal(fused_moe(args[0][perm], args[1][perm], args[2][perm], args[3], args[4]), full[perm])


@pytest.mark.parametrize(
    "t,k,experts,block_m,scan",
    [
        (1, 1, 1, 16, 0),
        (9, 2, 3, 16, 0),
        (300, 6, 64, 64, 0),
        (90, 8, 256, 16, 0),
        (5, 3, 40, 32, 0),
        (40, 3, 4, 16, 16),
    ],
)
def test_align_matches_reference(
    device: torch.device,
    t: int,
    k: int,
    experts: int,
    block_m: int,
    scan: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # scan=16: each program takes several steps over the 120 slots, and the 192 rows and 12
    # tiles are filled with blanks in strides shared by the 4 programs.
    if scan:
        monkeypatch.setattr(moe, "ALIGN_BLOCK", scan)
    gen = torch.Generator().manual_seed(t + k)
    # Skewed choices, so some experts get several tiles and others none.
    ids = (torch.rand(t, k, generator=gen) ** 3 * experts).long().clamp(max=experts - 1)
    want = reference_moe.align_to_experts(ids, experts, block_m)
    got = align_to_experts(ids.to(device), experts, block_m)
    for name, g, w in zip(got._fields, got, want, strict=True):
        assert torch.equal(g.cpu(), w), name
    got32 = align_to_experts(ids.int().to(device), experts, block_m)
    assert torch.equal(got32.sorted_slots.cpu(), want[0]) and torch.equal(got32.slot_positions.cpu(), want[2])


def test_align_shapes_depend_on_shapes_only() -> None:
    # The grids are sized from these shapes, so a CUDA graph captured for one routing replays
    # correctly for any other: all slots on one expert (the worst padding) or spread out.
    spread = torch.arange(12).view(6, 2) % 5
    piled = torch.full((6, 2), 3)
    a_slots, a_blocks, _ = align_to_experts(spread, n_experts=5, block_m=4)
    b_slots, b_blocks, b_positions = align_to_experts(piled, n_experts=5, block_m=4)
    assert a_slots.shape == b_slots.shape == (padded_slots(12, 5, 4),) == (28,)
    assert a_blocks.shape == b_blocks.shape == (7,)
    assert b_slots.tolist()[:12] == list(range(12)) and b_blocks.tolist() == [3, 3, 3, 5, 5, 5, 5]
    assert b_positions.tolist() == list(range(12))


def test_experts_nobody_chose_and_routing_kernel_ids(device: torch.device) -> None:
    # 8 experts, routing limited to 2 of 4 groups: most experts and tiles are idle; ids come
    # from the routing kernel (int64), as in the model.
    from shardinfer.kernels.moe_routing import grouped_topk

    x, _, _, wgu, wd = _problem(t=5, hidden=16, inter=16, experts=8, top_k=2, dtype=torch.float32, seed=5)
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(6))
    w, ids = grouped_topk(logits.to(device), torch.zeros(8, device=device), 2, n_group=4, topk_group=1)
    ref = reference_moe.moe_experts(x, ids.cpu(), w.cpu(), wgu, wd)
    out = fused_moe(x.to(device), ids, w, wgu.to(device), wd.to(device)).cpu()
    assert rel_err(out, ref) < 1e-5


def test_rejects_bad_inputs(device: torch.device) -> None:
    x, ids, w, wgu, wd = (a.to(device) for a in _problem(4, 16, 8, 2, 1, torch.float32, seed=3))
    with pytest.raises(ValueError, match=r"w_down.shape"):
        fused_moe(x, ids, w, wgu, wd[:, :, :4].contiguous())
    with pytest.raises(ValueError, match=r"w_gate_up.dtype"):
        fused_moe(x, ids, w, wgu.half(), wd)
    with pytest.raises(ValueError, match=r"topk_weights.dtype"):
        fused_moe(x, ids, w.double(), wgu, wd)
    with pytest.raises(ValueError, match=r"topk_ids/topk_weights"):
        fused_moe(x, ids[:2], w[:2], wgu, wd)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [None, MoeTiles(64, 128, 64, 4, 4, tma=True), MoeTiles(16, 128, 128, 4, 4, tma=True)],
    ids=["default", "tma_64x128", "tma_16x128"],
)
def test_moe16b_shapes_bf16(tiles: MoeTiles | None) -> None:
    """Moonlight/moe-16b expert shapes: hidden 2048, moe_intermediate 1408, 64 experts, top-6."""
    dev = torch.device("cuda")
    x, ids, w, wgu, wd = (a.to(dev) for a in _problem(300, 2048, 1408, 64, 6, torch.bfloat16, seed=4))
    ref = reference_moe.moe_experts(x.float(), ids, w, wgu.float(), wd.float())
    out = fused_moe(x, ids, w, wgu, wd, tiles=tiles)
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    for i in (0, 123):
        assert torch.equal(
            fused_moe(x[i : i + 1], ids[i : i + 1], w[i : i + 1], wgu, wd, tiles=tiles), out[i : i + 1]
        )


@pytest.mark.parametrize("group_m", [1, 2, 3])
def test_launch_order_changes_no_value(device: torch.device, group_m: int) -> None:
    # 40 tokens top-3 over 4 experts with 16-row tiles: about 11 row tiles and 3 column blocks
    # (inter 40, block_n 16), so groups of 1-3 tiles include a partial last group.
    x, ids, w, wgu, wd = _problem(t=40, hidden=32, inter=40, experts=4, top_k=3, dtype=torch.float32, seed=11)
    args = [a.to(device) for a in (x, ids, w, wgu, wd)]
    rows_first = fused_moe(*args, tiles=MoeTiles(16, 16, 16, 4, 2))
    grouped = fused_moe(*args, tiles=MoeTiles(16, 16, 16, 4, 2, group_m=group_m))
    assert torch.equal(grouped, rows_first)
    assert rel_err(grouped.cpu(), reference_moe.moe_experts(x, ids, w, wgu, wd)) < 1e-5
    with pytest.raises(ValueError, match=r"MoeTiles\.group_m"):
        MoeTiles(group_m=-1)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [
        MoeTiles(64, 64, 64, 4, 3, group_m=8),
        MoeTiles(128, 128, 64, 8, 3, group_m=8),
        MoeTiles(128, 128, 64, 8, 4, group_m=8),
        MoeTiles(64, 128, 64, 4, 3, group_m=8),
        moe.HOPPER_SMALL_TILES,
        moe.HOPPER_LARGE_TILES,
        MoeTiles(128, 128, 64, 8, 3, tma_rows=True, down_block_n=256, down_num_stages=2),
    ],
    ids=[
        "64x64_g8",
        "128x128_g8",
        "128x128_s4_g8",
        "64x128_g8",
        "hopper_small",
        "hopper_large",
        "128x128_rows_down256",
    ],
)
def test_wgmma_tilings_compute_the_default_bits(tiles: MoeTiles) -> None:
    """Tilings whose MMAs all run on wgmma with the same K step give every (token, slot) row the
    default tiling's bits, whether operands arrive by pointer loads or TMA; only such a tiling
    may serve other batch sizes than the default."""
    dev = torch.device("cuda")
    x, ids, w, wgu, wd = (a.to(dev) for a in _problem(1000, 2048, 1408, 64, 6, torch.bfloat16, seed=12))
    want = fused_moe(x, ids, w, wgu, wd, tiles=moe.DEFAULT_TILES)
    assert torch.equal(fused_moe(x, ids, w, wgu, wd, tiles=tiles), want)


@pytest.mark.gpu
def test_prefill_batch_tiles_keep_a_tokens_bits() -> None:
    """2000 tokens top-6 over 64 experts (about 190 rows per expert) run on the large tiles; each
    token alone runs on the small ones: the same bits either way."""
    dev = torch.device("cuda")
    x, ids, w, wgu, wd = (a.to(dev) for a in _problem(2000, 2048, 1408, 64, 6, torch.bfloat16, seed=13))
    if torch.cuda.get_device_capability(dev) == (9, 0):
        assert moe.moe_tiles(2048, 1408, torch.bfloat16, 2000 * 6 / 64, dev) == moe.HOPPER_LARGE_TILES
        assert moe.moe_tiles(2048, 1408, torch.bfloat16, 6 / 64, dev) == moe.HOPPER_SMALL_TILES
    out = fused_moe(x, ids, w, wgu, wd)
    for i in (0, 999, 1999):
        assert torch.equal(fused_moe(x[i : i + 1], ids[i : i + 1], w[i : i + 1], wgu, wd), out[i : i + 1]), (
            f"token {i}"
        )


def test_tiling_by_batch_size_only_where_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert moe.moe_tiles(2048, 1408, torch.bfloat16, 10_000.0, cpu) == moe.DEFAULT_TILES
    assert moe.moe_tiles(2048, 1408, torch.bfloat16, 10_000.0) == moe.DEFAULT_TILES
    gpu = torch.device("cuda", 0)
    for cap, rows, want in (
        ((9, 0), 10_000.0, moe.HOPPER_LARGE_TILES),
        ((9, 0), 1.0, moe.HOPPER_SMALL_TILES),
        ((8, 0), 10_000.0, moe.DEFAULT_TILES),
        ((10, 0), 1.0, moe.DEFAULT_TILES),
    ):
        monkeypatch.setattr(moe, "capability", lambda index, cap=cap: cap)
        assert moe.moe_tiles(2048, 1408, torch.bfloat16, rows, gpu) == want, (cap, rows)
        # 60-byte rows (hidden 30 in bf16) cannot be TMA tiles: the pointer tiling serves them.
        assert moe.moe_tiles(30, 1408, torch.bfloat16, rows, gpu) == moe.DEFAULT_TILES


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sorted_rows_through_tma_and_own_down_tiles(device: torch.device, dtype: torch.dtype) -> None:
    # The down GEMM reads its input rows as whole tiles through TMA (inter=40 with block_k=32: the
    # last K tile of each row is zero-filled past the row's end) on its own column block, warps
    # and stages. The interpreter sums each K step in order, like wgmma on the GPU, so the bits
    # must equal those of the tiling without either (numpy's sums depend on the weight tile's
    # memory layout, which TMA weight tiles change here, so both keep tma=True).
    x, ids, w, wgu, wd = _problem(t=11, hidden=48, inter=40, experts=4, top_k=3, dtype=dtype, seed=14)
    args = [a.to(device) for a in (x, ids, w, wgu, wd)]
    tiles = MoeTiles(
        16, 32, 32, 4, 2, tma=True, tma_rows=True, down_block_n=16, down_num_warps=2, down_num_stages=3
    )
    out = fused_moe(*args, tiles=tiles)
    ref = reference_moe.moe_experts(x.float(), ids, w, wgu.float(), wd.float())
    assert rel_err(out.cpu().float(), ref) < (1e-5 if dtype == torch.float32 else 4 * TOL[dtype])
    assert torch.equal(out, fused_moe(*args, tiles=MoeTiles(16, 32, 32, 4, 2, tma=True)))
    with pytest.raises(ValueError, match=r"MoeTiles\.down_block_n"):
        MoeTiles(down_block_n=24)
    with pytest.raises(ValueError, match=r"MoeTiles\.down_num_warps"):
        MoeTiles(down_num_warps=-1)


def test_chosen_tma_tiling_falls_back_for_weights_at_an_unaddressable_offset(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Expert weights 4 bytes into their storage (say, a view into a fused tensor): a TMA tiling
    # the launcher chose itself gives way to the pointer tiling instead of refusing the call; one
    # asked for by name is refused, naming the fix.
    x, ids, w, wgu, wd = _problem(t=6, hidden=16, inter=16, experts=3, top_k=2, dtype=torch.float32, seed=16)
    args = [a.to(device) for a in (x, ids, w)]
    offset = [torch.empty(t.numel() + 1, device=device)[1:].view(t.shape).copy_(t) for t in (wgu, wd)]
    assert offset[0].data_ptr() % 16 and offset[0].is_contiguous()
    tma = MoeTiles(16, 16, 16, 4, 2, tma=True)
    monkeypatch.setattr(moe, "moe_tiles", lambda *a, **k: tma)
    out = fused_moe(*args, *offset)
    assert rel_err(out.cpu(), reference_moe.moe_experts(x, ids, w, wgu, wd)) < 1e-5
    with pytest.raises(ValueError, match=r"expert weight.*tma=False"):
        fused_moe(*args, *offset, tiles=tma)


def test_tma_rows_refuses_rows_the_copy_engine_cannot_address(device: torch.device) -> None:
    # inter 6 in float32: 24-byte activation rows, not a multiple of 16 bytes.
    x, ids, w, wgu, wd = _problem(t=3, hidden=16, inter=6, experts=2, top_k=1, dtype=torch.float32, seed=15)
    with pytest.raises(ValueError, match=r"activation rows.*tma_rows=False"):
        fused_moe(
            *(a.to(device) for a in (x, ids, w, wgu, wd)), tiles=MoeTiles(16, 16, 16, 4, 2, tma_rows=True)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tma_weights_match_reference_and_stay_invariant(device: torch.device, dtype: torch.dtype) -> None:
    # inter=40 with block_n=32 leaves a partial last column block, whose TMA tile reads past the
    # expert's gate rows into its up rows (and past the last expert into zero fill): those
    # columns must be dropped at the store. hidden=48 leaves a partial K tile (zero-filled).
    x, ids, w, wgu, wd = _problem(t=7, hidden=48, inter=40, experts=4, top_k=3, dtype=dtype, seed=8)
    tiles = MoeTiles(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=2, tma=True)
    args = [a.to(device) for a in (x, ids, w, wgu, wd)]
    out = fused_moe(*args, tiles=tiles)
    ref = reference_moe.moe_experts(x.float(), ids, w, wgu.float(), wd.float())
    assert rel_err(out.cpu().float(), ref) < (1e-5 if dtype == torch.float32 else 4 * TOL[dtype])
    for i in (0, 6):
        alone = fused_moe(
            args[0][i : i + 1], args[1][i : i + 1], args[2][i : i + 1], args[3], args[4], tiles=tiles
        )
        assert torch.equal(alone, out[i : i + 1]), f"token {i}"


def test_tma_refuses_rows_the_copy_engine_cannot_address(device: torch.device) -> None:
    # hidden 30 in float32: 120-byte weight rows, not a multiple of 16 bytes.
    x, ids, w, wgu, wd = _problem(t=3, hidden=30, inter=16, experts=2, top_k=1, dtype=torch.float32, seed=9)
    with pytest.raises(ValueError, match="tma=False"):
        fused_moe(*(a.to(device) for a in (x, ids, w, wgu, wd)), tiles=MoeTiles(16, 16, 16, 4, 2, tma=True))


def test_other_tiling_matches_reference_and_bad_tiling_is_refused(device: torch.device) -> None:
    x, ids, w, wgu, wd = _problem(t=7, hidden=48, inter=40, experts=4, top_k=3, dtype=torch.float32, seed=8)
    ref = reference_moe.moe_experts(x, ids, w, wgu, wd)
    tiles = MoeTiles(block_m=16, block_n=32, block_k=16, num_warps=2, num_stages=2)
    out = fused_moe(*(a.to(device) for a in (x, ids, w, wgu, wd)), tiles=tiles).cpu()
    assert rel_err(out, ref) < 1e-5
    with pytest.raises(ValueError, match=r"MoeTiles\.block_k"):
        MoeTiles(block_k=24)
