"""The sweep of the FMA decode attention kernel's tiles and launch settings, on decode rows alone,
against the shipped chunk kernel: the record of how the engine's tile was chosen.

The kernel is shardinfer/kernels/paged_attention_fma.py (its docstring: the design, and where the
engine uses it). It began here as a prototype, when the question was whether FP8 decode attention
on the FMA units, without MMAs or shared memory, could beat the chunk kernel's 16-row MMAs at
two query heads per KV head (bench/kernels/NOTES.md, "FP8 decode attention on the FMA units").
Every row here is a generated token's (prompt lengths 0), one token a sequence.

    python bench/kernels/proto_fp8_attention_fma.py [--batch 256 512] [--ctx 640 1024] [--group 2 4]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.fp8_decode_batch import HEAD_DIM, PAGE_SIZE, problem, sweep_args, time_against_shipped
from shardinfer.kernels import paged_attention_fma


def decode_fma(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    reps: int = 8,
    warps: int = 4,
    explicit_layouts: bool = False,
    max_registers: int | None = None,
    one_row: bool = True,
) -> torch.Tensor:
    """Decode attention on the engine's FP8 cache layout: q [B, Hq, 128] (contiguous), k and v
    [blocks, page, Hk, 128] float8_e4m3fn, scales [blocks, page, Hk, 1] float32, one token a
    sequence (every row a generated token's). A tile is reps x warps x 4 keys; explicit_layouts
    runs the Gluon kernel; max_registers caps the registers a thread (a launch setting: the same
    arithmetic); one_row=False runs the kernel with the loop over a request's rows, as a launch
    with more rows than requests does (paged_attention_fma.ONE_ROW_PROGRAMS)."""
    b, _hq, dh = q.shape
    assert dh == HEAD_DIM and k.shape[1] == PAGE_SIZE and q.is_contiguous() and k.is_contiguous()
    out = torch.empty_like(q)
    qsl = torch.arange(b + 1, dtype=torch.int32, device=q.device)
    prompt_lens = torch.zeros(b, dtype=torch.int32, device=q.device)
    paged_attention_fma.launch(
        out,
        q,
        k,
        v,
        k_scale,
        v_scale,
        qsl,
        seq_lens,
        block_tables,
        prompt_lens,
        scale,
        reps,
        warps,
        explicit_layouts,
        max_registers,
        one_row,
    )
    return out


# (reps, warps, explicit layouts, register cap, one row). The first run (bench/kernels/NOTES.md)
# timed the Triton kernel too and 32-key tiles; both lost far behind, so the list keeps the Triton
# kernel at 64-key tiles as the record and adds the fastest config under a 128-register cap (132
# uncapped: three programs a SM; capped, four), and that config with the loop over a request's
# rows (what a launch with more rows than requests runs).
CONFIGS = (
    (4, 4, False, None, True),
    (8, 4, True, None, True),
    (4, 4, True, None, True),
    (4, 4, True, 128, True),
    (4, 4, True, 128, False),
    (2, 4, True, None, True),
    (4, 8, True, None, True),
)


def compare(batch: int, ctx: int, group: int, bw: float) -> str:
    """One batch, context and group: the shipped kernel and each prototype config, µs per call
    (CUDA-graph replays), and each one's largest error against the float64 reference."""
    pr = problem(batch, ctx, group)
    scale = HEAD_DIM**-0.5

    def fma(reps: int, warps: int, explicit: bool, cap: int | None, one_row: bool) -> torch.Tensor:
        return decode_fma(
            pr["q"],
            pr["k"],
            pr["v"],
            pr["ks"],
            pr["vs"],
            pr["bt"],
            pr["sl"],
            scale,
            reps,
            warps,
            explicit,
            cap,
            one_row,
        )

    t = time_against_shipped(pr, scale, [lambda c=c: fma(*c) for c in CONFIGS], bw, checked_rows=32)
    return (
        f"{batch:>5} {ctx:>5} {group:>5} {t.shipped_us:>10.1f} "
        + " ".join(f"{us:>10.1f}" for us in t.variant_us)
        + f" {t.floor_us:>9.1f}   "
        + " ".join(f"{e:.1e}" for e in t.errors)
    )


def main() -> None:
    from bench.gpu_timing import copy_bandwidth

    args = sweep_args(groups=(2, 4))
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s")
    print(
        f"{'batch':>5} {'ctx':>5} {'group':>5} {'shipped us':>10} "
        + " ".join(
            f"{('gl ' if e else 'tl ') + f'{r}x{w}' + (f'/{c}' if c else '') + ('' if o else ' loop'):>10}"
            for r, w, e, c, o in CONFIGS
        )
        + f" {'floor us':>9}   max |err| vs float64: shipped, then each fma"
    )
    for group in args.group:
        for batch in args.batch:
            for ctx in args.ctx:
                print(compare(batch, ctx, group, bw), flush=True)


if __name__ == "__main__":
    main()
