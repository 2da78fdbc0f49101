"""``HFArchitecture``: what one Hugging Face architecture adapter knows, with the Llama layout as default.

An adapter states what its architecture holds (class attributes read by the plan and by the hints of the
other adapters), and implements both directions through one name table:

- the plan (``check``): every site of a folded model that it cannot hold, named with its layers and the
  fix; ``fits`` says whether the model's shape (dense or MoE, router, QK-norm) is its kind at all;
- the names (``names``): every tensor of its checkpoint with where it lives in our model (``Ref``), read
  by export (``export_tensor``) and import alike;
- ``config.json`` both ways: ``hf_config`` (export) and ``config_from_hf`` (import; every option we
  cannot hold is refused with its key).

The five shipped architectures share the Llama layout implemented here; each file next to this one only
states its differences. Plain torch: must not import Lightning or transformers.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..errors import UserError
from ..model.attention import CausalSelfAttention
from ..model.block import Block
from ..model.config import MoEConfig, TransformerConfig
from ..model.mlp import SwiGLU
from ..model.transformer import Transformer
from ..scale.registry import scale_parameters
from ..scale.strategy import NORMALIZED_PLACEMENT as DNP
from .names import Ref, native_tensor, site_of
from ._plan import ModelFacts, Refusals, head_norm_weight, join_or, moe_class
from ._registry import architectures

UNSUPPORTED = "has no equivalent in scalevec_lit's model"


def refuse(where: str, key: str, value: Any, problem: str, fix: str) -> UserError:
    """An import refusal naming ``config.json``'s key (exit 2)."""
    return UserError(f"{where}: {key}", repr(value), problem, fix)


class HFArchitecture:
    """One transformers architecture (subclass it, set the class attributes, override what differs, and
    decorate the class with ``scalevec_lit.arch.register``).

    Export calls ``fits``, then ``check`` (per block ``check_attention`` and ``check_dense`` or ``check_moe``, then
    ``check_moe_model``) on the folded model, then writes the rows of ``names`` through ``export_tensor`` and
    ``hf_config`` (its ``config_extra``); import, when ``importable``, reads ``config_from_hf`` (``import_checks``,
    ``moe_from_hf``, ``qk_norm_from_hf``) and the same ``names``. A site is read through ``NormSite.factors`` (and
    the scale registry), never through its attributes. The registry holds one instance, made with no argument."""

    architecture: str = ""  #: the transformers class, config.json's ``architectures``
    model_type: str = ""  #: config.json's ``model_type``
    title: str = ""  #: its name in messages
    priority: int = 100  #: the first of several that hold a model is chosen (shipped ones: 10..50)
    models: tuple[type, ...] = (Transformer,)  #: the model classes it reads (exact types)
    blocks: tuple[type, ...] = (Block,)  #: the block classes it reads (exact types)
    importable: bool = True  #: ``import`` reads it
    # what it holds
    moe: bool = False  #: MoE layers (else dense only)
    router: Optional[str] = None  #: the MoE router's score
    qk_norm: Optional[bool] = False  #: True: always, False: never, None: a config.json flag
    shared_experts: bool = False
    selection_bias: bool = False  #: an expert selection bias (aux-loss-free balancing)
    dense_first_layers: bool = False  #: dense MLPs in the first layers of an MoE model
    unnormalized_routing: bool = False  #: top-k weights not divided by their sum
    # names (Llama layout): the MoE MLP's prefix and the expert maps' names gate / up / down
    moe_prefix: str = "mlp"
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")

    # -- the plan -------------------------------------------------------------------------------------
    def fits(self, facts: ModelFacts) -> bool:
        """The model is this architecture's kind (dense or MoE, router, QK-norm); ``check`` says the rest."""
        return (self.moe == facts.moe and (not self.moe or self.router == facts.router)
                and (self.qk_norm is None or self.qk_norm == facts.qk_norm))

    def reached_from(self, facts: ModelFacts) -> str:
        """What a recipe changes so that this architecture fits a model with ``facts`` ('' when it does)."""
        steps = [f"router: {self.router}"] if self.moe and self.router != facts.router else []
        if self.qk_norm is True and not facts.qk_norm:
            steps.append(f"train with placement.q and placement.k: {DNP} and output_shape: head")
        elif self.qk_norm is False and facts.qk_norm:
            steps.append("train with placement.q and placement.k: input")
        return " and ".join(steps)

    def elsewhere(self, facts: ModelFacts, holds: Callable[["HFArchitecture"], bool]) -> str:
        """', or <change> (then <title> holds it)' for every other registered architecture that holds what
        this one refuses."""
        out = ""
        for other in architectures():
            change = other.reached_from(facts) if other is not self and other.moe == facts.moe and holds(other) else ""
            out += f", or {change} (then {other.title} holds it)" if change else ""
        return out

    @staticmethod
    def every_title() -> str:
        """The registered architectures, for a message ('Llama, Qwen3 or Mixtral')."""
        return join_or(a.title for a in architectures())

    def check(self, model, facts: ModelFacts, r: Refusals) -> None:
        """Add to ``r`` every site of the folded ``model`` that this architecture cannot hold."""
        moe_cls = moe_class()
        for i, block in enumerate(model.blocks):
            attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
            if type(attn) is not CausalSelfAttention:
                r.add(f"block.attn: {type(attn).__qualname__} is not CausalSelfAttention", i)
            else:
                self.check_attention(attn, i, facts, r)
            if type(mlp) is SwiGLU:
                self.check_dense(mlp, i, facts, r)
            elif moe_cls is not None and type(mlp) is moe_cls:
                self.check_moe(mlp, i, facts, r)
            else:
                r.add(f"block.mlp: {type(mlp).__qualname__} is neither SwiGLU nor MoE", i)
        if facts.moe:
            self.check_moe_model(model.config.moe, facts, r)

    def check_attention(self, attn, i: int, facts: ModelFacts, r: Refusals) -> None:
        """Add to ``r`` (``r.add(problem, i)``, a phrase that ends with the fix) what this architecture cannot hold in
        block ``i``'s attention ``attn`` (a ``CausalSelfAttention``): a sublayer output norm, DNP on v, QK-norm on one
        of q and k only, a channel-shaped u on q/k that differs between heads. An override may call ``super()``."""
        site = attn.input
        if attn.out_norm is not None:
            r.add("attn_output: a sublayer output norm (model.strategy.sublayer_output_norm: true) has no place in "
                  f"{self.every_title()}; set it to false", i)
        q, k, v = (site.factors(b) for b in ("q", "k", "v"))
        if v.normalized:
            r.add(f"attn_proj.v: DNP on v ({v.setting}) normalizes v per head, which no "
                  "standard architecture does; use input, output or dual there", i)
        if q.normalized != k.normalized:
            bare = k if q.normalized else q
            r.add(f"attn_proj.{bare.name}: QK-norm normalizes both q and k, but {bare.setting}; "
                  f"set placement.q and placement.k both to {DNP}, or neither", i)
        elif q.normalized:
            for branch in ("q", "k"):
                amount = head_norm_weight(site, branch, attn.head_dim)[1]
                if amount > 0:
                    r.add(f"attn_proj.{branch}: its output scale u (model.strategy.output_shape: 'channel') differs "
                          f"between heads (by up to {{amount}}), while {self.title}'s {branch}_norm holds one weight "
                          "of size head_dim shared by all heads; train with model.strategy.output_shape: head", i, amount)

    DNP_PROBLEM = "normalizes its output, which no standard architecture does; use input, output or dual there"

    def check_dense(self, mlp, i: int, facts: ModelFacts, r: Refusals) -> None:
        """Add to ``r`` what this architecture cannot hold in block ``i``'s dense MLP ``mlp`` (a ``SwiGLU``): a
        sublayer output norm, DNP on gate or up."""
        self._output_norm(mlp, i, r)
        for branch in ("gate", "up"):
            f = mlp.input.factors(branch)
            if f.normalized:
                r.add(f"mlp_proj.{branch}: DNP on {branch} ({f.setting}) {self.DNP_PROBLEM}", i)

    def _output_norm(self, mlp, i: int, r: Refusals) -> None:
        if mlp.out_norm is not None:
            r.add("mlp_output: a sublayer output norm (model.strategy.sublayer_output_norm: true) has no place in "
                  f"{self.every_title()}; set it to false", i)

    def check_moe(self, mlp, i: int, facts: ModelFacts, r: Refusals) -> None:
        """Add to ``r`` what this architecture cannot hold in block ``i``'s MoE MLP ``mlp``: a sublayer output norm,
        DNP on the experts' gate or up or on the router, shared experts or a nonzero selection bias where the class
        attributes (``shared_experts``, ``selection_bias``) say it has none, naming the architectures that do."""
        self._output_norm(mlp, i, r)
        site = mlp.input
        for branch in ("gate", "up"):
            f = site.factors(branch)
            if f.normalized:
                r.add(f"mlp_proj.expert*_{branch}: DNP on the experts' {branch} ({f.setting}) {self.DNP_PROBLEM}", i)
        router = site.factors("router")
        if router.normalized:
            r.add(f"mlp_proj.router: DNP on the router ({router.setting}) {self.DNP_PROBLEM}", i)
        if mlp.shared_down is not None and not self.shared_experts:
            r.add(f"the shared experts (model.config.moe.num_shared_experts > 0) have no place in {self.title} "
                  f"(routed experts only); set num_shared_experts: 0"
                  f"{self.elsewhere(facts, lambda a: a.shared_experts)}", i)
        bias = getattr(mlp, "expert_bias", None)
        if bias is not None and bool(bias.abs().max() > 0) and not self.selection_bias:
            r.add("the expert selection bias (model.config.moe.bias_balancing: true, max |bias| {amount}) shifts "
                  f"which experts are chosen, and the {self.title} router holds no such bias; train with "
                  f"bias_balancing: false{self.elsewhere(facts, lambda a: a.selection_bias)}", i,
                  float(bias.abs().max()))

    def check_moe_model(self, moe: MoEConfig, facts: ModelFacts, r: Refusals) -> None:
        """Model-wide MoE options (no layer list in the message)."""
        if moe.first_dense_layers and not self.dense_first_layers:
            r.add(f"the dense MLPs of the first {moe.first_dense_layers} layers (model.config.moe.first_dense_layers)"
                  f" have no place in {self.title}; set first_dense_layers: 0"
                  f"{self.elsewhere(facts, lambda a: a.dense_first_layers)}", None)
        if not moe.route_norm and not self.unnormalized_routing:
            r.add(f"model.config.moe.route_norm: false leaves the top-k weights unnormalized, while {self.title} "
                  f"always normalizes them; set route_norm: true{self.elsewhere(facts, lambda a: a.unnormalized_routing)}",
                  None)

    def kept_scales(self, model, facts: ModelFacts) -> set[int]:
        """``id`` of every scale vector left after folding that this architecture's weights hold: the q/k
        output scales, as QK-norm weights (read from the registry: role, site and branch)."""
        if not facts.qk_norm:
            return set()
        return {id(sp.vector) for sp in scale_parameters(model)
                if sp.info.site == "attn_proj" and sp.info.branch in ("q", "k") and sp.info.layer >= 0}

    # -- the name table ---------------------------------------------------------------------------------
    def names(self, model, qk_norm: bool) -> list[tuple[str, Ref]]:
        """Every tensor name of a checkpoint for ``model``'s shape, with where it lives in ``model``; MoE
        layers are those whose MLP has experts; ``lm_head.weight`` only for an untied head."""
        rows: list[tuple[str, Ref]] = [("model.embed_tokens.weight", Ref("embed"))]
        for i, block in enumerate(model.blocks):
            p = f"model.layers.{i}."
            rows.append((p + "input_layernorm.weight", Ref("norm", i, "attn")))
            rows += [(p + f"self_attn.{n}_proj.weight", Ref("weight", i, "attn", n)) for n in ("q", "k", "v")]
            rows.append((p + "self_attn.o_proj.weight", Ref("o", i)))
            if qk_norm:
                rows += [(p + f"self_attn.{b}_norm.weight", Ref("head_norm", i, "attn", b)) for b in ("q", "k")]
            rows.append((p + "post_attention_layernorm.weight", Ref("norm", i, "mlp")))
            experts = getattr(block.mlp, "num_experts", 0)
            rows += self.moe_names(p, i, experts) if experts else [
                (p + "mlp.gate_proj.weight", Ref("weight", i, "mlp", "gate")),
                (p + "mlp.up_proj.weight", Ref("weight", i, "mlp", "up")),
                (p + "mlp.down_proj.weight", Ref("down", i))]
        rows.append(("model.norm.weight", Ref("norm", sublayer="final")))
        if not model.tied:
            rows.append(("lm_head.weight", Ref("weight", sublayer="final", branch="head")))
        return rows

    def moe_names(self, p: str, i: int, experts: int) -> list[tuple[str, Ref]]:
        """The rows of layer ``i``'s MoE MLP (``p``: the layer's prefix): router, then each expert."""
        rows = [(p + f"{self.moe_prefix}.gate.weight", Ref("weight", i, "mlp", "router"))]
        for e in range(experts):
            gate, up, down = (p + f"{self.moe_prefix}.experts.{e}.{n}.weight" for n in self.expert_names)
            rows += [(gate, Ref("weight", i, "mlp", "gate", e)), (up, Ref("weight", i, "mlp", "up", e)),
                     (down, Ref("expert_down", i, expert=e))]
        return rows

    # -- export -----------------------------------------------------------------------------------------
    def export_tensor(self, model, ref: Ref) -> torch.Tensor:
        """What export writes for one row: folded norms are bare RMS (a norm weight of ones); a QK-norm
        weight is the per-head u."""
        if ref.kind == "norm":
            return torch.ones(model.config.n_embd)
        if ref.kind == "head_norm":
            return head_norm_weight(site_of(model, ref), ref.branch, model.config.head_dim)[0]
        t = native_tensor(model, ref)
        if t is None:
            raise RuntimeError(f"{self.architecture}: {ref} has no tensor in this model (a gap in the name table)")
        return t

    def hf_config(self, model, qk_norm: bool, eos_id: Optional[int], dtype: str) -> dict[str, Any]:
        """``config.json`` of the folded ``model``: the keys every Llama-layout architecture has, then
        ``config_extra``'s."""
        c, s = model.config, model.strategy
        config: dict[str, Any] = {
            "architectures": [self.architecture], "model_type": self.model_type, "vocab_size": c.vocab_size,
            "hidden_size": c.n_embd, "intermediate_size": c.intermediate_size, "num_hidden_layers": c.n_layer,
            "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head, "head_dim": c.head_dim,
            "hidden_act": "silu", "max_position_embeddings": c.seq_len, "rms_norm_eps": s.eps,
            "rope_theta": c.rope_theta,  # transformers < 5 reads this; 5.x reads rope_parameters
            "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
            "tie_word_embeddings": model.tied, "attention_bias": False, "attention_dropout": 0.0,
            "initializer_range": c.init_std, "use_cache": True, "bos_token_id": None, "eos_token_id": eos_id,
            "pad_token_id": None, "dtype": dtype,
        }
        config.update(self.config_extra(model, qk_norm))
        return config

    def config_extra(self, model, qk_norm: bool) -> dict[str, Any]:
        """This architecture's own ``config.json`` keys (replacing common ones of the same name)."""
        return {}

    # -- import -----------------------------------------------------------------------------------------
    def import_checks(self, cfg: dict[str, Any]) -> list[tuple[str, Any, Any, str]]:
        """``(key, value, the only value we hold, why)`` for every option of ``cfg`` to check."""
        return [("hidden_act", cfg.get("hidden_act", "silu"), "silu", "SwiGLU with SiLU is the only MLP"),
                ("attention_bias", bool(cfg.get("attention_bias", False)), False, "q/k/v/o have no bias"),
                ("mlp_bias", bool(cfg.get("mlp_bias", False)), False, "the MLP maps have no bias"),
                ("use_sliding_window", bool(cfg.get("use_sliding_window", False)), False, "attention is full"),
                ("attention_dropout", float(cfg.get("attention_dropout", 0.0) or 0.0), 0.0, "there is no dropout")]

    def moe_from_hf(self, cfg: dict[str, Any], where: str) -> Optional[MoEConfig]:
        """The MoE config of ``cfg`` (None: dense)."""
        return None

    def qk_norm_from_hf(self, cfg: dict[str, Any]) -> bool:
        """Whether a checkpoint with ``config.json`` ``cfg`` has QK-norm (imported as DNP on q and k with a per-head
        u). Default: the class attribute ``qk_norm``; an importable adapter whose ``qk_norm`` is None (a
        ``config.json`` flag) overrides it to read that flag."""
        return bool(self.qk_norm)

    def config_from_hf(self, cfg: dict[str, Any], where: str = "config.json") -> tuple[TransformerConfig, dict[str, Any]]:
        """``(TransformerConfig, strategy as spec data)`` holding a checkpoint of this architecture as it is:
        one plain γ per norm, QK-norm as DNP on q/k with a per-head u."""
        for key, value, want, why in self.import_checks(cfg):
            if value != want:
                raise refuse(where, key, value, f"{UNSUPPORTED} ({why})", f"only {want!r} can be imported")
        if any(t != "full_attention" for t in cfg.get("layer_types") or []):
            raise refuse(where, "layer_types", sorted(set(cfg["layer_types"])), f"{UNSUPPORTED} (attention is full)",
                         "only full_attention layers can be imported")
        rope = dict(cfg.get("rope_parameters") or {})
        for key, params in (("rope_scaling", cfg.get("rope_scaling") or {}), ("rope_parameters", rope)):
            kind = params.get("rope_type", params.get("type", "default"))
            if kind != "default":
                raise refuse(where, f"{key}.rope_type", kind, f"{UNSUPPORTED} (RoPE is unscaled)",
                             "only rope_type 'default' can be imported")
            if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
                raise refuse(where, f"{key}.partial_rotary_factor", params["partial_rotary_factor"],
                             f"{UNSUPPORTED} (RoPE covers the whole head)", "only 1.0 can be imported")
        n_embd, n_head = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        config = TransformerConfig(
            vocab_size=int(cfg["vocab_size"]), seq_len=int(cfg.get("max_position_embeddings", 2048)),
            n_layer=int(cfg["num_hidden_layers"]), n_embd=n_embd, n_head=n_head,
            n_kv_head=int(cfg.get("num_key_value_heads") or n_head), head_dim=int(cfg.get("head_dim") or n_embd // n_head),
            intermediate_size=int(cfg.get("intermediate_size") or 0) or None,
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            init_std=float(cfg.get("initializer_range", 0.02)), moe=self.moe_from_hf(cfg, where))
        qk = DNP if self.qk_norm_from_hf(cfg) else "input"
        strategy = {"vector": {"class_path": "scalevec_lit.scale.PlainScale", "init_args": {}}, "branch_specific": False,
                    "placement": {"q": qk, "k": qk, "v": "input", "gate": "input", "up": "input", "router": "input"},
                    "output_shape": "head" if qk == DNP else "channel", "sublayer_output_norm": False,
                    "final_norm": True, "eps": float(cfg.get("rms_norm_eps", 1e-6))}
        return config, strategy
