"""The training loop: main next-token loss plus lambda times the MTP loss, with DeepSeek-V3's
auxiliary-loss-free balancing of the routers' score-correction bias.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DeepseekV3ForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdl

from .model import MTPLayer, main_hidden_and_logits


@dataclass
class TrainSettings:
    steps: int
    batch_rows: int
    seq_len: int
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    mtp_lambda: float = 0.3
    bias_update_speed: float = 1e-3
    time_budget_s: float | None = None  # if set, `steps` is fixed once, early, from the measured step time
    log_every: int = 100
    history: list[dict[str, float]] = field(default_factory=list)


def init_mtp(mtp: MTPLayer, std: float) -> None:
    """Same scheme as transformers' init of the main model: N(0, std) matrices, unit norms, zero bias."""
    for name, p in mtp.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, mean=0.0, std=std)
    for name, b in mtp.named_buffers():
        if name.endswith("e_score_correction_bias"):
            nn.init.zeros_(b)


class RouterBalancer:
    """Counts expert picks per router and nudges `e_score_correction_bias` towards equal load.

    The bias is shifted so its minimum is 0 after each update: routing is invariant to a constant shift
    (top-k and the top-2-sum group scores move together), and non-negative biases keep every unmasked
    expert's choice score positive, so masking unchosen groups with 0 or with -inf selects the same experts.
    """

    def __init__(self, modules: list[nn.Module], speed: float) -> None:
        self.routers = [
            m for root in modules for m in root.modules() if isinstance(m, mdl.DeepseekV3TopkRouter)
        ]
        self.counts = [torch.zeros(r.num_experts, device=r.weight.device) for r in self.routers]
        self.speed = speed
        for i, r in enumerate(self.routers):
            r.register_forward_hook(self._hook(i))

    def _hook(self, i: int):
        def count(_mod: nn.Module, _args: object, output: tuple[torch.Tensor, ...]) -> None:
            self.counts[i] += torch.bincount(output[2].reshape(-1), minlength=self.counts[i].numel()).float()

        return count

    @torch.no_grad()
    def update(self, measure: bool) -> float:
        """Apply one bias step; if `measure`, return the worst max/mean expert load ratio of this step."""
        worst = 0.0
        for r, c in zip(self.routers, self.counts, strict=True):
            if measure:  # reading it back synchronises with the GPU, so only on logging steps
                worst = max(worst, float(c.max() / c.mean().clamp_min(1e-9)))
            b = r.e_score_correction_bias
            assert isinstance(b, torch.Tensor)
            b.add_(self.speed * torch.sign(c.mean() - c))
            b.sub_(b.min())
            c.zero_()
        return worst


def lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = min(1.0, (step - s.warmup) / max(1, s.steps - s.warmup))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def losses(
    main: DeepseekV3ForCausalLM, mtp: MTPLayer, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    hidden, logits = main_hidden_and_logits(main, ids)
    vocab = logits.shape[-1]
    main_loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
    pos = torch.arange(ids.shape[1] - 1, device=ids.device)[None].expand(ids.shape[0], -1)
    mtp_logits = mtp(main, ids[:, 1:], hidden[:, :-1], pos)[:, :-1]
    mtp_loss = F.cross_entropy(mtp_logits.reshape(-1, vocab).float(), ids[:, 2:].reshape(-1))
    return main_loss, mtp_loss


def train(
    main: DeepseekV3ForCausalLM,
    mtp: MTPLayer,
    stream: torch.Tensor,
    s: TrainSettings,
    device: str,
    seed: int,
    log=print,
) -> TrainSettings:
    """Train in place on random rows of `stream` (a 1-D int64 tensor of packed documents)."""
    rows = stream[: (stream.numel() // s.seq_len) * s.seq_len].view(-1, s.seq_len)
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in list(main.parameters()) + list(mtp.parameters()) if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=s.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.startswith("cuda"),
    )
    balancer = RouterBalancer([main, mtp], s.bias_update_speed)
    use_amp = device.startswith("cuda")
    main.train()
    mtp.train()
    start = time.time()
    t_mark = 0.0
    step = 0
    while step < s.steps:
        pick = torch.randint(0, rows.shape[0], (s.batch_rows,), generator=gen)
        ids = rows[pick].to(device, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
            main_loss, mtp_loss = losses(main, mtp, ids)
        loss = main_loss + s.mtp_lambda * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        logging_step = step % s.log_every == 0 or step == s.steps
        imbalance = balancer.update(measure=logging_step)
        if s.time_budget_s is not None and step == 10:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t_mark = time.time()
        if s.time_budget_s is not None and step == 40:
            # Fix the step count before the cosine phase starts, so `--steps N` replays this run exactly.
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            per_step = (time.time() - t_mark) / 30
            left = s.time_budget_s - (time.time() - start)
            s.steps = max(step + 1, min(s.steps, step + int(left / per_step)))
            log(f"step time {per_step * 1000:.1f} ms -> training for {s.steps} steps")
        if logging_step:
            rec = {
                "step": step,
                "loss": float(main_loss.detach()),
                "mtp_loss": float(mtp_loss.detach()),
                "grad_norm": float(grad_norm),
                "lr": lr_at(step - 1, s),
                "max_load_ratio": imbalance,
                "elapsed_s": time.time() - start,
            }
            s.history.append(rec)
            log(" ".join(f"{k}={v:.4g}" for k, v in rec.items()))
    main.eval()
    mtp.eval()
    return s
