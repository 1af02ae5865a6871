"""Adaptor for ``torch.distributed``'s private helpers."""
from __future__ import annotations


def resolve_process_group(name: str):
    """The ProcessGroup a functional collective's group name stands for."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)
