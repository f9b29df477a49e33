# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ep.balanced: MoonEP's balanced expert parallelism without NVLink multicast.

Every rank receives exactly S*K (token, expert) rows however skewed the routing: a
deterministic planner (the same on every rank, from the gathered counts) places
redundant copies of overloaded experts into at most epn prefetch slots per rank,
``prefetch_weight`` fills the slots with their owners' weights and ``reduce_grad``
returns the slot gradients home. :class:`Buffer` follows MoonEP's ``Buffer`` API
(code written for MoonEP runs with ``from mori.ep.balanced import Buffer``);
:func:`plan` computes every rank's tables without communication. See the mori-ep
README's "Balanced mode" and "Porting from MoonEP".
"""

from __future__ import annotations

from .autograd import CombineFunction, DispatchFunction
from .buffer import Buffer, CompletedEvent
from .planning import Plan, PlanSet, nvs_of, plan

# MoonEP's name for the plan object (isinstance checks in ported code).
MoonEPCommPlan = Plan

__all__ = [
    "Buffer",
    "CombineFunction",
    "CompletedEvent",
    "DispatchFunction",
    "MoonEPCommPlan",
    "Plan",
    "PlanSet",
    "nvs_of",
    "plan",
]
