"""The `triton_fp8` backend: attention in e4m3 on Hopper (opt-in), the MHA-form prefill and the decode over an fp8 cache.

Prefill: each pass's queries and decompressed keys and values are rounded to e4m3 with one scale a tensor
(`mlakit.prefill.fp8.quantize_prefill_operands`) and attended on 8-bit tensor cores with float32
accumulation (`fp8_mha_prefill`); the passes merge as the `triton` backend's do. Its error is about
5e-2 of the output's scale against bf16's 2e-3 (benchmarks/NOTES.md, "FP8 prefill").

Decode and latent extend (fp8_e4m3 caches only): the `triton` backend's kernels with `DecodePlan.e4m3_scores`:
where a Hopper kernel serves the call at latent 512 + rope 64 with one per-tensor scale (the seesaw: pages of whole
64-token tiles, more than 32 query rows a sequence; the narrow kernel: at most 32), each query row is rounded to e4m3
under its own power-of-two scale and S runs on 8-bit tensor cores over the cache's bytes; elsewhere the `triton`
backend's fp8 kernels run unchanged. Error about 3.6e-2 of the output's scale against the unrounded queries (fp16
MMAs: 1.7e-3; NOTES.md v63, v64).

`auto` never picks it, and naming it for decode leaves the prefill to the automatic choice: name it for each phase
(`prefill_backend="triton_fp8"`, `decode_backend="triton_fp8"`, or `attention_backend` for both) where that accuracy
is acceptable.
"""

from __future__ import annotations

import functools

import torch

from mlakit.backends import triton_mla
from mlakit.prefill.metadata import Segments
from mlakit.prefill.mha import mha_prefill_kernel
from mlakit.registry.catalog import register
from mlakit.registry.records import BackendRecord, PageSizeRule

RECORD = BackendRecord(
    name="triton_fp8",
    summary="mlakit's Hopper attention in e4m3 (opt-in): MHA prefill (q, k, v and P rounded, one scale a tensor); "
            "decode over fp8 caches with queries rounded per row and S on 8-bit tensor cores",
    phases=frozenset({"prefill", "decode"}),
    device_kinds=frozenset({"cuda"}),
    capability_majors=frozenset({9}),
    page_sizes=PageSizeRule(),
    kv_dtypes=frozenset({"bf16", "fp16", "fp8_e4m3"}),
    decode_kv_dtypes=frozenset({"fp8_e4m3"}),
    rope_dims=frozenset({32, 64}),
    qk_nope_dims=frozenset({64, 128}),
    v_dims=frozenset({64, 128}),
    attention_dtype="fp8_e4m3",
    packages=("triton",),
    install_hint="pip install triton",
    cuda_graphs=True,
    latent_extend=True,
    tree_drafts=False,  # the decode kernel is causal over the draft tokens: chains only
    auto_rank=2000,  # past the reference backend, which fits everything: auto never reaches it
    preferred_page_size=64,
    verified="H100 (GPU tests, the demo's greedy tokens; decode: GPU tests, benchmarks)",
)


def _attention_pass(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    queries: Segments,
    keys: Segments,
    *,
    causal: bool,
    softmax_scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
    merge: bool,
) -> None:
    from mlakit.prefill.fp8 import fp8_mha_prefill, quantize_prefill_operands

    operands = quantize_prefill_operands(q, k_nope, k_pe, v, keys.cu_seqlens)
    fp8_mha_prefill(operands, queries.cu_seqlens, max_q_len=queries.max_len, causal=causal, softmax_scale=softmax_scale,
                    out=out, lse=lse, merge=merge, max_k_len=keys.max_len)


prefill = mha_prefill_kernel(_attention_pass, triton_mla.decompress_rows)

register(RECORD, functools.partial(triton_mla.decode, e4m3_scores=True),
         functools.partial(triton_mla.extend, e4m3_scores=True), prefill,
         functools.partial(triton_mla.decode_metadata, e4m3_scores=True),
         functools.partial(triton_mla.extend_metadata, e4m3_scores=True), writes_outputs=True,
         prepare_call=triton_mla.prepare_call)
