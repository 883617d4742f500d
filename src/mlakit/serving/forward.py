"""One attention forward of one layer over a whole step, mixed modes included: each part of
the step (decode, latent extend, MHA prefill) runs on its kernel, results land in the
packed token order. Works for engines with their own projections: pass the roped queries,
the layer's cache and `kv_b_proj.weight`.
"""

from __future__ import annotations

import torch

from mlakit.attention.checks import check_lengths_and_pages, checked_softmax_scale
from mlakit.attention.functional import (DecodeMetadata, ExtendMetadata, backend_for, mla_decode, mla_extend,
                                        mla_prefill)
from mlakit.config import AUTO
from mlakit.errors import MLAInputError
from mlakit.cache.kv_quant import storage_name
from mlakit.kernels.seesaw_layout import decode_page_size_hint
from mlakit.prefill.mha import reference_attention_pass, run_mha_prefill
from mlakit.reference import pages_view, reference_extend
from mlakit.registry.catalog import get_backend
from mlakit.serving.step import AttentionStep, StepPart


def mla_forward(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_scale: torch.Tensor | None,
    kv_b_weight: torch.Tensor,
    step: AttentionStep,
    *,
    softmax_scale: float,
    decode_backend: str = AUTO,
    prefill_backend: str = AUTO,
    check_inputs: bool = True,
) -> torch.Tensor:
    """Attention output `[T, heads, d_v]` (float32) for the step's packed new tokens, whose latent
    rows are already in `kv_cache`.

    `q_nope [T, H, d_nope]` and `q_pe [T, H, d_rope]` (rope applied); `kv_b_weight` is
    `kv_b_proj.weight` `[H * (d_nope + d_v), kv_lora_rank]`. Decode and latent-extend parts
    absorb W_UK into the query and W_UV into the output; the MHA part decompresses the
    cache. A float32 cache (exact reference runs) goes through the torch oracles.

    >>> table = torch.tensor([[0], [1]], dtype=torch.int32)
    >>> step = AttentionStep((1, 2), (5, 2), table, torch.tensor([4, 8, 9]), page_size=8)
    >>> cache = torch.randn(2, 8, 48)
    >>> out = mla_forward(torch.randn(3, 2, 16), torch.randn(3, 2, 16), cache, None,
    ...     torch.randn(2 * (16 + 8), 32), step, softmax_scale=0.2)
    >>> out.shape
    torch.Size([3, 2, 8])
    """
    if not isinstance(kv_cache, torch.Tensor):
        raise MLAInputError(f"kv_cache: expected a torch.Tensor, got {type(kv_cache).__name__}")
    _check_forward_inputs(q_nope, q_pe, kv_cache, kv_scale, kv_b_weight, step, decode_backend, prefill_backend)
    softmax_scale = checked_softmax_scale(softmax_scale)
    w_uk, w_uv = absorbed_weights(kv_b_weight, q_nope)
    out = torch.empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[1], dtype=torch.float32, device=q_nope.device)
    exact = kv_cache.dtype == torch.float32
    if exact:
        _check_exact_cache(kv_cache, kv_scale, step, check_inputs)
    query_dtype = query_dtype_for(kv_cache)
    for part in step.parts:
        rows = part.token_rows
        part_nope, part_pe = (q_nope, q_pe) if rows is None else (q_nope[rows], q_pe[rows])
        if part.kind == "mha_prefill":
            q = torch.cat([part_nope, part_pe], dim=-1).to(query_dtype)
            if exact:
                part_out, _ = run_mha_prefill(q, kv_cache, kv_b_weight, part.prefill, attend=reference_attention_pass,
                                              softmax_scale=softmax_scale, kv_scale=kv_scale)
            else:
                part_out, _ = mla_prefill(q, kv_cache, kv_b_weight, part.prefill, softmax_scale=softmax_scale,
                                          backend=prefill_backend, kv_scale=kv_scale, check_inputs=check_inputs)
        else:
            q_latent = absorb_query(part_nope, part_pe, w_uk)
            out_latent = _latent_part(q_latent.to(query_dtype), kv_cache, kv_scale, kv_b_weight.shape[1], part, softmax_scale, decode_backend,
                                      exact, check_inputs)
            part_out = expand_output(out_latent, w_uv)
        if rows is None:
            out.copy_(part_out)
        else:
            out.index_copy_(0, rows, part_out.float())
    return out


def absorbed_weights(kv_b_weight: torch.Tensor, q_nope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UK `[H, d_nope, kv_lora_rank]` and W_UV `[H, d_v, kv_lora_rank]`: views of `kv_b_proj.weight`
    for the heads and d_nope of `q_nope [T, H, d_nope]`.

    >>> [tuple(w.shape) for w in absorbed_weights(torch.zeros(2 * (16 + 8), 32), torch.zeros(3, 2, 16))]
    [(2, 16, 32), (2, 8, 32)]
    """
    heads, nope_dim = q_nope.shape[1], q_nope.shape[2]
    per_head = kv_b_weight.view(heads, -1, kv_b_weight.shape[1])
    return per_head[:, :nope_dim], per_head[:, nope_dim:]


def absorb_query(q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """The latent-form query `[T, H, kv_lora_rank + d_rope]`: W_UK^T q_nope per head, then q_pe.

    >>> absorb_query(torch.zeros(3, 2, 16), torch.zeros(3, 2, 4), torch.zeros(2, 16, 32)).shape
    torch.Size([3, 2, 36])
    """
    return torch.cat([torch.einsum("thd,hdr->thr", q_nope, w_uk.to(q_nope.dtype)), q_pe], dim=-1)


def expand_output(out_latent: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """The heads' outputs `[T, H, d_v]` (float32) from latent-form outputs `[T, H, kv_lora_rank]`.

    >>> expand_output(torch.zeros(3, 2, 32), torch.zeros(2, 8, 32)).shape
    torch.Size([3, 2, 8])
    """
    return torch.einsum("thr,hvr->thv", out_latent.float(), w_uv.float())


def query_dtype_for(kv_cache: torch.Tensor) -> torch.dtype:
    """The dtype attention queries take for a cache: float32 for a float32 cache (the exact
    reference path), float16 for float16, else bfloat16 (bf16 and fp8 caches).

    >>> query_dtype_for(torch.zeros(1, dtype=torch.float8_e4m3fn))
    torch.bfloat16
    """
    if kv_cache.dtype in (torch.float32, torch.float16):
        return kv_cache.dtype
    return torch.bfloat16


def check_absorbed_operands(q_nope: object, q_pe: object, kv_cache: torch.Tensor, kv_b_weight: object,
                            num_tokens: int) -> None:
    """MLAInputError naming the first of `q_nope [T, H, d_nope]`, `q_pe [T, H, d_rope]` (T = `num_tokens`, the
    step's query tokens) and `kv_b_weight [H * (d_nope + d_v), kv_lora_rank]` that does not fit the others and the
    cache's row width `kv_lora_rank + d_rope` (shapes only)."""
    for name, q in (("q_nope", q_nope), ("q_pe", q_pe), ("kv_b_weight", kv_b_weight)):
        if not isinstance(q, torch.Tensor) or not q.is_floating_point():
            got = q.dtype if isinstance(q, torch.Tensor) else type(q).__name__
            raise MLAInputError(f"{name}: expected a floating-point tensor, got {got}")
    for name, q in (("q_nope", q_nope), ("q_pe", q_pe)):
        if q.dim() != 3 or q.shape[0] != num_tokens or q.shape[1] != q_nope.shape[1]:
            raise MLAInputError(
                f"{name}: expected [{num_tokens} tokens (the step's new tokens), heads, dim] with q_nope's heads, "
                f"got shape {tuple(q.shape)}"
            )
    heads, nope_dim, rank = q_nope.shape[1], q_nope.shape[2], kv_cache.shape[-1] - q_pe.shape[2]
    if kv_b_weight.dim() != 2 or kv_b_weight.shape[1] != rank or kv_b_weight.shape[0] % heads or kv_b_weight.shape[0] // heads <= nope_dim:
        raise MLAInputError(
            f"kv_b_weight: expected [{heads} heads x (d_nope {nope_dim} + d_v), kv_lora_rank {rank}] (kv_b_proj.weight), "
            f"got shape {tuple(kv_b_weight.shape)}"
        )


def _check_forward_inputs(
    q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, kv_scale: object, kv_b_weight: torch.Tensor,
    step: AttentionStep, decode_backend: str, prefill_backend: str,
) -> None:
    if not isinstance(step, AttentionStep):
        raise MLAInputError(f"step: expected an AttentionStep, got {type(step).__name__}")
    if kv_scale is not None and not isinstance(kv_scale, torch.Tensor):
        raise MLAInputError(f"kv_scale: expected None or a float32 tensor (the fp8 cache's scale), got {kv_scale!r}")
    for name, backend in (("decode_backend", decode_backend), ("prefill_backend", prefill_backend)):
        if not isinstance(backend, str):
            raise MLAInputError(f"{name}: expected a registered backend name or {AUTO!r}, got {backend!r}")
        if backend != AUTO:
            get_backend(backend)  # raises ConfigError listing the registered names
    check_absorbed_operands(q_nope, q_pe, kv_cache, kv_b_weight, step.num_tokens)
    has_extend_part = any(part.kind == "latent_extend" for part in step.parts)
    if has_extend_part and decode_backend != AUTO and get_backend(decode_backend).extend is None:
        raise MLAInputError(
            f"step: decode backend {decode_backend!r} has no latent-form extend kernel for its short extends; build the "
            "AttentionStep with max_latent_extend_tokens=0 so they run in MHA form"
        )


def _check_exact_cache(kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, step: AttentionStep,
                       check_inputs: bool) -> None:
    """For a float32 cache, whose parts run on the torch oracles rather than through the checked calls: the cache's
    pages of the step's page size, no fp8 scale, and with `check_inputs` (one host sync) every page the step's
    sequences use within the cache (torch indexing would wrap a negative one)."""
    pages = pages_view(kv_cache)
    if pages.dim() != 3 or pages.shape[1] != step.page_size:
        raise MLAInputError(f"kv_cache: expected [num_pages, {step.page_size} (the step's page size), dim], "
                            f"got shape {tuple(kv_cache.shape)}")
    if kv_scale is not None:
        raise MLAInputError("kv_scale: expected None for a float32 cache (scales apply to fp8 caches only), got a tensor")
    if check_inputs:
        lengths = torch.tensor(step.cache_lens, dtype=torch.int32, device=step.block_table.device)
        check_lengths_and_pages(step.block_table, lengths, step.page_size, pages.shape[0])


def _latent_part(
    q_latent: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_scale: torch.Tensor | None,
    rank: int,
    part: StepPart,
    softmax_scale: float,
    backend: str,
    exact: bool,
    check_inputs: bool,
) -> torch.Tensor:
    if exact:
        out, _ = reference_extend(q_latent, kv_cache, part.block_table, part.cache_seqlens, part.cu_seqlens_q,
                                  kv_lora_rank=rank, softmax_scale=softmax_scale, kv_scale=kv_scale)
        return out
    if part.kind == "decode":
        q = q_latent.view(len(part.sequences), part.q_len, *q_latent.shape[1:])
        metadata = _part_metadata(part, q, kv_cache, kv_scale, rank, backend)
        out, _ = mla_decode(
            q, kv_cache, part.block_table, part.cache_seqlens,
            softmax_scale=softmax_scale, backend=backend, kv_scale=kv_scale, kv_lora_rank=rank, return_lse=False,
            check_inputs=check_inputs, metadata=metadata,
        )
        return out.flatten(0, 1)
    metadata = _part_metadata(part, q_latent, kv_cache, kv_scale, rank, backend)
    out, _ = mla_extend(
        q_latent, kv_cache, part.block_table, part.cache_seqlens, part.cu_seqlens_q, max_q_len=part.max_q_len,
        softmax_scale=softmax_scale, backend=backend, kv_scale=kv_scale, kv_lora_rank=rank, check_inputs=check_inputs,
        metadata=metadata,
    )
    return out


def _part_metadata(part: StepPart, q: torch.Tensor, kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, rank: int,
                   backend: str) -> DecodeMetadata | ExtendMetadata:
    """The decode or latent-extend part's metadata for one layer's call: that of the backend the call runs on
    (`backend_for`, "auto" resolved), built once a step (`StepPart.decode_metadata` / `extend_metadata`); the backend
    and the page-size hint are worked out once a cache layout too, not every layer."""
    call = "decode" if part.kind == "decode" else "extend"
    layout = (backend, q.device, q.dtype, tuple(q.shape[-2:]), kv_cache.dtype, tuple(kv_cache.shape[1:]),
              None if kv_scale is None else tuple(kv_scale.shape), rank)

    def build() -> DecodeMetadata | ExtendMetadata:
        name = backend_for(call, q, kv_cache, backend=backend, kv_lora_rank=rank)
        metadata = part.decode_metadata if call == "decode" else part.extend_metadata
        hint = decode_page_size_hint(kv_cache, kv_scale, rank)
        return metadata(name, q.shape[-2], storage_name(kv_cache.dtype), hint)

    return part.once(("layout", call, *layout), build)
