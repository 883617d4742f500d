"""The serving loop's side of attention, above the kernels and backends: a step's metadata and its split into kernel
calls (`step`: `AttentionStep`, `draft_decode_steps`), one layer's forward over a step (`forward.mla_forward`), CUDA
graphs of decode steps (`graphs`), and the warm-up that compiles every kernel variant a plan can use (`warmup`).

>>> from mlakit.serving.step import AttentionStep
>>> AttentionStep.__module__
'mlakit.serving.step'
"""
