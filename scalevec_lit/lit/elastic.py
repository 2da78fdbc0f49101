"""``--trainer.num_nodes=auto``: the number of nodes of this start, under torchrun's elastic rendezvous.

With ``--nnodes MIN:MAX`` (``NNODES=1:2 bash launch/torchrun_fit.sh ...``) the number of nodes is known only once
the nodes have met, and may differ from one start to the next (a host lost, a host back). Lightning needs
``trainer.num_nodes`` × ``trainer.devices`` to equal the world size torchrun hands out, so the launch script passes
``auto`` and each worker reads the nodes of its start from torchrun's environment: ``GROUP_WORLD_SIZE`` (the agents
that joined this round), else ``WORLD_SIZE / LOCAL_WORLD_SIZE``. The global batch then sets the accumulation for
that world (``lit/batch.py``), and a resume on another number of nodes reshards (``lit/reshard.py``). ``NNODES``
is set to the same number for litdata, which reads it (and would fail on ``1:2``).
"""
from __future__ import annotations

import os
from typing import Optional

from ..errors import UsageError

KEY = "--trainer.num_nodes"


def nodes_of_this_start(env=None) -> Optional[int]:
    """The nodes torchrun's rendezvous put into this start, or None outside torchrun."""
    env = os.environ if env is None else env
    group = env.get("GROUP_WORLD_SIZE")
    if group and group.isdigit() and int(group) > 0:
        return int(group)
    world, local = env.get("WORLD_SIZE"), env.get("LOCAL_WORLD_SIZE")
    if world and local and world.isdigit() and local.isdigit() and int(local) > 0 and int(world) % int(local) == 0:
        return int(world) // int(local)
    return None


def resolve_auto_nodes(argv: list[str], env=None) -> list[str]:
    """``argv`` with ``--trainer.num_nodes=auto`` (or ``--trainer.num_nodes auto``) replaced by this start's nodes;
    outside torchrun a ``UsageError`` (exit 2) says what to give instead. Anything else is returned unchanged."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        value, taken = None, 1
        if arg == f"{KEY}=auto":
            value = "auto"
        elif arg == KEY and i + 1 < len(argv) and argv[i + 1] == "auto":
            value, taken = "auto", 2
        if value is None:
            out.append(arg)
        else:
            nodes = nodes_of_this_start(env)
            if nodes is None:
                raise UsageError(f"{KEY}: auto: is the number of nodes of a torchrun start (GROUP_WORLD_SIZE), "
                                 "and this process was not started by torchrun; give a number (e.g. "
                                 f"{KEY}=1)")
            out.append(f"{KEY}={nodes}")
            # litdata reads the nodes from NNODES (its chunks are dealt out per node, and a resume rebuilds the
            # order of the first start's nodes from its state): the launch script's range (1:2) is not a number
            (os.environ if env is None else env)["NNODES"] = str(nodes)
        i += taken
    return out
