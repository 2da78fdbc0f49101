"""``python -m scalevec_lit inspect``: every scale vector of our own checkpoints (dense and MoE, several strategies,
a user block and parameterization) with its layer, site, branch and role, the monitor's statistics, the conserved
quantity of input-role scales and the fold verdict; the command's tables, files and figures; --compare; bad input.
Hugging Face models and exported folders: ``test_inspect_hf.py``.

Tolerances: every number is computed in float64 from the same float32 parameters as the direct computation here,
so the two differ only by the order of floating-point sums: a sum of n ≤ 4096 terms moves by at most n·u relative
to the sum of |terms| (u = 2^-53), below 1e-12 relative to the largest magnitude involved (REL).
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import struct
from pathlib import Path

import pytest
import torch

from test_generate import perturbed, spec_for, write_ckpt
from scalevec_lit.inspect import rows_of
from scalevec_lit.scale.fold import fold_scales

REL = 1e-12


def close(a: float, b: float, scale: float = 1.0) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), scale)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """``python -m scalevec_lit inspect <argv>`` in process: exit code, stdout, stderr."""
    from scalevec_lit.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["inspect", *argv])
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def direct_stats(g: torch.Tensor) -> dict[str, float]:
    """The statistics, straight from their definitions (docs/inspect.md), two-pass in float64."""
    g = g.detach().double()
    rms = g.square().mean().sqrt()
    size = g.abs()
    return {"mean": float(g.mean()), "std": float((g - g.mean()).square().mean().sqrt()), "min": float(g.min()),
            "max": float(g.max()), "rms": float(rms), "anisotropy": float((size - size.mean()).square().mean().sqrt() / rms),
            "near_zero": float((size < 0.05 * rms).double().mean())}


def column_sq(w: torch.Tensor) -> torch.Tensor:
    """‖w_j‖² of every column j (summed over rows and, for a stacked expert weight, experts), float64."""
    w = w.detach().double()
    return w.square().reshape(-1, w.shape[-1]).sum(0)


# -- our own checkpoints -------------------------------------------------------------------------------------
CASES = [("baseline", False, {}), ("unified", False, {}), ("dp", False, {}), ("unified_dnp_vup", False, {}),
         ("sandwich", False, {}), ("er", False, {}), ("unit_offset", False, {}), ("dnp", True, {}),
         ("baseline", True, {"scales": "expert"})]


def case_id(preset: str, moe: bool, extra: dict) -> str:
    return preset + ("-moe" if moe else "") + "".join(f"-{v}" for v in extra.values())


def native(preset: str, moe: bool, moe_extra: dict, seed: int = 1, **config):
    spec = spec_for(preset, moe=moe, **{"vocab_size": 128, **config})
    if moe_extra:
        spec["config"]["moe"].update(moe_extra)
    return spec, perturbed(spec, seed=seed)


@pytest.mark.parametrize("preset,moe,moe_extra", CASES, ids=[case_id(*c) for c in CASES])
def test_statistics_conservation_and_fold_verdicts_of_a_native_model(preset, moe, moe_extra):
    spec, model = native(preset, moe, moe_extra)
    rows = rows_of(model)
    assert rows, "every strategy here has scale vectors"
    for row in rows:
        gamma = row.view.vector().detach()
        want = direct_stats(gamma)
        for name, value in want.items():
            assert close(row.stats[name], value), (row.view.key, name, row.stats[name], value)
        assert torch.equal(row.gamma, gamma.double())
        kind = row.view.parameterization if row.view.role == "input" and row.view.consumers else None
        assert kind in (None, "PlainScale", "UnitOffsetScale", "MagnitudeDirectionScale", "ExpMagnitudeDirectionScale",
                        "DirectionScale"), kind  # every law below is checked by hand; DirectionScale has none
        if kind == "DirectionScale":
            assert row.conserved is None
        if kind in ("PlainScale", "UnitOffsetScale"):
            expect = sum(column_sq(c.weight if c.axis == -1 else c.weight.transpose(-1, -2))
                         for c in row.view.consumers) - gamma.double().square()
            assert row.conserved.shape == expect.shape
            assert torch.allclose(row.conserved, expect, rtol=0, atol=REL * float(expect.abs().max()))
        if kind in ("MagnitudeDirectionScale", "ExpMagnitudeDirectionScale"):  # β² or 2b: one number
            b = float(row.view.vector.magnitude.detach().double())
            expect = sum(float(column_sq(c.weight).sum()) for c in row.view.consumers) - \
                (b ** 2 if kind == "MagnitudeDirectionScale" else 2 * b)
            assert row.conserved.numel() == 1 and close(float(row.conserved), expect, abs(expect))
        if row.view.role == "output":
            assert row.conserved is None and not row.view.folds and "stays" in row.view.reason
        else:
            assert row.view.folds and row.view.targets, row.view.key
    assert_fold_targets(model, rows)


@torch.no_grad()
def assert_fold_targets(model, rows) -> None:
    """Fold the model, then fold it again with one scale vector changed: exactly the weights named as that
    vector's targets change (and, for a vector that stays, only its own parameters)."""
    base = {n: p.detach().clone() for n, p in fold_scales(model).named_parameters()}
    for i, row in enumerate(rows):
        other = copy.deepcopy(model)
        vec = dict(zip(map(id, model.modules()), other.modules()))[id(row.view.vector)]
        gen = torch.Generator().manual_seed(100 + i)
        for p in vec.parameters():
            p.mul_(1.0 + 0.5 * torch.rand(p.shape, generator=gen))
        folded = dict(fold_scales(other).named_parameters())
        changed = {n for n, p in folded.items() if not torch.equal(p, base[n])}
        expect = {t.weight for t in row.view.targets} if row.view.folds else set(row.view.names)
        assert changed == expect, (row.view.key, changed, expect)


def test_roles_sites_fold_targets_and_conservation_by_weight_name():
    models = {case_id(*c): native(*c)[1] for c in CASES}
    rows = {name: {r.view.key: r for r in rows_of(m)} for name, m in models.items()}
    views = {name: {k: r.view for k, r in by_key.items()} for name, by_key in rows.items()}

    def by_hand(case: str, key: tuple, weights: list[str], rows_of_weight: bool = False) -> torch.Tensor:
        """Σ ‖w_j‖² over the named weights' columns (rows) minus γ_j², from the parameters themselves."""
        got = [models[case].get_parameter(n).detach().double() for n in weights]
        sq = sum((w.square().sum(-1) if rows_of_weight else w.square().sum(0)) for w in got)
        return sq - rows[case][key].view.vector().detach().double().square()

    key = (0, "attn_input", "shared", "input")
    want = by_hand("baseline", key, [f"blocks.0.attn.input.proj.{b}.weight" for b in "qkv"])
    assert torch.allclose(rows["baseline"][key].conserved, want, rtol=0, atol=REL * float(want.abs().max()))
    key = (1, "attn_proj", "v", "input")  # dp: u on v's rows
    want = by_hand("dp", key, ["blocks.1.attn.input.proj.v.weight"], rows_of_weight=True)
    assert torch.allclose(rows["dp"][key].conserved, want, rtol=0, atol=REL * float(want.abs().max()))
    head = models["unified"].get_parameter("final.proj.head.weight").detach().double()
    beta = float(models["unified"].final.scales["head"].magnitude.detach().double())
    want = float(head.square().sum()) - beta ** 2  # OR: one number, Σ_j ‖w_j‖² − β²
    assert close(float(rows["unified"][(-1, "final", "head", "input")].conserved), want, abs(want))
    base = views["baseline"]
    assert sorted(k for k in base if k[0] == 0) == [(0, "attn_input", "shared", "input"), (0, "mlp_input", "shared", "input")]
    assert [t.describe() for t in base[(0, "attn_input", "shared", "input")].targets] == [
        f"columns of blocks.0.attn.input.proj.{b}.weight" for b in "qkv"]
    assert [t.describe() for t in base[(-1, "final", "shared", "input")].targets] == ["columns of final.proj.head.weight"]
    uni = views["unified"]
    assert uni[(1, "attn_proj", "q", "output")].parameterization == "MagnitudeDirectionScale"
    assert uni[(1, "attn_input", "q", "input")].parameterization == "DirectionScale"  # no magnitude before a norm
    assert not uni[(1, "attn_proj", "k", "output")].folds
    assert [t.describe() for t in views["dp"][(0, "attn_proj", "v", "input")].targets] == [
        "rows of blocks.0.attn.input.proj.v.weight"]
    assert [t.describe() for t in views["unified_dnp_vup"][(0, "mlp_proj", "up", "input")].targets] == [
        "columns of blocks.0.mlp.down.weight"]
    assert views["sandwich"][(1, "mlp_output", "out", "output")].reason.startswith("a norm on the sublayer's output")
    assert [t.describe() for t in views["dnp-moe"][(0, "mlp_input", "shared", "input")].targets] == [
        f"columns of blocks.0.mlp.input.proj.{b}.weight" for b in ("router", "gate", "up")]
    assert [t.describe() for t in views["baseline-moe-expert"][(1, "mlp_input", "expert3", "input")].targets] == [
        "columns of blocks.1.mlp.input.proj.gate.weight[3]", "columns of blocks.1.mlp.input.proj.up.weight[3]"]


def test_a_tied_head_folds_into_the_head_only():
    spec, model = native("baseline", False, {}, tie_embeddings=True)
    rows = rows_of(model)
    assert [t.describe() for t in rows[-1].view.targets] == ["columns of final.proj.head.weight"]
    assert_fold_targets(model, rows)  # the embedding keeps its values: folding unties the head


def test_user_block_and_user_parameterization():
    """A user block with its own output norms (``extensions.blocks.SandwichBlock``: OutputNorm sites named
    ``attn_post``/``mlp_post``) and a user ScaleVector (``extensions.scales.SoftplusScale``, no conservation law)."""
    spec = spec_for("baseline", block="extensions.blocks.SandwichBlock", vocab_size=128)
    spec["strategy"]["vector"] = {"class_path": "extensions.scales.SoftplusScale"}
    model = perturbed(spec)
    rows = rows_of(model)
    assert {(r.view.site, r.view.role, r.view.parameterization) for r in rows if r.view.layer == 0} == {
        ("attn_input", "input", "SoftplusScale"), ("mlp_input", "input", "SoftplusScale"),
        ("attn_post", "output", "SoftplusScale"), ("mlp_post", "output", "SoftplusScale")}
    for row in rows:
        assert row.conserved is None
        if row.view.role == "input":
            assert row.conserved_note == "SoftplusScale conserves nothing that involves its consumers"
        for name, value in direct_stats(row.view.vector().detach()).items():
            assert close(row.stats[name], value), (row.view.key, name)
    assert_fold_targets(model, rows)


# -- the command: tables, CSV/JSON, figures -----------------------------------------------------------------------
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    """A complete PNG (signature, IHDR first, IEND last) of a drawn figure (not one flat colour)."""
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR" and data[-8:-4] == b"IEND", path
    width, height = struct.unpack(">II", data[16:24])
    assert width > 200 and height > 200, (path, width, height)
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width) and float(pixels[..., :3].std()) > 0.01, path


def test_cli_prints_a_table_per_role_and_writes_csv_json_and_figures(tmp_path):
    spec, model = native("unified", False, {})
    ckpt = write_ckpt(model, spec, tmp_path / "run.ckpt")
    rows = rows_of(model)
    code, out, err = run_main([str(ckpt), "--out", str(tmp_path / "report")])
    assert code == 0, err
    n_in = sum(r.view.role == "input" for r in rows)
    lines = out.splitlines()
    assert lines[0] == f"{ckpt}: checkpoint; 2 layers, width 64; MagnitudeDirectionScale, placement q: dual_norm, " \
                       "k: dual_norm, branch-specific (HG)"
    assert f"input-role scale vectors ({n_in})" in lines and f"output-role scale vectors ({len(rows) - n_in})" in lines
    assert lines.index(f"input-role scale vectors ({n_in})") < lines.index(f"output-role scale vectors ({len(rows) - n_in})")
    table = [line.split() for line in lines if line.startswith(("layer", "final")) and "site" not in line]
    assert [(t[0], t[1], t[2]) for t in table] == \
        [(r.view.layer_name, r.view.site, r.view.branch) for r in rows if r.view.role == "input"] + \
        [(r.view.layer_name, r.view.site, r.view.branch) for r in rows if r.view.role == "output"]
    q_out = next(t for t in table if t[1:3] == ["attn_proj", "q"])
    assert q_out[-2:] == ["stays", "(QK-norm)"]
    report = tmp_path / "report"
    assert out.rstrip().endswith(f"wrote {report}: scales.csv, scales.json, profile_input.png, heatmap_input.png, "
                                 "profile_output.png, heatmap_output.png")
    import csv

    with open(report / "scales.csv") as f:
        table_rows = list(csv.DictReader(f))
    assert [(int(r["layer"]), r["site"], r["branch"], r["role"]) for r in table_rows] == [r.view.key for r in rows]
    assert [float(r["rms"]) for r in table_rows] == [r.stats["rms"] for r in rows]
    data = json.loads((report / "scales.json").read_text())
    assert data["source"]["kind"] == "checkpoint" and data["source"]["n_layer"] == 2
    assert [d["gamma"] for d in data["rows"]] == [r.gamma.tolist() for r in rows]
    assert [d["folds"] for d in data["rows"]] == [r.view.role == "input" for r in rows]
    for name in ("profile_input", "heatmap_input", "profile_output", "heatmap_output"):
        assert_png(report / f"{name}.png")


def test_compare_two_checkpoints_deltas_and_alignment(tmp_path):
    spec, a = native("baseline", False, {}, seed=1)
    _, b = native("baseline", False, {}, seed=2)
    spec_hg, hg = native("hg", False, {}, seed=3)
    pa, pb, phg = (write_ckpt(m, s, tmp_path / f"{n}.ckpt") for m, s, n in ((a, spec, "a"), (b, spec, "b"), (hg, spec_hg, "hg")))
    code, out, err = run_main([str(pa), "--compare", str(pb), "--out", str(tmp_path / "ab")])
    assert code == 0, err
    data = json.loads((tmp_path / "ab" / "compare.json").read_text())
    ra, rb = rows_of(a), rows_of(b)
    assert [p["match"] for p in data["pairs"]] == ["exact"] * len(ra)
    for pair, x, y in zip(data["pairs"], ra, rb):
        ga, gb = x.view.vector().detach().double(), y.view.vector().detach().double()
        for stat in ("mean", "rms", "min", "max", "anisotropy"):
            assert close(pair[f"d_{stat}"], direct_stats(gb)[stat] - direct_stats(ga)[stat]), stat
        assert pair["dgamma_absmax"] == float((gb - ga).abs().max())
        assert close(pair["d_c_mean"], float(y.conserved.mean() - x.conserved.mean()))
    for name in ("profile_input", "heatmap_input_A", "heatmap_input_B", "heatmap_input_delta"):
        assert_png(tmp_path / "ab" / f"{name}.png")
    # two strategies: baseline's one γ per norm against hg's γ per branch
    code, out, err = run_main([str(pa), "--compare", str(phg)])
    assert code == 0, err
    matches = [line.split()[3] for line in out.splitlines() if line.startswith("layer00  attn_input")]
    assert matches == ["shared↔q", "shared↔k", "shared↔v"]
    assert any(line.startswith("final") and "shared↔head" in line for line in out.splitlines())


def test_a_model_without_scale_vectors_says_so_and_compares_as_only_b(tmp_path):
    spec, model = native("no_scale", False, {})
    bare = str(write_ckpt(model, spec, tmp_path / "bare.ckpt"))
    spec_b, base = native("baseline", False, {})
    code, out, err = run_main([bare])
    assert (code, out.splitlines()[2:]) == (0, ["no learnable scale vectors: every norm of this model has γ ≡ 1 "
                                                "(NoScale), nothing to fold"]), err
    code, out, err = run_main([bare, "--compare", str(write_ckpt(base, spec_b, tmp_path / "base.ckpt"))])
    rows = [line.split() for line in out.splitlines() if line.startswith(("layer", "final")) and "site" not in line]
    assert code == 0 and [(r[3], r[4], r[-1]) for r in rows] == [("only", "B", "folds")] * 5


# -- bad input ---------------------------------------------------------------------------------------------------
def test_bad_input_names_the_argument_and_the_fix(tmp_path):
    spec, model = native("baseline", False, {})
    ckpt = str(write_ckpt(model, spec, tmp_path / "m.ckpt"))
    spec3, model3 = native("baseline", False, {}, n_layer=3)
    deeper = str(write_ckpt(model3, spec3, tmp_path / "three.ckpt"))
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (tmp_path / "notes.txt").write_text("not a model\n")
    (tmp_path / "junk.ckpt").write_bytes(b"\x00\x01 not a zip archive" * 10)
    (tmp_path / "cut.ckpt").write_bytes(Path(ckpt).read_bytes()[:4000])
    (tmp_path / "empty").mkdir()
    hint = "give a .ckpt file of fit, a distributed checkpoint folder, a native export folder (scalevec_spec.json) or " \
           "a local Hugging Face model folder (config.json + safetensors)"
    cases = [
        ([str(tmp_path / "missing.ckpt")], 2, f"PATH: {str(tmp_path / 'missing.ckpt')!r}: does not exist; {hint}"),
        ([str(tmp_path / "gpt2")], 2, f"{tmp_path / 'gpt2' / 'config.json'}: architectures: ['GPT2LMHeadModel']: is not an "
         "architecture inspect reads; give a model of LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
         "MixtralForCausalLM, or a native checkpoint"),
        ([str(tmp_path / "notes.txt")], 2, f"PATH: {str(tmp_path / 'notes.txt')!r}: is a .txt file, not a checkpoint"),
        ([str(tmp_path / "junk.ckpt")], 2, f"PATH: {str(tmp_path / 'junk.ckpt')!r}: is not a checkpoint (a torch "
         f"checkpoint is a zip archive, this file is not one); {hint}"),
        ([ckpt, "--compare", str(tmp_path / "cut.ckpt")], 1, f"--compare: {str(tmp_path / 'cut.ckpt')!r}: is truncated "
         "or corrupt"),
        ([str(tmp_path / "empty")], 2, f"PATH: {str(tmp_path / 'empty')!r}: is a folder without .metadata"),
        ([ckpt, "--out", str(tmp_path / "notes.txt")], 2, f"--out: {str(tmp_path / 'notes.txt')!r}: is a file, not a "
         "folder; give a new or empty folder"),
        ([ckpt, "--out", str(tmp_path)], 2, f"--out: {str(tmp_path)!r}: contains the input {ckpt!r} (PATH)"),
        ([ckpt, "--compare", deeper], 2, f"--compare: {deeper!r}: has 3 layers and PATH {ckpt!r} has 2: the two cannot "
         "be aligned layer by layer; compare two checkpoints of the same architecture (e.g. two strategies, or one run "
         "before and after training)"),
    ]
    for argv, want_code, message in cases:
        code, out, err = run_main(argv)
        assert (code, out) == (want_code, ""), (argv, code, err)
        assert err.startswith(f"error: {message}") and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.ckpt", "empty", "gpt2", "junk.ckpt", "m.ckpt", "notes.txt",
                                                         "three.ckpt"]  # nothing written
