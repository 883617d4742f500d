"""Drop-in entry points with vendor libraries' call signatures, served by mlakit's kernels.

Each submodule stands alone (import the one you need): `mlakit.compat.flash_mla` has
FlashMLA's `get_mla_metadata` and `flash_mla_with_kvcache`; `mlakit.compat.flashinfer` has
FlashInfer's MLA wrapper.
"""
