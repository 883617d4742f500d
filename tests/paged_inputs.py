"""Random paged decode inputs for tests: shuffled pages, NaN in every unused page and slot,
garbage page indices past each sequence's pages, and an independent float64 oracle."""

from __future__ import annotations

import dataclasses
import math

import torch

from fp8_oracle import dequantize_cache
from mlakit.cache.kv_quant import FP8_DTYPE, STORAGE_DTYPES, num_scale_groups, quantize_rows_per_group

GARBAGE_PAGE_INDEX = -12345


@dataclasses.dataclass
class PagedBatch:
    q: torch.Tensor
    kv_cache: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    kv_scale: torch.Tensor | None
    kv_lora_rank: int
    softmax_scale: float

    def dequantized_cache(self) -> torch.Tensor:
        """float64 cache rows by the fp8 oracle (no code shared with mlakit.cache.kv_quant), on the cache's device."""
        return dequantize_cache(self.kv_cache, self.kv_scale).to(self.kv_cache.device)


def make_paged_batch(
    seq_lens: list[int],
    *,
    heads: int,
    q_len: int = 1,
    page_size: int = 16,
    kv_lora_rank: int = 64,
    rope_dim: int = 16,
    kv_dtype: str = "bf16",
    scale_layout: str = "tensor",
    q_dtype: torch.dtype = torch.bfloat16,
    spare_pages: int = 3,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> PagedBatch:
    gen = torch.Generator().manual_seed(seed)
    dim = kv_lora_rank + rope_dim
    pages, values = shuffled_pages(seq_lens, page_size, dim, spare_pages, gen)
    num_pages = values.shape[0]
    table = page_table(pages, fill=GARBAGE_PAGE_INDEX, padding_columns=1)
    scale = None
    if kv_dtype == "fp8_e4m3" and scale_layout == "group":
        flat = values.view(-1, dim)
        finite = torch.isfinite(flat).all(dim=1)
        stored, group_scales = quantize_rows_per_group(torch.nan_to_num(flat))
        stored = torch.where(finite[:, None], stored.float(), float("nan")).to(FP8_DTYPE)
        cache = stored.view(num_pages, page_size, dim)
        scale = group_scales.view(num_pages, page_size, num_scale_groups(dim))
    elif kv_dtype == "fp8_e4m3":
        scale = torch.tensor([0.5])
        cache = (values / scale).to(FP8_DTYPE)
    else:
        cache = values.to(STORAGE_DTYPES[kv_dtype])
    q = torch.randn(len(seq_lens), q_len, heads, dim, generator=gen).to(q_dtype)
    return PagedBatch(
        q=q.to(device),
        kv_cache=cache.to(device),
        block_table=table.to(device),
        cache_seqlens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        kv_scale=None if scale is None else scale.to(device),
        kv_lora_rank=kv_lora_rank,
        softmax_scale=(dim + 64) ** -0.5,
    )


# Query rows' magnitudes for `with_query_magnitudes` (powers of two, per head in turn): bf16 from 2^-17 to 2^17; fp16
# from near its largest value (N(0, 1) x 2^13 reaches ~2^15) to its subnormals.
QUERY_EXPONENTS = {torch.bfloat16: [-17.0, -8.0, 0.0, 6.0, 12.0, 17.0, 1.0, -1.0],
                   torch.float16: [-22.0, -17.0, 0.0, 6.0, 13.0, 13.0, 1.0, -1.0]}
# The e4m3-scores runs' (NOTES.md v63): fp16 rows from 2^-17 to 2^13.
E4M3_QUERY_EXPONENTS = {torch.bfloat16: QUERY_EXPONENTS[torch.bfloat16],
                        torch.float16: [-17.0, -8.0, 0.0, 6.0, 12.0, 13.0, 1.0, -1.0]}


def with_query_magnitudes(batch: PagedBatch, exponents: list[float]) -> PagedBatch:
    """The batch with head h's query rows scaled by 2^exponents[h % len(exponents)] (in the queries' dtype), head 3's
    all zero, and the softmax scale lowered by 2^-8 so that the largest rows' scores stay finite."""
    heads = batch.q.shape[2]
    cycle = torch.tensor(exponents, device=batch.q.device).repeat(-(-heads // len(exponents)))[:heads]
    magnitudes = torch.pow(2.0, cycle)
    magnitudes[3] = 0.0
    scaled = (batch.q.float() * magnitudes[None, None, :, None]).to(batch.q.dtype)
    return dataclasses.replace(batch, q=scaled, softmax_scale=batch.softmax_scale * 2.0 ** -8)


def with_subnormal_pages(batch: PagedBatch, seed: int) -> PagedBatch:
    """An fp8 batch whose every cache byte is a random e4m3 subnormal (exponent 0, mantissa 1-7, either sign)."""
    gen = torch.Generator(device=batch.kv_cache.device).manual_seed(seed)
    shape, device = batch.kv_cache.shape, batch.kv_cache.device
    mantissa = torch.randint(1, 8, shape, generator=gen, device=device, dtype=torch.uint8)
    sign = torch.randint(0, 2, shape, generator=gen, device=device, dtype=torch.uint8) << 7
    return dataclasses.replace(batch, kv_cache=(mantissa | sign).view(FP8_DTYPE))


def shuffled_pages(
    lengths: list[int], page_size: int, dim: int, spare_pages: int, gen: torch.Generator
) -> tuple[list[list[int]], torch.Tensor]:
    """Each sequence's pages (distinct, in random order) and the pages' values `[num_pages,
    page_size, dim]`: random (times 2) in the slots a sequence holds, NaN in every other slot
    and in the `spare_pages` no sequence holds."""
    pages_per_seq = [math.ceil(n / page_size) for n in lengths]
    num_pages = sum(pages_per_seq) + spare_pages
    order = iter(torch.randperm(num_pages, generator=gen).tolist())
    values = torch.full((num_pages, page_size, dim), float("nan"))
    pages = [[next(order) for _ in range(count)] for count in pages_per_seq]
    for length, row in zip(lengths, pages):
        for p, page in enumerate(row):
            used = min(page_size, length - p * page_size)
            values[page, :used] = torch.randn(used, dim, generator=gen) * 2
    return pages, values


def page_table(pages: list[list[int]], *, fill: int, padding_columns: int) -> torch.Tensor:
    """int32 `[len(pages), max(longest, 1) + padding_columns]`: each sequence's pages, then `fill`."""
    table = torch.full((len(pages), max([len(row) for row in pages] + [1]) + padding_columns), fill, dtype=torch.int32)
    for b, row in enumerate(pages):
        table[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return table


def naive_attention(q_tokens: torch.Tensor, keys: torch.Tensor, kv_lora_rank: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's heads `[H, D]` against keys `[n, D]` in float64, written without masks."""
    heads = q_tokens.shape[0]
    if keys.shape[0] == 0:
        return torch.zeros(heads, kv_lora_rank, dtype=torch.float64), torch.full((heads,), float("-inf"), dtype=torch.float64)
    scores = q_tokens.double() @ keys.T * scale
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ keys[:, :kv_lora_rank], lse


def sequence_keys(batch: PagedBatch, b: int) -> torch.Tensor:
    """Sequence b's dequantized rows in token order, walked one token at a time."""
    cache = batch.dequantized_cache().cpu()
    page_size = cache.shape[1]
    table = batch.block_table.cpu()
    rows = [cache[int(table[b, t // page_size]), t % page_size] for t in range(int(batch.cache_seqlens[b]))]
    return torch.stack(rows) if rows else torch.zeros(0, cache.shape[-1], dtype=torch.float64)


def naive_decode(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 decode oracle: out `[B, q_len, H, r]`, lse `[B, H, q_len]`."""
    bsz, q_len, heads, _ = batch.q.shape
    out = torch.zeros(bsz, q_len, heads, batch.kv_lora_rank, dtype=torch.float64)
    lse = torch.zeros(bsz, heads, q_len, dtype=torch.float64)
    for b in range(bsz):
        keys = sequence_keys(batch, b)
        length = keys.shape[0]
        for i in range(q_len):
            visible = max(0, length - q_len + i + 1)
            out[b, i], lse[b, :, i] = naive_attention(batch.q[b, i].cpu(), keys[:visible], batch.kv_lora_rank, batch.softmax_scale)
    return out, lse


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double().cpu()
    return float((actual.double().cpu() - expected).norm() / expected.norm().clamp(min=1e-30))


def assert_lse_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float = 0.0) -> None:
    """Every finite lse within atol + rtol x |expected| of the oracle's, -inf where the oracle's is."""
    actual, expected = actual.double().cpu(), expected.double().cpu()
    assert torch.equal(torch.isneginf(actual), torch.isneginf(expected)), "lse: -inf (empty query) positions differ"
    finite = torch.isfinite(expected)
    assert torch.isfinite(actual[finite]).all(), "lse: non-finite value where the oracle is finite"
    if finite.any():
        excess = (actual[finite] - expected[finite]).abs() - rtol * expected[finite].abs()
        worst = int(excess.argmax())
        error = (actual[finite] - expected[finite]).abs()[worst].item()
        assert excess[worst].item() <= atol, (f"lse error {error} > {atol} + {rtol} x |{expected[finite][worst].item()}|")
