"""The monitor's reductions: statistics and consumer column norms of tensors that may be FSDP2 DTensors.

Statistics are computed on each rank's local shard and combined with one ``all_gather`` of a packed
(sum, sum of squares, min, max, count) tensor per process group; column norms of consumer weights with one
``all_reduce`` per group; anything else is gathered (``full_tensor``). Collective: every rank calls, in step.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import torch

from scalevec_lit.scale.sites import Consumer


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def _shard_group(t: torch.Tensor) -> Any:
    """The process group over which ``t``'s elements are split, ``None`` when ``t`` is whole on this rank,
    or ``"full"`` when its layout needs a gather (more than one sharded mesh dimension)."""
    if not _is_dtensor(t):
        return None
    dims = [i for i, p in enumerate(t.placements) if p.is_shard()]
    if not dims:
        return None
    if len(dims) > 1:
        return "full"
    return t.device_mesh.get_group(dims[0])


def tensor_statistics(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``[n, 4]`` float64 on CPU: mean, std (population), min, max of each tensor, over all its shards."""
    import torch.distributed as dist

    if not tensors:
        return torch.zeros(0, 4, dtype=torch.float64)
    rows = []
    groups: dict[Any, list[int]] = {}
    for i, t in enumerate(tensors):
        group = _shard_group(t)
        if group == "full":
            x = t.full_tensor()
        else:
            x = t.to_local() if _is_dtensor(t) else t
            if group is not None:
                groups.setdefault(group, []).append(i)
        x = x.detach().reshape(-1).double()
        if x.numel():
            rows.append(torch.stack([x.sum(), x.square().sum(), x.min(), x.max(), x.new_tensor(float(x.numel()))]))
        else:
            rows.append(x.new_tensor([0.0, 0.0, math.inf, -math.inf, 0.0]))
    packed = torch.stack(rows)
    for group, idx in groups.items():  # one collective per process group: (sum, sumsq, min, max, count)
        part = packed[idx].contiguous()
        world = dist.get_world_size(group)
        out = part.new_empty((world * len(idx), 5))
        dist.all_gather_into_tensor(out, part, group=group)
        out = out.view(world, len(idx), 5)
        packed[idx] = torch.stack(
            [out[..., 0].sum(0), out[..., 1].sum(0), out[..., 2].amin(0), out[..., 3].amax(0), out[..., 4].sum(0)], -1
        )
    packed = packed.cpu()
    count = packed[:, 4].clamp_min(1)
    mean = packed[:, 0] / count
    std = (packed[:, 1] / count - mean.square()).clamp_min(0).sqrt()
    return torch.stack([mean, std, packed[:, 2], packed[:, 3]], -1)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if _is_dtensor(t) else t


def _sq_along(w: torch.Tensor, axis: int) -> torch.Tensor:
    """Squared norms of the slices of ``w`` along ``axis`` (summed over every other dimension), float64."""
    axis = axis % w.ndim
    return w.detach().double().square().sum(dim=[d for d in range(w.ndim) if d != axis])


@torch.no_grad()
def consumer_sq_norms(consumers: Iterable[list[Consumer]]) -> list[list[torch.Tensor]]:
    """For each list of consumers, the full squared norms of the columns (axis -1) or rows (axis -2) paired
    with γ, float64. Column sums of row-sharded weights are reduced with one ``all_reduce`` per group."""
    import torch.distributed as dist

    result: list[list[Optional[torch.Tensor]]] = []
    pending: dict[Any, list[tuple[int, int, torch.Tensor]]] = {}
    for i, cons in enumerate(consumers):
        result.append([])
        for j, c in enumerate(cons):
            w = c.weight
            if not _is_dtensor(w):
                result[i].append(_sq_along(w, c.axis))
                continue
            group = _shard_group(w)
            axis = c.axis % w.ndim
            if group is None:  # replicated DTensor: the local tensor is the whole weight
                result[i].append(_sq_along(w.to_local(), axis))
            elif axis == w.ndim - 1 and group != "full" and w.placements[_shard_dim(w)].dim == 0:
                local = _sq_along(w.to_local(), axis)  # partial column sums of this rank's rows
                pending.setdefault(group, []).append((i, j, local))
                result[i].append(None)
            else:  # any other layout: let DTensor reduce it
                dims = [d for d in range(w.ndim) if d != axis]
                result[i].append(full_tensor(w.detach().square().sum(dim=dims)).double())
    for group, items in pending.items():
        flat = torch.cat([t for _, _, t in items])
        dist.all_reduce(flat, group=group)
        for (i, j, _), t in zip(items, flat.split([t.numel() for _, _, t in items])):
            result[i][j] = t
    return result  # type: ignore[return-value]


def _shard_dim(t: torch.Tensor) -> int:
    return next(i for i, p in enumerate(t.placements) if p.is_shard())
