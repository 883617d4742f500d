"""Paged latent KV cache: pages of `[c_kv ; k_pe]` rows, a page allocator, per-sequence page tables."""

from __future__ import annotations

import torch

from mlakit.errors import CacheFullError, ConfigError, MLAInputError
from mlakit.cache.kv_quant import (
    FP8_DTYPE,
    STORAGE_DTYPES,
    dequantize,
    num_scale_groups,
    quantize_rows_per_group,
    quantize_rows_per_tensor,
)

SCALE_LAYOUTS = ("tensor", "group")


def num_pages_for_budget(budget_bytes: int, page_size: int, dim: int, num_layers: int, dtype: str) -> int:
    """How many pages of `num_layers` x `page_size` x `dim` values fit in `budget_bytes`.

    >>> num_pages_for_budget(1 << 20, page_size=16, dim=576, num_layers=4, dtype="bf16")
    14
    """
    if dtype not in STORAGE_DTYPES:
        raise ConfigError(f"dtype must be one of {list(STORAGE_DTYPES)}, got {dtype!r}")
    element = torch.finfo(STORAGE_DTYPES[dtype]).bits // 8
    pages = budget_bytes // (page_size * dim * num_layers * element)
    if pages < 1:
        raise ConfigError(f"a cache budget of {budget_bytes} bytes holds no page of {page_size} tokens x {num_layers} layers")
    return int(pages)


class PageAllocator:
    """A free list of page indices; pages come back in the order they were freed.

    >>> alloc = PageAllocator(4)
    >>> alloc.allocate(3), alloc.num_free
    ([0, 1, 2], 1)
    """

    def __init__(self, num_pages: int) -> None:
        if num_pages <= 0:
            raise ConfigError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        """`count` free pages, or CacheFullError with nothing taken."""
        if count > len(self._free):
            raise CacheFullError(f"out of KV pages: need {count}, {len(self._free)} of {self.num_pages} free")
        return [self._free.pop() for _ in range(count)]

    def free(self, pages: list[int]) -> None:
        """Returns pages to the free list (the most recently freed is handed out first)."""
        self._free.extend(reversed(pages))


class LatentStore:
    """One layer's latent rows `[num_pages, page_size, dim]` and, for fp8, their scales.

    `dtype` is "bf16", "fp16", "fp8_e4m3", or "fp32" (exact storage for reference runs; the
    decode backends take the other three). fp8 stores `value / scale`, with one float32 scale
    for the whole tensor (`scale_layout="tensor"`, set by `fp8_scale`) or one per token and
    128-channel group (`scale_layout="group"`, computed on write).
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        dim: int,
        *,
        dtype: str = "bf16",
        device: torch.device | str = "cpu",
        scale_layout: str = "tensor",
        fp8_scale: float = 1.0,
    ) -> None:
        if dtype not in STORAGE_DTYPES:
            raise ConfigError(f"dtype must be one of {list(STORAGE_DTYPES)}, got {dtype!r}")
        if scale_layout not in SCALE_LAYOUTS:
            raise ConfigError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
        if fp8_scale <= 0:
            raise ConfigError(f"fp8_scale must be > 0, got {fp8_scale}")
        self.dtype = dtype
        self.scale_layout = scale_layout
        self.data = torch.zeros(num_pages, page_size, dim, dtype=STORAGE_DTYPES[dtype], device=device)
        self.scale: torch.Tensor | None = None
        if dtype == "fp8_e4m3":
            self.scale = (
                torch.full((1,), fp8_scale, dtype=torch.float32, device=device)
                if scale_layout == "tensor"
                else torch.ones(num_pages, page_size, num_scale_groups(dim), dtype=torch.float32, device=device)
            )

    @property
    def is_fp8(self) -> bool:
        return self.data.dtype == FP8_DTYPE

    def write_slots(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Stores rows `[n, dim]` at flat slots (page * page_size + offset; -1 = padding, skipped),
        quantizing for fp8. On a GPU this is one fused Triton launch (graph-safe, no host sync)."""
        if self.data.is_cuda:
            from mlakit.kernels.cache_write import write_rows

            write_rows(self.data, self.scale, slots, rows)
            return
        keep = slots >= 0
        slots, rows = slots[keep], rows[keep]
        flat = self.data.view(-1, self.data.shape[-1])
        if not self.is_fp8:
            flat[slots] = rows.to(self.data.dtype)
        elif self.scale_layout == "tensor":
            flat[slots] = quantize_rows_per_tensor(rows, self.scale)
        else:
            values, scales = quantize_rows_per_group(rows)
            flat[slots] = values
            self.scale.view(-1, self.scale.shape[-1])[slots] = scales

    def dequantized(self) -> torch.Tensor:
        """All rows as float32 values (what the stored bytes represent)."""
        return dequantize(self.data, self.scale)


class PagedLatentCache:
    """A paged latent KV cache: one page table (allocator, per-sequence pages and lengths)
    shared by `num_layers` LatentStores of `[num_pages, page_size, kv_lora_rank + rope_dim]`.

    `data`, `scale`, `write_slots` and `dequantized` are those of layer 0, for single-layer use.

    >>> cache = PagedLatentCache(num_pages=4, page_size=16, kv_lora_rank=512, rope_dim=64)
    >>> cache.append(7, torch.randn(20, 512), torch.randn(20, 64)).tolist()[:2]
    [0, 1]
    >>> cache.block_table([7]).tolist(), cache.seq_lens([7]).tolist()
    ([[0, 1]], [20])
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        kv_lora_rank: int,
        rope_dim: int,
        *,
        dtype: str = "bf16",
        device: torch.device | str = "cpu",
        scale_layout: str = "tensor",
        fp8_scale: float = 1.0,
        num_layers: int = 1,
    ) -> None:
        if page_size <= 0 or kv_lora_rank <= 0 or rope_dim < 0 or num_layers <= 0:
            raise ConfigError(
                "page_size, kv_lora_rank and num_layers must be >= 1 and rope_dim >= 0, got "
                f"{page_size}, {kv_lora_rank}, {num_layers} and {rope_dim}"
            )
        self.page_size = page_size
        self.kv_lora_rank = kv_lora_rank
        self.rope_dim = rope_dim
        self.allocator = PageAllocator(num_pages)
        self.stores = [
            LatentStore(num_pages, page_size, self.dim, dtype=dtype, device=device, scale_layout=scale_layout, fp8_scale=fp8_scale)
            for _ in range(num_layers)
        ]
        self._pages: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}

    @property
    def dim(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    @property
    def device(self) -> torch.device:
        return self.stores[0].data.device

    @property
    def data(self) -> torch.Tensor:
        return self.stores[0].data

    @property
    def scale(self) -> torch.Tensor | None:
        return self.stores[0].scale

    def layer(self, index: int) -> LatentStore:
        """The rows of layer `index`."""
        return self.stores[index]

    def write_slots(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Layer 0's `LatentStore.write_slots`."""
        self.stores[0].write_slots(slots, rows)

    def dequantized(self) -> torch.Tensor:
        """Layer 0's rows as float32 values."""
        return self.stores[0].dequantized()

    def seq_len(self, seq_id: int) -> int:
        """Tokens held for a sequence (0 for one never seen)."""
        return self._lengths.get(seq_id, 0)

    def pages_of(self, seq_id: int) -> list[int]:
        """The sequence's pages, in token order."""
        return list(self._pages.get(seq_id, []))

    def append(self, seq_id: int, c_kv: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """Writes new tokens' latent `[n, kv_lora_rank]` and rope key `[n, rope_dim]`; returns their slots.

        Allocates pages as needed. When too few pages are free, raises CacheFullError
        before anything is written or allocated.
        """
        n = c_kv.shape[0] if c_kv.dim() == 2 else -1
        if c_kv.dim() != 2 or c_kv.shape[1] != self.kv_lora_rank:
            raise MLAInputError(f"c_kv: expected shape [tokens, {self.kv_lora_rank}], got {tuple(c_kv.shape)}")
        if k_pe.dim() != 2 or tuple(k_pe.shape) != (n, self.rope_dim):
            raise MLAInputError(f"k_pe: expected shape [{n}, {self.rope_dim}], got {tuple(k_pe.shape)}")
        for name, tensor in (("c_kv", c_kv), ("k_pe", k_pe)):
            if tensor.device != self.device:
                raise MLAInputError(f"{name}: expected a tensor on {self.device} (the cache's device), got {tensor.device}")
        slots = self.reserve(seq_id, n)
        self.write_slots(slots, torch.cat([c_kv, k_pe], dim=1))
        return slots

    def reserve(self, seq_id: int, n: int) -> torch.Tensor:
        """Extends a sequence by `n` tokens and returns their flat slots (int64), for a caller that
        writes the rows itself (e.g. an attention layer). Nothing changes when pages run out."""
        if n < 0:
            raise MLAInputError(f"n: expected a token count >= 0, got {n}")
        start = self.seq_len(seq_id)
        pages = self._pages.get(seq_id, [])
        needed = -(-(start + n) // self.page_size) - len(pages)
        if needed > self.allocator.num_free:
            raise CacheFullError(
                f"out of KV pages: sequence {seq_id} needs {needed} more page(s) for {n} token(s), "
                f"{self.allocator.num_free} of {self.allocator.num_pages} free; free finished sequences or allocate more pages"
            )
        pages = pages + self.allocator.allocate(max(needed, 0))
        self._pages[seq_id] = pages
        self._lengths[seq_id] = start + n
        positions = torch.arange(start, start + n, device=self.device)
        page_index = torch.tensor(pages, dtype=torch.long, device=self.device)
        return page_index[positions // self.page_size] * self.page_size + positions % self.page_size

    def free(self, seq_id: int, *, missing_ok: bool = False) -> None:
        """Releases a sequence's pages for reuse.

        A sequence the cache does not hold (never appended, or already freed) raises
        MLAInputError, so a scheduler that frees twice is caught at once; `missing_ok=True`
        makes that a no-op for callers that free defensively.

        >>> cache = PagedLatentCache(num_pages=2, page_size=16, kv_lora_rank=8, rope_dim=8)
        >>> _ = cache.reserve(3, 5); cache.free(3); cache.free(3, missing_ok=True)
        >>> cache.free(3)
        Traceback (most recent call last):
        ...
        mlakit.errors.MLAInputError: seq_id: expected a sequence this cache holds (none held), got 3 (never appended, or already freed)
        """
        if seq_id not in self._lengths:
            if missing_ok:
                return
            held = sorted(self._lengths)
            listed = f"held: {held[:8]}{' ...' if len(held) > 8 else ''}" if held else "none held"
            raise MLAInputError(f"seq_id: expected a sequence this cache holds ({listed}), got {seq_id!r} (never appended, or already freed)")
        self.allocator.free(self._pages.pop(seq_id, []))
        del self._lengths[seq_id]

    def block_table(self, seq_ids: list[int], max_pages: int | None = None) -> torch.Tensor:
        """int32 `[len(seq_ids), max_pages]` page table; unused entries are 0 (never read)."""
        width = max([len(self._pages.get(s, [])) for s in seq_ids] + [1])
        if max_pages is not None:
            if max_pages < width:
                raise MLAInputError(f"max_pages: expected >= {width} (the longest page list), got {max_pages}")
            width = max_pages
        table = torch.zeros(len(seq_ids), width, dtype=torch.int32)
        for row, seq_id in enumerate(seq_ids):
            pages = self._pages.get(seq_id, [])
            table[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        return table.to(self.device)

    def seq_lens(self, seq_ids: list[int]) -> torch.Tensor:
        """int32 `[len(seq_ids)]` token counts, the `cache_seqlens` of a decode call."""
        return torch.tensor([self.seq_len(s) for s in seq_ids], dtype=torch.int32, device=self.device)
