"""Random FlashInfer-style MLA steps for the compat tests: CSR page lists over shuffled pages with
NaN in every unused page and slot, a joined [num_pages, page_size, ckv + kpe] cache, packed
queries, and the oracle (mlakit's reference, natural-log lse)."""

from __future__ import annotations

import dataclasses

import torch

from paged_inputs import page_table, relative_error, shuffled_pages
import mlakit
from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.reference import attend_tokens

LOG2E = 1.4426950408889634


@dataclasses.dataclass
class FlashInferStep:
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_len_arr: torch.Tensor
    block_table: torch.Tensor
    cache: torch.Tensor
    q: torch.Tensor
    page_size: int
    head_dim_ckv: int
    sm_scale: float

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def head_dim_kpe(self) -> int:
        return self.cache.shape[-1] - self.head_dim_ckv

    def csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.qo_indptr, self.kv_indptr, self.kv_indices, self.kv_len_arr

    def plan_args(self, causal: bool = True, kv_data_type: torch.dtype | None = None) -> tuple:
        """The flat positional plan() arguments after the CSR tensors."""
        return (self.heads, self.head_dim_ckv, self.head_dim_kpe, self.page_size, causal, self.sm_scale,
                self.q.dtype, kv_data_type or self.cache.dtype)

    def split_query(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q[..., : self.head_dim_ckv], self.q[..., self.head_dim_ckv :]

    def split_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache[..., : self.head_dim_ckv], self.cache[..., self.head_dim_ckv :]


def make_step(
    kv_lens: list[int],
    q_lens: list[int],
    *,
    heads: int,
    page_size: int,
    head_dim_ckv: int = 512,
    head_dim_kpe: int = 64,
    dtype: torch.dtype = torch.bfloat16,
    spare_pages: int = 3,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> FlashInferStep:
    gen = torch.Generator().manual_seed(seed)
    dim = head_dim_ckv + head_dim_kpe
    pages, values = shuffled_pages(kv_lens, page_size, dim, spare_pages, gen)
    table = page_table(pages, fill=0, padding_columns=0)
    indices = [page for row in pages for page in row]
    offsets = [0]
    for row in pages:
        offsets.append(offsets[-1] + len(row))
    q_offsets = [0]
    for n in q_lens:
        q_offsets.append(q_offsets[-1] + n)
    q = torch.randn(q_offsets[-1], heads, dim, generator=gen)
    as_int = dict(dtype=torch.int32, device=device)
    return FlashInferStep(
        qo_indptr=torch.tensor(q_offsets, **as_int),
        kv_indptr=torch.tensor(offsets, **as_int),
        kv_indices=torch.tensor(indices, **as_int),
        kv_len_arr=torch.tensor(kv_lens, **as_int),
        block_table=table.to(device),
        cache=values.to(dtype).to(device),
        q=q.to(dtype).to(device),
        page_size=page_size,
        head_dim_ckv=head_dim_ckv,
        sm_scale=(128 + head_dim_kpe) ** -0.5,
    )


def reference(
    step: FlashInferStep, *, causal: bool = True, cache: torch.Tensor | None = None, kv_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """out `[total_q, heads, ckv]` float32 and natural-log lse `[total_q, heads]`: causal steps through
    `mlakit.reference_extend` (query i of n sees keys 0 .. L - n + i), non-causal ones see all L keys."""
    cache = step.cache if cache is None else cache
    common = dict(kv_lora_rank=step.head_dim_ckv, softmax_scale=step.sm_scale, kv_scale=kv_scale)
    if causal:
        return mlakit.reference_extend(step.q, cache, step.block_table, step.kv_len_arr, step.qo_indptr, **common)
    q_lens = (step.qo_indptr[1:] - step.qo_indptr[:-1]).long()
    token_seq = torch.arange(q_lens.numel(), device=step.q.device).repeat_interleave(q_lens)
    return attend_tokens(step.q, cache, step.block_table, token_seq, step.kv_len_arr.long()[token_seq], **common)


def fp8_cache(step: FlashInferStep, ckv_scale: float, kpe_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's cache stored as fp8 with separate latent / rope scales, and its float32 dequantized twin."""
    ckv, kpe = step.split_cache()
    stored = torch.cat([(ckv.float() / ckv_scale).to(FP8_DTYPE), (kpe.float() / kpe_scale).to(FP8_DTYPE)], dim=-1)
    ckv_stored, kpe_stored = stored[..., : step.head_dim_ckv], stored[..., step.head_dim_ckv :]
    dequantized = torch.cat([ckv_stored.float() * ckv_scale, kpe_stored.float() * kpe_scale], dim=-1)
    return stored, dequantized


def assert_matches(out: torch.Tensor, lse: torch.Tensor, expected: tuple[torch.Tensor, torch.Tensor], *,
                   base2: bool = True, out_tol: float = 1e-2, lse_tol: float = 1e-3) -> None:
    """out within `out_tol` relative error of the oracle, lse (in base 2 unless `base2=False`) within
    `lse_tol`, and -inf / zeros exactly where a query sees no key."""
    ref_out, ref_lse = expected
    ref_lse = ref_lse.double().cpu() * (LOG2E if base2 else 1.0)
    out, lse = out.cpu(), lse.double().cpu()
    assert torch.isfinite(out.float()).all()
    assert relative_error(out, ref_out) < out_tol
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert (out.float()[empty] == 0).all()
    if (~empty).any():
        assert (lse[~empty] - ref_lse[~empty]).abs().max().item() <= lse_tol
