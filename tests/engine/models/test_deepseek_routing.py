"""Group-limited sigmoid routing and the expert computation against independent float64 code.

The reference below is written from the official DeepSeek-V3 gate's definition, one token at a
time in Python: sigmoid scores; bias added for choosing only; group score = sum of the group's two
best biased scores; the topk_group best groups stay eligible, the others are excluded (-inf);
weights = unbiased scores of the chosen experts, normalised, times routed_scaling_factor.
"""

from __future__ import annotations

import math

import pytest
import torch

from shardinfer.engine.models.deepseek_moe import RoutingConfig
from shardinfer.errors import ModelLoadError
from shardinfer.kernels.reference_moe import _slots_capturable, _slots_gathered, grouped_topk, moe_experts


def official_route(
    logits: list[float],
    bias: list[float],
    top_k: int,
    n_group: int,
    topk_group: int,
    scale: float,
    mask_value: float = -math.inf,
) -> tuple[list[int], list[float]]:
    scores = [1.0 / (1.0 + math.exp(-v)) for v in logits]
    choice = [s + b for s, b in zip(scores, bias, strict=True)]
    per = len(scores) // n_group
    group_score = [sum(sorted(choice[g * per : (g + 1) * per], reverse=True)[:2]) for g in range(n_group)]
    kept = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
    masked = [c if e // per in kept else mask_value for e, c in enumerate(choice)]
    ids = sorted(range(len(scores)), key=lambda e: -masked[e])[:top_k]
    total = sum(scores[e] for e in ids)
    return ids, [scores[e] / total * scale for e in ids]


def test_group_limited_routing_matches_official_formula_in_float64() -> None:
    gen = torch.Generator().manual_seed(0)
    t, e, n_group, topk_group, top_k, scale = 64, 32, 8, 3, 6, 2.5
    logits = torch.randn(t, e, generator=gen, dtype=torch.float64) * 2
    # A negative bias makes every biased score negative: a mask of 0.0 instead of -inf would then
    # let experts of dropped groups win, so this input tells the two rules apart.
    bias = -1.5 - torch.rand(e, generator=gen, dtype=torch.float64)
    weights, ids = grouped_topk(logits.float(), bias.float(), top_k, n_group, topk_group, True, scale)
    differs_from_zero_mask = 0
    for i in range(t):
        want_ids, want_w = official_route(
            logits[i].tolist(), bias.tolist(), top_k, n_group, topk_group, scale
        )
        got = dict(zip(ids[i].tolist(), weights[i].tolist(), strict=True))
        assert sorted(got) == sorted(want_ids), f"token {i}"
        for expert, w in zip(want_ids, want_w, strict=True):
            assert abs(got[expert] - w) <= 1e-6
        zero_ids, _ = official_route(
            logits[i].tolist(), bias.tolist(), top_k, n_group, topk_group, scale, 0.0
        )
        differs_from_zero_mask += sorted(zero_ids) != sorted(want_ids)
    assert differs_from_zero_mask > 0
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32


def test_all_groups_kept_is_plain_topk() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 12, generator=gen)
    bias = torch.randn(12, generator=gen) * 0.1
    w_grouped, ids_grouped = grouped_topk(logits, bias, 4, n_group=3, topk_group=3, routed_scaling_factor=1.5)
    w_flat, ids_flat = grouped_topk(logits, bias, 4, n_group=1, topk_group=1, routed_scaling_factor=1.5)
    assert torch.equal(ids_grouped, ids_flat) and torch.equal(w_grouped, w_flat)
    assert torch.allclose(w_flat.sum(-1), torch.full((16,), 1.5))


def test_moe_experts_match_float64_and_are_batch_invariant() -> None:
    gen = torch.Generator().manual_seed(2)
    t, h, inter, e, k = 40, 24, 16, 6, 3
    x = torch.randn(t, h, generator=gen)
    w_gate_up = torch.randn(e, 2 * inter, h, generator=gen) * 0.2
    w_down = torch.randn(e, h, inter, generator=gen) * 0.2
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=gen)
    got = moe_experts(x, ids, weights, w_gate_up, w_down)
    xd, gu, dn = x.double(), w_gate_up.double(), w_down.double()
    want = torch.zeros(t, h, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            ex = int(ids[i, j])
            gate, up = (gu[ex] @ xd[i]).split(inter)
            want[i] += float(weights[i, j]) * (dn[ex] @ (torch.nn.functional.silu(gate) * up))
    assert (got.double() - want).abs().max().item() <= 1e-5
    # A token's output is bitwise the same alone, in a different batch, or at another row.
    for i in (0, 17, 39):
        alone = moe_experts(x[i : i + 1], ids[i : i + 1], weights[i : i + 1], w_gate_up, w_down)
        assert torch.equal(alone[0], got[i])
    perm = torch.randperm(t, generator=gen)
    shuffled = moe_experts(x[perm], ids[perm], weights[perm], w_gate_up, w_down)
    assert torch.equal(shuffled, got[perm])


@pytest.mark.parametrize(
    "bad",
    [
        dict(n_routed_experts=10, n_group=4),  # not divisible
        dict(n_routed_experts=8, n_group=8, topk_group=2),  # one expert per group, top-2 scoring impossible
        dict(n_routed_experts=8, n_group=4, topk_group=1, num_experts_per_tok=3),  # too few eligible experts
        dict(scoring_func="softmax"),
    ],
)
def test_bad_routing_configs_are_refused(bad: dict[str, object]) -> None:
    cfg = {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, **bad}
    with pytest.raises(ModelLoadError):
        RoutingConfig(cfg)


def test_capturable_expert_path_equals_gathered_path() -> None:
    # The CUDA-graph-safe path (every expert on every token, rows selected afterwards) must give
    # bitwise the rows the gathered path gives, so graph-replayed decode equals eager decode.
    gen = torch.Generator().manual_seed(3)
    t, h, inter, e, k = 37, 16, 8, 5, 2
    x = torch.randn(t, h, generator=gen)
    w_gate_up = torch.randn(e, 2 * inter, h, generator=gen) * 0.3
    w_down = torch.randn(e, h, inter, generator=gen) * 0.3
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    gathered = _slots_gathered(x, ids, w_gate_up, w_down, True)
    assert torch.equal(_slots_capturable(x, ids, w_gate_up, w_down, True), gathered)
