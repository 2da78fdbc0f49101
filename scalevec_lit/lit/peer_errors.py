"""A lost rank as the user meets it: which failures are a peer's, the one line, its exit code, the option.

``lit/peers.py`` runs the heartbeat and the watchdog and decides that a peer is lost (or that a collective
failed with every peer alive); what it then prints is built here: ``lost_error`` names the lost ranks and the
step, ``unnamed_error`` a collective that failed with no rank to name. Both are ``PeerLostError`` (exit 75,
``EX_TEMPFAIL``: the same command with ``--ckpt_path last`` resumes), which ``errors.run_guarded`` ends the
process with at once (``leave_at_once``: ``errors.leave``). ``is_collective_failure`` tells an exception that
a collective raises when a peer is gone (gloo/NCCL/c10d errors, timeouts) from one of this rank's own.

Plain Python: no torch, no Lightning, no threads.
"""
from __future__ import annotations

from typing import Optional

from ..errors import RunError

PEER_LOST_EXIT = 75  # EX_TEMPFAIL: a temporary failure; the same command (--ckpt_path last) resumes
DEFAULT_PEER_TIMEOUT = 300.0  # seconds: 5 minutes, not the process group's 30
TIMEOUT_KEY = "peer_timeout"
COLLECTIVE_FAILURES = ("DistBackendError", "DistNetworkError", "DistStoreError")
COLLECTIVE_TEXTS = ("connection reset by peer", "connection closed by peer", "broken pipe", "gloo", "nccl",
                    "timed out", "timeout", "socket", "connection refused")


class PeerLostError(RunError):
    """Another rank of this run is gone (exit 75): after its line the process leaves at once (``lit/peers.py``
    says why)."""

    exit_code = PEER_LOST_EXIT
    leave_at_once = True


def lost_error(lost: list[int], step: int, how: str, newest: str = "", hosts: Optional[dict] = None) -> PeerLostError:
    """``hosts``: rank -> host name, for the lost ranks on another host than this rank's (several nodes)."""
    hosts = hosts or {}
    ranks = ", ".join(f"{r} (host {hosts[r]})" if r in hosts else str(r) for r in lost)
    return PeerLostError(
        f"rank {ranks}", f"lost at step {step}",
        f"{how}; this rank stopped (exit {PEER_LOST_EXIT}); {newest or 'no checkpoint was written yet'}",
        "resume with the same command and --ckpt_path last (launch/torchrun_fit.sh restarts by itself, "
        f"MAX_RESTARTS times); a slow but healthy cluster needs a larger --{TIMEOUT_KEY} (seconds)")


def unnamed_error(step: int, failure: str, how: str, newest: str = "") -> PeerLostError:
    """A collective failed and no rank can be named lost (every one still beats, or the store is gone)."""
    return PeerLostError(
        "a collective", f"failed at step {step}",
        f"{failure} ({how or 'every rank is alive: one waited longer than the process group timeout for another'}"
        f"); this rank stopped (exit {PEER_LOST_EXIT}); {newest or 'no checkpoint was written yet'}",
        f"a rank that legitimately runs ahead of the others for long (a long write or compile on one rank) needs a "
        f"larger --{TIMEOUT_KEY} (seconds); resume with the same command and --ckpt_path last")


def is_collective_failure(err: BaseException) -> bool:
    """Whether ``err`` is what a collective raises when a peer is gone (gloo/NCCL/c10d errors, timeouts)."""
    if is_c10d_error(err):
        return True
    text = str(err).lower()
    return isinstance(err, (RuntimeError, ConnectionError, TimeoutError)) and any(t in text for t in COLLECTIVE_TEXTS)


def is_c10d_error(err: BaseException) -> bool:
    """Whether ``err`` is one of torch.distributed's own errors (not merely a message that reads like one)."""
    return bool({cls.__name__ for cls in type(err).__mro__} & set(COLLECTIVE_FAILURES))


def peer_timeout_argument(parser) -> None:
    parser.add_argument(f"--{TIMEOUT_KEY}", type=float, default=DEFAULT_PEER_TIMEOUT,
                        help="seconds after which a silent or lost rank stops the others (one line, exit 75): "
                             "the process group's timeout and the heartbeat's")
