"""Export a trained model: fold the scale vectors and write a standard Hugging Face checkpoint (or ours).

``python -m scalevec_lit export --ckpt <checkpoint> --out <dir> [--format hf|native] [--tokenizer <json>]``

- Reads a single-file Lightning checkpoint (``*.ckpt``), a distributed checkpoint folder written by
  ``ModelParallelStrategy`` (``*.distcp`` + ``.metadata`` + ``meta.pt``, consolidated on CPU without a
  process group), or a native export folder (``scalevec_spec.json`` + safetensors).
- ``--format hf`` (default) folds every input-role scale into its linear map (``scale/fold.py``) and writes
  ``config.json``, ``model.safetensors`` (sharded with ``model.safetensors.index.json`` above
  ``--max-shard-size``) and the tokenizer files in the layout of ``LlamaForCausalLM`` (dense, no scale
  left after folding), ``Qwen3ForCausalLM`` (dense, DNP / QK-norm on q and k with a per-head u),
  ``Qwen3MoeForCausalLM`` (softmax-routed MoE with that QK-norm), ``MixtralForCausalLM`` (softmax-routed
  MoE without it) or ``Glm4MoeForCausalLM`` (sigmoid-routed MoE: selection bias, shared experts). A model
  with a site that no standard architecture holds is refused with the site named (``HFExportError``).
- ``--format native`` writes our own (unfolded) state dict as safetensors plus the model spec as JSON;
  ``load_native(folder)`` (or ``build_from_spec`` + the safetensors) rebuilds it exactly.

Modules: ``errors`` (ExportError, HFExportError), ``hf_plan`` (which
architecture, or the refusals), ``hf`` (weight names and config.json), ``tokenizer`` (finding and writing
the tokenizer files), ``write`` (safetensors, ``save_hf``, ``save_native``, ``load_native``), ``cli``
(``export`` and ``main``); ``arch`` re-exports ``scalevec_lit.arch`` (the adapters' former home, kept for
existing scripts). This file only re-exports their public names, and those of ``scalevec_lit.checkpoint``
(reading and rebuilding a checkpoint) that it always has.

Plain torch (+ safetensors, tokenizers, yaml): must not import Lightning or transformers.
"""
from ..checkpoint import NATIVE_SPEC, load_model, model_from_state, read_checkpoint
from .cli import export, main
from .errors import ExportError, HFExportError
from .hf import ARCHITECTURES, DTYPES, HFLayout, hf_layout
from .hf_plan import NATIVE_HINT, plan_hf
from .tokenizer import find_tokenizer, write_tokenizer
from .write import ExportResult, load_native, parse_size, save_hf, save_native, write_safetensors

__all__ = [
    "ARCHITECTURES", "DTYPES", "ExportError", "ExportResult", "HFExportError", "HFLayout", "NATIVE_HINT",
    "NATIVE_SPEC", "export", "find_tokenizer", "hf_layout", "load_model", "load_native", "main",
    "model_from_state", "parse_size", "plan_hf", "read_checkpoint", "save_hf", "save_native",
    "write_safetensors", "write_tokenizer",
]
