"""``CausalLM`` subclasses that override ``build_model``, chosen with ``model.class_path``:

- ``TemperatureLM``: a ``Transformer`` subclass with one parameter more (a learned output temperature) and a
  constructor argument (``temperature_init``);
- ``SoftCapLM``: a ``Transformer`` subclass without new parameters (logits soft-capped, ``cap``)."""
from __future__ import annotations

import math

import torch
from torch import nn

from scalevec_lit.lit import CausalLM
from scalevec_lit.model import Block, Transformer


class TemperatureTransformer(Transformer):
    """Logits divided by a learned temperature ``exp(log_temperature)`` (starts at ``temperature_init``)."""

    def __init__(self, config, strategy=None, block=Block, temperature_init: float = 1.0) -> None:
        super().__init__(config, strategy, block)
        self.init_args = {"temperature_init": temperature_init}  # recorded in checkpoints to rebuild this model
        self.temperature_init = temperature_init
        self.log_temperature = nn.Parameter(torch.empty(1))
        if not self.log_temperature.is_meta:  # on the meta device, reset_parameters() initializes it later
            self._init_temperature()

    def _init_temperature(self) -> None:
        with torch.no_grad():
            self.log_temperature.fill_(math.log(self.temperature_init))

    def init_weights(self) -> None:
        super().init_weights()
        if hasattr(self, "log_temperature"):  # (the base constructor runs this before the parameter exists)
            self._init_temperature()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx) * torch.exp(-self.log_temperature)

    def forward_cached(self, idx: torch.Tensor, cache) -> torch.Tensor:
        return super().forward_cached(idx, cache) * torch.exp(-self.log_temperature)


class TemperatureLM(CausalLM):
    """``CausalLM`` training a ``TemperatureTransformer``; ``temperature_init`` is a recipe key of its own."""

    def __init__(self, *args, temperature_init: float = 2.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.temperature_init = temperature_init

    def build_model(self) -> TemperatureTransformer:
        return TemperatureTransformer(self.config, self.strategy, self.block, temperature_init=self.temperature_init)


class ForwardOnlyTemperature(TemperatureTransformer):
    """The same model with ``forward`` overridden but not ``forward_cached``: decoding with the cache would skip
    the temperature, so ``generate()`` runs without it."""

    forward_cached = Transformer.forward_cached


class SoftCapTransformer(Transformer):
    """Logits soft-capped as Gemma 2's: ``cap · tanh(logits / cap)``; no parameter of its own."""

    def __init__(self, config, strategy=None, block=Block, cap: float = 30.0) -> None:
        super().__init__(config, strategy, block)
        self.init_args = {"cap": cap}
        self.cap = cap

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.cap * torch.tanh(super().forward(idx) / self.cap)

    def forward_cached(self, idx: torch.Tensor, cache) -> torch.Tensor:
        return self.cap * torch.tanh(super().forward_cached(idx, cache) / self.cap)


class SoftCapLM(CausalLM):
    def __init__(self, *args, cap: float = 30.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cap = cap

    def build_model(self) -> SoftCapTransformer:
        return SoftCapTransformer(self.config, self.strategy, self.block, cap=self.cap)
