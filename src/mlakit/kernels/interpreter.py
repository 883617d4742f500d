"""Whether Triton kernels run under the CPU interpreter, where some casts and bf16 arithmetic
differ from the GPU (see the kernels' interpreter-only paths)."""

import os

import triton.language as tl

INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")
