# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""torch.autograd Functions of the balanced mode: dispatch's backward is a combine of
the output grads (and a gather of the route-weight grads); combine's backward is a
dispatch of the output grad with the saved plan (no planning, no prefetch)."""

from __future__ import annotations

import torch


class DispatchFunction(torch.autograd.Function):
    """``DispatchFunction.apply(buffer, hidden_sh, route_weights_sk, topk_experts_sk,
    tokens_per_expert)`` -> ``(hidden_nvsh, route_weights_nvs, cu_seqlens, plan)``;
    gradients flow to ``hidden_sh`` and ``route_weights_sk``."""

    @staticmethod
    def forward(ctx, buffer, hidden_sh, route_weights_sk, topk_experts_sk, tokens_per_expert):
        weights = None if route_weights_sk is None else route_weights_sk.detach()
        hidden_nvsh, weights_nvs, cu_seqlens, plan = buffer.dispatch(
            hidden_sh.detach(), weights, topk_experts_sk, tokens_per_expert
        )
        ctx.has_weights = route_weights_sk is not None
        ctx.buffer, ctx.plan = buffer, plan
        ctx.mark_non_differentiable(cu_seqlens)
        return hidden_nvsh, weights_nvs, cu_seqlens, plan

    @staticmethod
    def backward(ctx, grad_hidden_nvsh, grad_weights_nvs, _grad_cu, _grad_plan):
        buffer = ctx.buffer
        if grad_hidden_nvsh is None:
            grad_hidden_nvsh = torch.zeros(
                buffer.NvS, buffer.H, dtype=torch.bfloat16, device=buffer.device
            )
        if ctx.has_weights and grad_weights_nvs is None:
            grad_weights_nvs = torch.zeros(buffer.NvS, dtype=torch.float32, device=buffer.device)
        if not ctx.has_weights:
            grad_weights_nvs = None
        grad_hidden_sh, grad_weights_sk, _ = buffer.combine(
            ctx.plan,
            grad_hidden_nvsh.contiguous(),
            None if grad_weights_nvs is None else grad_weights_nvs.contiguous(),
        )
        return None, grad_hidden_sh, grad_weights_sk, None, None


class CombineFunction(torch.autograd.Function):
    """``CombineFunction.apply(buffer, plan, hidden_nvsh)`` -> ``output_sh``; its
    backward re-dispatches the output grad with ``plan``."""

    @staticmethod
    def forward(ctx, buffer, plan, hidden_nvsh):
        output_sh, _, _ = buffer.combine(plan, hidden_nvsh.detach().contiguous())
        ctx.buffer, ctx.plan = buffer, plan
        return output_sh

    @staticmethod
    def backward(ctx, grad_output_sh):
        grad_nvsh, _, _, _ = ctx.buffer.dispatch(grad_output_sh.contiguous(), plan=ctx.plan)
        return None, None, grad_nvsh


def dispatch(buffer, hidden_sh, route_weights_sk, topk_experts_sk, tokens_per_expert):
    """Differentiable ``buffer.dispatch`` (see :class:`DispatchFunction`)."""
    return DispatchFunction.apply(
        buffer, hidden_sh, route_weights_sk, topk_experts_sk, tokens_per_expert
    )


def combine(buffer, plan, hidden_nvsh):
    """Differentiable ``buffer.combine`` (see :class:`CombineFunction`)."""
    return CombineFunction.apply(buffer, plan, hidden_nvsh)
