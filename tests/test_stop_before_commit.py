"""A stop signal and the moment a command's output is put in place (``outdir.Claim.commit``), the same for every
command writing through ``OutputFolder`` or ``OutputFile``: a stop whose ``StopSignal`` was swallowed while the
command wrote (a library's clean-up, a ``__del__``) stops it before the commit, exit 128 + N, the earlier output
left exactly as it was and no temporary folder; a stop during the move waits for it, then says the output is
complete. Before, only ``prepare`` checked: export, import and convert moved their output in, then exited 130.

In process, with the tiny models of ``tests/test_output_folders.py``; the signal is raised by the test itself."""
from __future__ import annotations

import signal

import pytest

import scalevec_lit.cli  # noqa: F401 - imports Lightning before any test captures stderr (see test_bad_input.py)
from helpers import check, file_hashes
from scalevec_lit import outdir, stopsignal
from scalevec_lit.errors import run_guarded
from scalevec_lit.outdir import MANIFEST, output_folder
from scalevec_lit.outfile import output_file
from test_output_folders import command, leftovers, source_copy, sources  # noqa: F401 - the module fixture


def _swallow(signum: int) -> None:
    try:
        signal.raise_signal(signum)
    except BaseException:  # noqa: BLE001 - a library's clean-up that takes everything
        pass


def _swallow_while_writing(monkeypatch, signum: int) -> None:
    """The tokenizer files are written after the weights: a stop signal is taken there, and the write goes on."""
    import scalevec_lit.export.write as write

    real = write.write_tokenizer

    def taken(*args, **kwargs):
        _swallow(signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(write, "write_tokenizer", taken)


@pytest.mark.parametrize("name", ["export", "import", "convert"])
def test_a_swallowed_stop_leaves_the_earlier_output_as_it_was(world, capfd, sources, monkeypatch, name):  # noqa: F811
    src = source_copy(sources, name, world.path / "src")
    out = world.path / "out" / "model"
    check(world, capfd, command("export", sources / "native", out), 0, "exported")
    (out / "NOTES.md").write_text("the user's notes")
    before = file_hashes(out)
    _swallow_while_writing(monkeypatch, signal.SIGINT)
    native = ("--format", "native") if name == "export" else ()
    check(world, capfd, command(name, src, out, "--overwrite", *native), 130,
          f"error: stopped by SIGINT during {name}: nothing was written (an output folder is left as it was); run "
          "the same command again")
    assert file_hashes(out) == before and not leftovers(world.path)
    fresh = world.path / "out" / "new" / "model"  # a new output: not made, nor its parent folders
    check(world, capfd, command(name, src, fresh, *native), 130, f"stopped by SIGINT during {name}: nothing")
    assert not (world.path / "out" / "new").exists() and not leftovers(world.path)


def _guarded(fn, argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_:
        run_guarded(fn, argv)
    return exit_.value.code


def test_the_file_rule_checks_too(tmp_path, capfd):
    """``OutputFile`` (evaluate --out): SIGTERM taken while the results were written; the old file stays."""
    out = tmp_path / "results.json"

    def evaluate(text: str, swallow: bool):
        def run(argv):
            with output_file(out, command="evaluate", overwrite=True) as tmp:
                (tmp / out.name).write_text(text)
                if swallow:
                    _swallow(signal.SIGTERM)
            return 0
        return run

    assert run_guarded(evaluate("old", False), ["evaluate"]) == 0
    before = file_hashes(tmp_path)
    assert _guarded(evaluate("new", True), ["evaluate"]) == 143
    assert capfd.readouterr().err == ("error: stopped by SIGTERM during evaluate: nothing was written (an output "
                                      "folder is left as it was); run the same command again\n")
    assert file_hashes(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == [
        f".results.json{MANIFEST}", "results.json"]


def test_a_stop_during_the_move_waits_for_it_then_says_the_output_is_complete(tmp_path, capfd, monkeypatch):
    """SIGINT arrives while the new entries are moved in: the move ends (all the new files, the old ones gone,
    no temporary folder), then the line says the output is in place; the process ends at once (``_exit_now``,
    replaced here by one that raises what ``os._exit`` would give)."""
    out = tmp_path / "model"
    exits = []

    def exit_now(signum, frame):
        exits.append(signum)
        print(f"error: {stopsignal.describe(signum)}", file=__import__("sys").stderr)
        raise SystemExit(128 + signum)

    monkeypatch.setattr(stopsignal, "_exit_now", exit_now)

    def export(text: str):
        def run(argv):
            with output_folder(out, command="export", overwrite=True) as tmp:
                (tmp / "model.safetensors").write_text(text)
            print("exported")
            return 0
        return run

    assert run_guarded(export("old"), ["export"]) == 0
    (out / "NOTES.md").write_text("the user's notes")  # moved in entry by entry (outdir.move_in)
    real_move_in = outdir.move_in

    def signalled(*args):
        signal.raise_signal(signal.SIGINT)
        return real_move_in(*args)

    monkeypatch.setattr(outdir, "move_in", signalled)
    capfd.readouterr()
    assert _guarded(export("new"), ["export"]) == 130
    got = capfd.readouterr()
    assert exits == [signal.SIGINT] and got.out == ""  # answered after the move, before the summary
    assert got.err == (f"error: stopped by SIGINT after export had finished: {out} holds the complete output of "
                       "export; nothing to run again\n")
    assert (out / "model.safetensors").read_text() == "new" and (out / "NOTES.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary or replaced-files sibling
    assert signal.getsignal(signal.SIGINT) is not stopsignal._handler  # the handlers before the command are back


def test_without_a_signal_nothing_changes(tmp_path):
    out = tmp_path / "model"

    def export(argv):
        with output_folder(out, command="export") as tmp:
            (tmp / "a.bin").write_text("a")
        return "done"

    assert run_guarded(export, ["export"]) == "done"
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a.bin"]
    assert not leftovers(tmp_path)
