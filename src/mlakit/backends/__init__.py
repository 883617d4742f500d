"""Built-in backends. Importing this package registers each of them (vendor packages are
imported only when a vendor kernel is called)."""

from mlakit.backends import (cutedsl_mla, flashinfer_mla, flashmla, intel_xpu, reference, tokenspeed_mla, triton_fp8,
                             triton_mla, trtllm_mla)

__all__ = ["cutedsl_mla", "flashinfer_mla", "flashmla", "intel_xpu", "reference", "tokenspeed_mla", "triton_fp8", "triton_mla",
           "trtllm_mla"]
