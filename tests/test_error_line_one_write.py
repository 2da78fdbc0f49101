"""Every ``error:`` line goes to stderr in one write (``errors.say``): the ranks of a distributed run write to
the same pipe, and with an unbuffered stderr (``python -u``, ``PYTHONUNBUFFERED``) ``print``'s text and newline
were two writes, so two ranks' lines could come out glued on one line (the clean-clone suite met it in
``test_checkpoint_folder``: ``...step000004.ckpt)error: checkpoint ...``)."""
from __future__ import annotations

import io
import sys

import pytest

from scalevec_lit import errors


class Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


@pytest.mark.parametrize("err, code, start", [
    (errors.UserError("data.data_dir", "x", "not a folder", "prepare it"), 2, "error: data.data_dir: x: not a folder"),
    (errors.RunError("ckpt", "y", "is corrupt", "resume from another"), 1, "error: ckpt: y: is corrupt"),
    (KeyError("bug"), 1, "error: internal: KeyError"),
], ids=["user", "run", "internal"])
def test_an_error_line_is_one_write(monkeypatch, err, code, start):
    stream = Writes()
    monkeypatch.setattr(sys, "stderr", stream)
    assert errors.report(err) == code
    assert len(stream.calls) == 1 and stream.calls[0].startswith(start) and stream.calls[0].endswith("\n")
    assert stream.calls[0].count("\n") == 1
