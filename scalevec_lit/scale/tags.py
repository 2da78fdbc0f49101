"""Where a scale vector lives and how the monitor names it: ``ScaleInfo`` (layer, site, branch, role, part), the
roles ``INPUT`` / ``OUTPUT``, and the TensorBoard tag format (``scale_tag`` / ``parse_scale_tag``).

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

#: the two roles: a scale that a linear map absorbs exactly (``input``), or one that none does (``output``)
INPUT, OUTPUT = "input", "output"

#: every tag of ``ScaleVectorMonitor`` is ``scale/<role>/<site>/<branch>/<layer>/<part>/<stat>`` (``scale_tag``);
#: readers of event files (``scalevec_lit.study``) take it apart with ``parse_scale_tag``, never by position
TAG_PREFIX = "scale"


class ScaleTag(NamedTuple):
    role: str
    site: str
    branch: str
    layer: str  # layer00, ..., final
    part: str  # scale, magnitude, direction; gamma (effective γ), precond (preconditioner figures)
    stat: str  # mean, std, min, max; min_gamma_sq, drift_mean, ...


def scale_tag(info: "ScaleInfo", stat: str) -> str:
    return f"{TAG_PREFIX}/{info.tag}/{stat}"


def parse_scale_tag(tag: str) -> Optional[ScaleTag]:
    """The parts of a monitor tag, or None for any other tag (a histogram or heatmap tag, ``train/loss``)."""
    parts = tag.split("/")
    if len(parts) != 7 or parts[0] != TAG_PREFIX:
        return None
    return ScaleTag(*parts[1:])


def layer_label(layer: int) -> str:
    """The layer's name in tags and figures: ``layer00``, ``layer01``, ... and ``final`` (layer −1)."""
    return "final" if layer < 0 else f"layer{layer:02d}"


@dataclass(frozen=True)
class ScaleInfo:
    """Where a scale parameter lives and what it does. ``part`` is '' until the registry fills it."""

    layer: int  # block index; -1 for the final norm
    site: str  # attn_input, mlp_input, attn_proj, mlp_proj, attn_output, mlp_output, final, block_input
    branch: str  # q, k, v, gate, up, router, head, shared, out; MoE: experts, expert<i>, ...
    role: str  # input or output
    part: str = ""  # scale, magnitude, direction

    @property
    def tag(self) -> str:
        """``<role>/<site>/<branch>/<layer>/<part>`` (layer ``layer00`` ... or ``final``): the middle of every
        monitor tag, to which ``scale_tag`` adds the prefix and the statistic."""
        return f"{self.role}/{self.site}/{self.branch}/{layer_label(self.layer)}/{self.part}"
