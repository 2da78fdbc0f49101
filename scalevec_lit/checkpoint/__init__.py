"""What a checkpoint holds, in one place: reading every form (a single-file Lightning ``*.ckpt``, a distributed
checkpoint folder of ``ModelParallelStrategy``, a native export folder), verifying it (``scalevec_lit.verify``:
zip structure and CRCs, re-exported here) and rebuilding its model. The commands (export, generate, convert,
evaluate, inspect, ``model.init_from``) read a checkpoint through this package only, once, and carry what they
read (``CheckpointContents``). A Hugging Face folder is read by ``hub/hf_import.py`` (its import adapters).

Modules: ``errors`` (ExportError), ``read`` (the forms, ``CheckpointContents``), ``rebuild`` (the model).
Plain torch (+ safetensors): must not import Lightning or transformers, nor ``export/`` or ``hub/``.
"""
from ..verify import CheckpointError, checkpoint_files, verify_checkpoint
from .errors import ExportError
from .read import NATIVE_SPEC, CheckpointContents, read_checkpoint, read_checkpoint_extra, read_contents
from .rebuild import load_model, model_from_state

__all__ = [
    "NATIVE_SPEC", "CheckpointContents", "CheckpointError", "ExportError", "checkpoint_files", "load_model",
    "model_from_state", "read_checkpoint", "read_checkpoint_extra", "read_contents", "verify_checkpoint",
]
