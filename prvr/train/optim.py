"""BertAdam with the ``warmup_linear`` schedule, as the official MS-SL training uses it.

What makes it differ from ``torch.optim.AdamW`` (and why a reimplementation that swaps it changes results):
no bias correction, every parameter tensor's gradient is clipped to norm 1.0 *on its own* inside the step,
weight decay is added to the Adam update (so it is scaled by the scheduled lr), and the lr follows a
warm-up-then-linear-decay schedule evaluated at the step count *before* the update (step 0 moves nothing).
The update is vectorised over all tensors with ``torch._foreach_*`` ops.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")  # official: any of these in the name -> no decay


def warmup_linear(progress: float, warmup: float) -> float:
    """Lr multiplier: linear 0 -> 1 over the first ``warmup`` fraction, then linear 1 -> 0 at progress 1."""
    if progress < warmup:
        return progress / warmup
    return max((progress - 1.0) / (warmup - 1.0), 0.0)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into decayed and non-decayed groups by the official name rule."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if any(nd in name for nd in NO_DECAY) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class BertAdam(torch.optim.Optimizer):
    """Adam without bias correction, per-tensor grad clipping and scheduled decoupled weight decay."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 2.5e-4,
        t_total: int = -1,  # total optimisation steps; -1 = constant lr
        warmup: float = 0.01,  # fraction of t_total spent warming up
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float = 1.0,  # per tensor; <= 0 disables
    ):
        if lr < 0 or not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0 or eps < 0:
            raise ValueError(f"invalid BertAdam hyper-parameters: lr={lr} betas={betas} eps={eps}")
        if t_total != -1 and not 0.0 < warmup < 1.0:
            raise ValueError(f"warmup must be a fraction in (0, 1), got {warmup}")
        defaults = dict(lr=lr, t_total=t_total, warmup=warmup, betas=betas, eps=eps,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm, step=0)
        super().__init__(params, defaults)

    def scheduled_lr(self, group: dict) -> float:
        """The lr this group's next update uses (the schedule reads the step count before the update)."""
        if group["t_total"] == -1:
            return group["lr"]
        return group["lr"] * warmup_linear(group["step"] / group["t_total"], group["warmup"])

    @torch.no_grad()
    def step(self, closure=None):
        """Apply one update to every parameter that has a gradient."""
        loss = None if closure is None else closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            for p in params:
                if not self.state[p]:
                    self.state[p]["next_m"] = torch.zeros_like(p)
                    self.state[p]["next_v"] = torch.zeros_like(p)
            m = [self.state[p]["next_m"] for p in params]
            v = [self.state[p]["next_v"] for p in params]
            beta1, beta2 = group["betas"]
            if group["max_grad_norm"] > 0:  # clip_grad_norm_ applied to each tensor separately
                norms = torch._foreach_norm(grads)
                coefs = [torch.clamp(group["max_grad_norm"] / (n + 1e-6), max=1.0) for n in norms]
                torch._foreach_mul_(grads, coefs)
            torch._foreach_mul_(m, beta1)
            torch._foreach_add_(m, grads, alpha=1 - beta1)
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
            denom = torch._foreach_sqrt(v)
            torch._foreach_add_(denom, group["eps"])
            update = torch._foreach_div(m, denom)
            if group["weight_decay"] > 0:
                torch._foreach_add_(update, params, alpha=group["weight_decay"])
            torch._foreach_add_(params, update, alpha=-self.scheduled_lr(group))
            group["step"] += 1
        return loss
