"""Nested dicts, lists and tuples of tensors moved between devices: portable checkpoints and state on CPU, back
on the run's device when loaded."""

from __future__ import annotations

from typing import Any

import torch


def to_cpu(obj: Any) -> Any:
    """A copy of nested dicts/lists of tensors with every tensor on the CPU (portable checkpoints)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    return obj


def to_device(obj: Any, device) -> Any:
    """``obj`` with every tensor in it (nested in dicts, lists and tuples) moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj
