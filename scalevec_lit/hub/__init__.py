"""Start from a pretrained model: import a local transformers checkpoint (``hf_import``) and convert a native
checkpoint into another scale strategy (``convert``), both writing the native format that ``export`` and
``fit --model.init_from`` read. The conversion math is the scale layer's (``scalevec_lit/scale/convert.py``);
a transformers folder is read by ``scalevec_lit/checkpoint/hf.py`` through the architecture adapters
(``scalevec_lit/arch/``), whose names this package re-exports for existing scripts.

``python -m scalevec_lit import --hf DIR --out PATH [--strategy recipes/strategy/X.yaml]``
``python -m scalevec_lit convert --ckpt A --strategy recipes/strategy/Y.yaml --out B [--allow-function-change]``

Plain torch (+ safetensors, yaml): must not import Lightning or transformers.
"""
from ..checkpoint.hf import config_from_hf, load_hf, read_hf_tensors
from .convert import convert_checkpoint, convert_model, read_strategy, write_native
from .hf_import import import_hf

__all__ = ["config_from_hf", "convert_checkpoint", "convert_model", "import_hf", "load_hf", "read_hf_tensors",
           "read_strategy", "write_native"]
