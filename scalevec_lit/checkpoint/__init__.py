"""What a checkpoint holds, in one place: reading every form (a single-file Lightning ``*.ckpt``, a distributed
checkpoint folder of ``ModelParallelStrategy``, a native export folder), verifying it (zip structure and CRCs),
comparing it with a run that resumes from it, and rebuilding its model. The commands (export, generate, convert,
evaluate, inspect, ``model.init_from``, resume) read a checkpoint through this package only, once, and carry
what they read (``CheckpointContents``, or on resume the record ``check_resume`` returns). A Hugging Face folder
is read here too (``hf``: through the adapters of ``scalevec_lit/arch/``), and ``open_model`` opens any of the
four forms.

Modules: ``errors`` (ExportError), ``verify`` (zip structure, CRCs; ``CheckpointError`` and its kinds), ``read``
(the forms, ``CheckpointContents``), ``match`` (a checkpoint's model against this run's: ``check_resume``),
``rebuild`` (the model),
``hf`` (a Hugging Face folder, through ``scalevec_lit/arch/``), ``forms`` (which form a path is; ``open_model``).
Plain torch (+ safetensors): must not import Lightning or transformers, nor ``export/`` or ``hub/``.
"""
from .errors import ExportError
from .forms import OpenedModel, is_hf_folder, open_model
from .match import check_resume
from .read import NATIVE_SPEC, CheckpointContents, read_checkpoint, read_checkpoint_extra, read_contents
from .rebuild import load_model, model_from_state
from .verify import CheckpointError, checkpoint_files, verify_checkpoint

__all__ = [
    "NATIVE_SPEC", "CheckpointContents", "CheckpointError", "ExportError", "OpenedModel", "check_resume",
    "checkpoint_files", "is_hf_folder", "load_model", "model_from_state", "open_model", "read_checkpoint",
    "read_checkpoint_extra", "read_contents", "verify_checkpoint",
]
