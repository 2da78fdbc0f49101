"""Scale-vector parameterizations: small modules that own their parameters and return γ.

The ``ScaleVector`` contract (every parameterization, shipped or user-written, keeps it; nothing in the library
asks which class a vector is):

- **construction and initialisation**: ``__init__(dim, ...)`` creates the parameters already initialised;
  ``reset_parameters()`` puts them back to that initial state (``NormSite.init_weights`` and a model built on
  the meta device call it; a class with parameters needs it there, a class without one is left as built).
  Every shipped class starts at γ ≡ 1.
- **the γ it produces**: ``forward()`` (called with no argument) returns the effective scale vector γ of shape
  ``[dim]``, differentiable in the parameters; the sites multiply by it (or fold it into weights).
- **its parts and their roles**: ``parts()`` maps part name → parameter. A part's name says what it carries and
  is how decay rules, optimizer groups and monitor tags address it (``ScaleInfo.part``): ``scale`` (γ itself, or
  an offset of it: the whole vector), ``magnitude`` (γ's size, a scalar), ``direction`` (γ's direction,
  scale-invariant). Default: every direct parameter under its attribute name. The *site* decides the role of
  the whole vector (``input``: a linear map absorbs it; ``output``: none does), never the parameterization.
- **identity**: ``is_identity`` is True only for a parameterization that is γ ≡ 1 with no parameter
  (``NoScale``): callers then skip the multiply.
- **the inverse**: ``set_gamma_(gamma)`` sets the parameters so that ``forward()`` returns ``gamma`` (up to rounding
  of the vector's dtype) and returns True, or returns False and changes nothing when no parameter value produces
  that γ (a direction-only vector and a γ of RMS ≠ 1, an ``exp`` magnitude and γ ≡ 0, ``NoScale`` and γ ≠ 1,
  exactly). A γ with a NaN or Inf entry is an error, not a γ to hold: the shipped classes raise ``ValueError``
  naming the class and change nothing (``check_finite``), and ``scale.convert.set_scale_`` checks it before any
  class's inverse runs. **What it may read**: its own parameters, which always hold valid values: in ``convert``
  (and ``import --strategy``, which converts) the vector is as its class constructs it (``__init__``, i.e.
  ``reset_parameters``'s state) when its inverse runs, so an inverse may keep some parameters and solve for the
  others (a low-rank γ = 1 + U v that keeps its basis U and solves for v; a trim it leaves as it is); elsewhere they
  hold whatever the vector held before. It is called under ``torch.no_grad()``, with ``gamma`` of shape ``[dim]`` in
  the vector's dtype (float64 in ``convert``). ``convert`` and ``import`` write every scale through it
  (``scale.convert.set_scale_``, which also checks the result and restores the parameters when the inverse says
  False or claims a γ it does not produce). A class that does not implement it *says so*: ``invertible`` is False
  and ``set_gamma_`` raises ``NoInverse`` naming the class; ``convert`` then refuses a target strategy that uses it,
  by name (converting to the same strategy is a copy and needs no inverse).
- optional: ``without_magnitude()`` (the class without its separate magnitude, for a γ whose size its consumers
  see only through a norm's ε) and ``conserved(...)`` (what gradient flow conserves, for the monitor).

New parameterizations are new subclasses, chosen in YAML with ``class_path`` (see ``ScaleStrategy.vector``);
nothing else in the library needs to change.

Plain torch only: must not import Lightning or anything above ``scalevec_lit.scale``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["DirectionScale", "ExpMagnitudeDirectionScale", "MagnitudeDirectionScale", "NoInverse", "NoScale",
           "PlainScale", "ScaleVector", "UnitOffsetScale", "check_finite"]


class NoInverse(NotImplementedError):
    """A ``ScaleVector`` class without ``set_gamma_``: nothing can set it to a given γ."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        super().__init__(
            f"{cls.__module__}.{cls.__qualname__} has no inverse (ScaleVector.set_gamma_): nothing can set it to a "
            "given γ; implement set_gamma_(gamma) -> bool in the class (set the parameters so that forward() returns "
            "gamma, or return False when none does)")


def check_finite(vector: "ScaleVector", gamma: torch.Tensor) -> None:
    """Raise ``ValueError`` (one line: the class, the entries, the fix) when ``gamma`` has a NaN or an Inf entry: no
    parameter value of a scale vector should hold one. Every shipped ``set_gamma_`` calls it first, and
    ``scale.convert.set_scale_`` before any class's inverse."""
    bad = ~torch.isfinite(gamma)
    if bool(bad.any()):
        cls, where = type(vector), bad.flatten().nonzero()[:3].flatten().tolist()
        raise ValueError(f"{cls.__module__}.{cls.__qualname__}.set_gamma_: γ has {int(bad.sum())} non-finite "
                         f"entr{'y' if int(bad.sum()) == 1 else 'ies'} (NaN or Inf; first at index "
                         f"{', '.join(map(str, where))}), which no scale vector holds; nothing was changed: take γ "
                         "from a model whose values are finite (a checkpoint written before the values diverged)")


class ScaleVector(nn.Module):
    """Base class of every parameterization of a scale vector γ (the module docstring states the whole contract).

    A subclass creates its parameters, already initialised, in ``__init__(dim, ...)``; the model is first built on
    the meta device, so ``__init__`` never reads the value of a parameter or of a tensor made with a shape. It
    implements ``forward()`` (no argument: γ of shape ``[dim]``, differentiable in the parameters) and, when it has
    parameters, ``reset_parameters()`` (the base has none): it puts them back, in place and under
    ``torch.no_grad()``, to the state ``__init__`` builds, reading only the constructor's arguments (kept as
    attributes). For ``convert`` and ``import`` it implements ``set_gamma_``, the inverse (what it may read: see
    that method). The name of each parameter (``parts()``: ``scale``, ``magnitude``, ``direction``) is how decay
    rules, optimizer groups and monitor tags address it; the site, not the class, gives the vector its role.

    ``is_identity`` is True for parameterizations that are γ ≡ 1 without parameters (``NoScale``), so that
    callers skip the multiply entirely. ``conserved`` names the quantity that gradient flow conserves
    between the vector and the weights that read it (the monitor logs its drift).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = int(dim)

    def forward(self) -> torch.Tensor:  # pragma: no cover - abstract
        """γ, shape ``[dim]``."""
        raise NotImplementedError

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        """The inverse: set the parameters so that ``forward()`` returns ``gamma`` and return True; return False
        (parameters unchanged) when no parameter value produces it; raise ``ValueError`` for a non-finite γ
        (``check_finite``). Called under ``torch.no_grad()``; it may read the parameters it keeps, which hold
        valid values (in ``convert``: as the class constructs them). The base class has none (``invertible`` is
        False): it raises ``NoInverse``."""
        raise NoInverse(type(self))

    @classmethod
    def invertible(cls) -> bool:
        """True when the class implements ``set_gamma_`` (the inverse that ``convert`` writes through)."""
        return cls.set_gamma_ is not ScaleVector.set_gamma_

    def parts(self) -> dict[str, nn.Parameter]:
        """Map part name -> parameter. Default: every direct parameter, by its attribute name."""
        return dict(self.named_parameters(recurse=False))

    @property
    def is_identity(self) -> bool:
        """True when γ ≡ 1 with no parameter: the caller may skip the multiply."""
        return False

    def without_magnitude(self) -> "ScaleVector | None":
        """The same parameterization without its separate magnitude (a new module), or ``None`` when it has
        none. Used in front of a normalization of every consumer's output (``ScaleStrategy.magnitude_before_norm``),
        where the function sees γ's size only through that norm's ε (``DirectionScale``): a magnitude there would
        get a gradient about 1e-6 of the other scales' and decay would shrink it nearly unopposed."""
        return None

    def conserved(self, col_sq: torch.Tensor, gamma: torch.Tensor, parts: dict[str, torch.Tensor]):
        """What plain gradient flow (no decay) conserves, given ``col_sq[j] = Σ_consumers ‖w_j‖²`` (float64),
        the full γ and the full parts; ``None`` when the parameterization conserves nothing useful.

        The law comes from a symmetry: the loss sees the consumers only through ``W diag γ``, so any change
        of the parameters that rescales γ_j while ``w_j`` rescales inversely leaves it unchanged.
        """
        return None

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class NoScale(ScaleVector):
    """γ ≡ 1, no parameter (the paper's 'remove scale vectors' ablation)."""

    def forward(self) -> torch.Tensor:
        return torch.ones(self.dim)

    @property
    def is_identity(self) -> bool:
        return True

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        """Only γ ≡ 1, exactly (a γ of 1 + 1e-3, or one rounding step away from 1, is refused: False)."""
        check_finite(self, gamma)
        return bool(torch.equal(gamma, torch.ones_like(gamma)))


class PlainScale(ScaleVector):
    """The standard learnable gain: γ = w, w initialised to ``init`` (1)."""

    def __init__(self, dim: int, init: float = 1.0) -> None:
        super().__init__(dim)
        self.init = float(init)
        self.scale = nn.Parameter(torch.full((dim,), self.init))

    def forward(self) -> torch.Tensor:
        return self.scale

    def reset_parameters(self) -> None:
        """``w = init`` (γ ≡ ``init``), the state ``__init__`` builds."""
        nn.init.constant_(self.scale, self.init)

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        """``w = γ``: every finite γ."""
        check_finite(self, gamma)
        self.scale.copy_(gamma)
        return True

    def conserved(self, col_sq, gamma, parts):
        """``c_j = ‖w_j‖² − γ_j²`` per channel (γ_j → c γ_j, w_j → w_j / c)."""
        return col_sq - gamma.square()


class UnitOffsetScale(ScaleVector):
    """Gemma's form: γ = 1 + w, w initialised to 0 (weight decay then pulls γ toward 1, not 0)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.scale = nn.Parameter(torch.zeros(dim))

    def forward(self) -> torch.Tensor:
        return 1.0 + self.scale

    def reset_parameters(self) -> None:
        """``w = 0`` (γ ≡ 1), the state ``__init__`` builds."""
        nn.init.zeros_(self.scale)

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        """``w = γ − 1``: every finite γ."""
        check_finite(self, gamma)
        self.scale.copy_(gamma - 1.0)
        return True

    def conserved(self, col_sq, gamma, parts):
        """``‖w_j‖² − γ_j²`` as for a plain γ: the offset moves γ exactly as its parameter moves."""
        return col_sq - gamma.square()


def _unit_rms(alpha: torch.Tensor, eps: float) -> torch.Tensor:
    return alpha * torch.rsqrt(alpha.pow(2).mean() + eps)


class DirectionScale(ScaleVector):
    """γ = α / RMS(α): a direction only, α initialised to 1 (so γ starts at exactly 1). What a
    magnitude-direction parameterization becomes in front of a normalization that divides γ's size out
    (``without_magnitude``): there a size is seen only through that norm's ε. A per-head norm computes
    a / √(mean a² + ε); with γ (so a) scaled by c it gives a / √(mean a² + ε / c²), so each head's output moves by
    the factor √((m + ε) / (m + ε / c²)), m = mean a² of that head: less than ε (1 − 1/c²) / (2 m) relative, a
    few 1e-6 at initialisation widths, never zero (docs/PAPER.md §3). The RMS of α is floored at 1e-12 (α = 0), not
    shifted by an ε, so that any γ of unit RMS, γ ≡ 1 included, is held exactly (``scale.convert.set_scale_``)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.direction = nn.Parameter(torch.ones(dim))

    def forward(self) -> torch.Tensor:
        return self.direction * torch.rsqrt(self.direction.pow(2).mean().clamp_min(1e-24))

    def reset_parameters(self) -> None:
        """``α = 1`` (γ ≡ 1), the state ``__init__`` builds."""
        nn.init.ones_(self.direction)

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        """``α = γ``, for a γ of unit RMS only (γ ≡ 1 included): a direction cannot hold a size (False, α unchanged)."""
        check_finite(self, gamma)
        if float((gamma.double().pow(2).mean() - 1.0).abs()) > 64 * torch.finfo(gamma.dtype).eps:
            return False
        self.direction.copy_(gamma)
        return True


def _set_magnitude_direction_(vec, gamma: torch.Tensor, exp: bool) -> bool:
    """``α = γ / RMS(γ)``, ``β = RMS(γ)·√(1 + ε)`` (the ε inside ``RMS(α) = √(mean α² + ε)`` undone exactly; α carries
    the signs, β > 0); ``b = ln β`` for the exp form, which cannot hold γ ≡ 0."""
    check_finite(vec, gamma)
    rms = float(gamma.double().pow(2).mean().sqrt())
    if not math.isfinite(rms) or (rms == 0.0 and exp):
        return False
    if rms == 0.0:
        vec.magnitude.fill_(0.0)
        vec.direction.fill_(1.0)
        return True
    beta = rms * math.sqrt(1.0 + vec.eps)  # γ = β α / √(mean α² + ε) with mean α² = 1
    vec.direction.copy_(gamma / rms)
    vec.magnitude.fill_(math.log(beta) if exp else beta)
    return True


class MagnitudeDirectionScale(ScaleVector):
    """OR (our form of the paper's magnitude-direction split): γ = β · α / RMS(α).

    β is a scalar magnitude (init ``magnitude_init``), α a direction vector (init 1), so γ starts at β.
    The exact formula of the paper is not public; this is the project's stated interpretation.
    """

    def __init__(self, dim: int, magnitude_init: float = 1.0, eps: float = 1e-12) -> None:
        super().__init__(dim)
        self.magnitude_init = float(magnitude_init)
        self.eps = float(eps)
        self.magnitude = nn.Parameter(torch.full((1,), self.magnitude_init))
        self.direction = nn.Parameter(torch.ones(dim))

    def forward(self) -> torch.Tensor:
        return self.magnitude * _unit_rms(self.direction, self.eps)

    def reset_parameters(self) -> None:
        """``β = magnitude_init``, ``α = 1`` (γ ≡ β up to ``eps``), the state ``__init__`` builds."""
        nn.init.constant_(self.magnitude, self.magnitude_init)
        nn.init.ones_(self.direction)

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        return _set_magnitude_direction_(self, gamma, exp=False)

    def without_magnitude(self) -> ScaleVector:
        return DirectionScale(self.dim)

    def conserved(self, col_sq, gamma, parts):
        """One number: ``Σ_j ‖w_j‖² − β²`` (β → c β, every consumer column → w / c); the direction has
        its own (‖α‖², scale-invariant), which says nothing about the consumers and is not logged."""
        return (col_sq.sum() - parts["magnitude"].square().sum()).reshape(1)


class ExpMagnitudeDirectionScale(ScaleVector):
    """ER (our form): γ = exp(b) · α / RMS(α), scalar b (init 0), vector α (init 1)."""

    def __init__(self, dim: int, eps: float = 1e-12) -> None:
        super().__init__(dim)
        self.eps = float(eps)
        self.magnitude = nn.Parameter(torch.zeros(1))
        self.direction = nn.Parameter(torch.ones(dim))

    def forward(self) -> torch.Tensor:
        return self.magnitude.exp() * _unit_rms(self.direction, self.eps)

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        return _set_magnitude_direction_(self, gamma, exp=True)

    def without_magnitude(self) -> ScaleVector:
        return DirectionScale(self.dim)

    def conserved(self, col_sq, gamma, parts):
        """One number: ``Σ_j ‖w_j‖² − 2 b`` (b → b + ln c, every consumer column → w / c)."""
        return (col_sq.sum() - 2.0 * parts["magnitude"].sum()).reshape(1)

    def reset_parameters(self) -> None:
        """``b = 0``, ``α = 1`` (γ ≡ 1 up to ``eps``), the state ``__init__`` builds."""
        nn.init.zeros_(self.magnitude)
        nn.init.ones_(self.direction)
