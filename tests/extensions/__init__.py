"""A user-style extension package, kept outside the library: what a user writes to try a new architecture.

Importable as ``extensions`` (``tests/`` on ``sys.path`` in pytest, on ``PYTHONPATH`` for the command line runs
of ``tests/test_extensions.py``). Each module is one extension, chosen from YAML in the recipe beside it:
- ``models.py``: a ``CausalLM`` subclass whose ``build_model`` returns a ``Transformer`` subclass that adds a
  parameter (a learned output temperature) and a constructor argument (``temperature_init``);
  ``temperature.yaml`` chooses it with ``model.class_path``;
- ``blocks.py``: a ``Block`` subclass with an ``init_args`` value (a residual scale);
  ``residual_block.yaml`` chooses it with ``model.block.class_path`` + ``init_args``.
"""
