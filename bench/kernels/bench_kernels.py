"""Small kernel benchmarks on one GPU: paged-attention decode against its HBM floor, and a few others.

Decode attention is memory-bound: a step must read every running sequence's K and V once, plus
q and out. floor = bytes / (measured device-to-device copy bandwidth); we print achieved GB/s
and achieved / floor-bandwidth. Times are medians of CUDA-event timings after warm-up, with
random (never zero) data and block tables scattered over the pool, as a real cache is.

    python bench/kernels/bench_kernels.py [--out DIR]    (DIR defaults to $OUT, else .)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shardinfer.kernels import paged_attention as pa
from shardinfer.kernels import rmsnorm, sampling


def median_ms(fn, warmup: int = 5, reps: int = 30) -> float:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the memory ceiling we compare to)."""
    n = 1 << 30  # 2 GiB of bf16 each way
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), reps=10)
    return 2 * a.numel() * a.element_size() / (ms * 1e-3)


def decode_case(batch: int, ctx: int, hq: int, hk: int, d: int, page: int, kv_chunk: int,
                bw: float) -> dict[str, float | int]:
    gen = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx)
    blocks_per_seq = -(-ctx // page)
    n_blocks = batch * blocks_per_seq
    kc = torch.randn(n_blocks, page, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    vc = torch.randn(n_blocks, page, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    bt = torch.randperm(n_blocks, device="cuda", generator=gen).view(batch, blocks_per_seq).int()
    q = torch.randn(batch, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    qsl = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
    sl = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    scale = d ** -0.5

    def run() -> torch.Tensor:
        return pa.paged_attention(q, kc, vc, qsl, sl, bt, scale, max_seq_len=ctx, kv_chunk=kv_chunk)

    ms = median_ms(run)
    kv_bytes = 2 * batch * ctx * hk * d * 2
    qo_bytes = 2 * batch * hq * d * 2
    gbs = (kv_bytes + qo_bytes) / (ms * 1e-3) / 1e9
    return {"batch": batch, "ctx": ctx, "hq": hq, "hk": hk, "head_dim": d, "block_size": page,
            "kv_chunk": kv_chunk, "ms": ms, "bytes": kv_bytes + qo_bytes, "achieved_GBs": gbs,
            "floor_ms": (kv_bytes + qo_bytes) / bw * 1e3, "fraction_of_copy_bw": gbs * 1e9 / bw}


def sdpa_case(batch: int, ctx: int, hq: int, hk: int, d: int, bw: float) -> dict[str, float | int]:
    """torch's own attention on the same data laid out densely: a yardstick, not paged."""
    q = torch.randn(batch, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, hk, ctx, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    nbytes = 2 * batch * ctx * hk * d * 2 + 2 * batch * hq * d * 2
    return {"batch": batch, "ctx": ctx, "ms": ms, "achieved_GBs": nbytes / (ms * 1e-3) / 1e9,
            "fraction_of_copy_bw": nbytes / (ms * 1e-3) / bw}


def other_kernels(bw: float) -> dict[str, dict[str, float]]:
    res: dict[str, dict[str, float]] = {}
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: rmsnorm.fused_add_rms_norm(x, r, w, 1e-6))
    nbytes = 4 * x.numel() * 2
    res["fused_add_rms_norm_256x4096"] = {"ms": ms, "fraction_of_copy_bw": nbytes / (ms * 1e-3) / bw}
    b, vocab = 256, 151936
    logits = torch.randn(b, vocab, device="cuda") * 4
    seeds = torch.randint(0, 2**62, (b,), device="cuda")
    pos = torch.randint(0, 10**6, (b,), device="cuda")
    for name, temp, k, p in [("greedy", 0.0, -1, 1.0), ("plain_T1", 1.0, -1, 1.0),
                             ("top_k50_top_p0.9", 1.0, 50, 0.9)]:
        args = (logits, torch.full((b,), temp, device="cuda"), torch.full((b,), k, device="cuda", dtype=torch.int32),
                torch.full((b,), p, device="cuda"), torch.zeros(b, device="cuda"), seeds, pos)
        res[f"sample_{name}_256x151936"] = {"ms": median_ms(lambda a=args: sampling.sample(*a), reps=10)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    bw = copy_bandwidth()
    print(f"GPU {torch.cuda.get_device_name()}  copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    decode = []
    for hq, hk in [(32, 8), (16, 8)]:
        for batch in (64, 256):
            for chunk in (512, 2048):
                decode.append(decode_case(batch, 2048, hq, hk, 128, 16, chunk, bw))
    sdpa = [sdpa_case(bt, 2048, 32, 8, 128, bw) for bt in (64, 256)]
    others = other_kernels(bw)
    print(f"{'Hq/Hk':>6} {'batch':>5} {'ctx':>5} {'chunk':>5} {'ms':>8} {'floor ms':>8} {'GB/s':>7} {'of copy bw':>10}")
    for r in decode:
        print(f"{r['hq']:>3}/{r['hk']:<2} {r['batch']:>5} {r['ctx']:>5} {r['kv_chunk']:>5} {r['ms']:>8.3f} "
              f"{r['floor_ms']:>8.3f} {r['achieved_GBs']:>7.0f} {r['fraction_of_copy_bw']:>10.1%}")
    for r in sdpa:
        print(f"torch SDPA dense 32/8 batch {r['batch']}: {r['ms']:.3f} ms, {r['achieved_GBs']:.0f} GB/s "
              f"({r['fraction_of_copy_bw']:.1%})")
    for name, r in others.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    record = {"workload": "kernels-decode-attention", "gpu": torch.cuda.get_device_name(), "commit": commit,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "batch_invariant": True,
              "copy_bandwidth_Bps": bw, "paged_attention_decode": decode, "torch_sdpa_dense": sdpa,
              "other": others, "torch": torch.__version__}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"kernels-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
