"""Paged latent KV cache: pages of `[c_kv ; k_pe]` rows, a page allocator, per-sequence page tables."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import NamedTuple

import torch

from mlakit.errors import CacheFullError, ConfigError, MLAInputError, is_int
from mlakit.cache.kv_quant import (
    AUTO_SCALE_HEADROOM,
    FP8_DTYPE,
    STORAGE_DTYPES,
    dequantize,
    fp8_scale_from_rows,
    num_scale_groups,
    quantize_rows_per_group,
    quantize_rows_per_tensor,
)

SCALE_LAYOUTS = ("tensor", "group")
AUTO_SCALE = "auto"
FP8Scale = float | str | None


def _is_finite_number(value: object) -> bool:
    """A finite real number (Python or NumPy); bools are not."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


class FP8Counts(NamedTuple):
    """Values one layer's fp8 writes saturated at +-448 and non-finite values they stored as NaN."""

    saturated: int
    non_finite: int


def _check_fp8_scale(fp8_scale: FP8Scale, dtype: str, scale_layout: str) -> None:
    """A ConfigError unless `fp8_scale` is None, "auto" or a finite float > 0 on a per-tensor fp8 store."""
    if fp8_scale is None:
        return
    if fp8_scale != AUTO_SCALE and not (_is_finite_number(fp8_scale) and fp8_scale > 0):
        raise ConfigError(f"fp8_scale must be a finite number > 0 or {AUTO_SCALE!r}, got {fp8_scale!r}")
    if dtype != "fp8_e4m3" or scale_layout != "tensor":
        raise ConfigError(
            f"fp8_scale applies to dtype='fp8_e4m3' with scale_layout='tensor', got dtype={dtype!r}, "
            f"scale_layout={scale_layout!r} (per-group scales are computed on every write); leave fp8_scale unset"
        )


def slots_outside(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Which of the flat `slots` are neither -1 (padding) nor a row of a cache of `num_slots` slots (device op).

    >>> slots_outside(torch.tensor([3, -1, 32, -2]), 32).tolist()
    [False, False, True, True]
    """
    return (slots < -1) | (slots >= num_slots)


def slot_failure(slots: torch.Tensor, outside: torch.Tensor, num_slots: int, detail: str = "") -> MLAInputError:
    """The MLAInputError naming the first slot `outside` (`slots_outside`) marks; `detail` follows the range.

    >>> slots = torch.tensor([3, 40])
    >>> str(slot_failure(slots, slots_outside(slots, 32), 32))
    'slots: expected -1 (padding) or a flat slot in [0, 32), got slots[1] = 40'
    """
    i = int(torch.nonzero(outside)[0, 0])
    return MLAInputError(
        f"slots: expected -1 (padding) or a flat slot in [0, {num_slots}){detail}, got slots[{i}] = {int(slots[i])}"
    )


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

    `free` takes back only pages it handed out and does not hold: a page out of range, already
    free, or listed twice is refused (MLAInputError naming it) with nothing freed, since a page
    freed twice would later be handed to two sequences at once.

    >>> alloc = PageAllocator(4)
    >>> alloc.allocate(3), alloc.num_free
    ([0, 1, 2], 1)
    >>> alloc.free([2]); alloc.free([2])
    Traceback (most recent call last):
    ...
    mlakit.errors.MLAInputError: pages: expected pages this allocator handed out and does not hold, got page 2, which is already free
    """

    def __init__(self, num_pages: int) -> None:
        if not is_int(num_pages) or num_pages <= 0:
            raise ConfigError(f"num_pages must be an integer >= 1, got {num_pages!r}")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        """`count` free pages, or CacheFullError with nothing taken."""
        if not is_int(count) or count < 0:
            raise MLAInputError(f"count: expected a page count (an integer >= 0), got {count!r}")
        if count > len(self._free):
            raise CacheFullError(f"out of KV pages: need {count}, {len(self._free)} of {self.num_pages} free")
        pages = [self._free.pop() for _ in range(count)]
        for page in pages:
            self._is_free[page] = False
        return pages

    def free(self, pages: list[int]) -> None:
        """Returns pages to the free list (the most recently freed is handed out first)."""
        seen: set[int] = set()
        for page in pages:
            if not is_int(page) or not 0 <= page < self.num_pages:
                why = f"{page!r}, not a page index in [0, {self.num_pages})"
            elif self._is_free[page] or page in seen:
                why = f"page {page}, which is {'already free' if self._is_free[page] else 'listed twice'}"
            else:
                seen.add(page)
                continue
            raise MLAInputError(f"pages: expected pages this allocator handed out and does not hold, got {why}")
        for page in pages:
            self._is_free[page] = True
        self._free.extend(reversed(pages))


class LatentStore:
    """One layer's latent rows `[num_pages, page_size, dim]` and, for fp8, their scales.

    `dtype` is "bf16", "fp16", "fp8_e4m3", or "fp32" (exact storage for reference runs; the
    decode backends take the other three). fp8 stores `value / scale`, with one float32 scale
    for the whole tensor (`scale_layout="tensor"`) or one per token and 128-channel group
    (`scale_layout="group"`, computed on write). The per-tensor scale is `fp8_scale`: a float
    (e.g. a checkpoint's kv scale; 1.0 when unset), or "auto": the first write that holds real
    rows (slots in the cache) sets it to `amax * AUTO_SCALE_HEADROOM / 448` of those rows on the
    device, and it stays fixed after (1.0 if they hold no finite non-zero value); a write of
    padding rows only leaves it unset. `calibrate_fp8_scale` sets it from sample rows instead.

    fp8 writes count, in the int64 device tensor `fp8_counts` (saturated, non-finite), the
    values that saturated at +-448 and the non-finite inputs (stored as NaN); counting adds no
    host sync, reading the counts (`PagedLatentCache.fp8_saturation_counts`) does.

    >>> store = LatentStore(2, 4, 8, dtype="fp8_e4m3", fp8_scale="auto")
    >>> store.write_slots(torch.tensor([0, 1]), torch.tensor([[1.0] * 8, [-448.0] * 8]))
    >>> store.scale.tolist(), store.fp8_counts.tolist()
    ([2.0], [0, 0])
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
        fp8_scale: FP8Scale = None,
    ) -> None:
        if not isinstance(dtype, str) or dtype not in STORAGE_DTYPES:
            raise ConfigError(f"dtype must be one of {list(STORAGE_DTYPES)}, got {dtype!r}")
        if not isinstance(scale_layout, str) or scale_layout not in SCALE_LAYOUTS:
            raise ConfigError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"device: expected a torch device such as 'cpu' or 'cuda:0', got {device!r}") from exc
        _check_fp8_scale(fp8_scale, dtype, scale_layout)
        self.dtype = dtype
        self.scale_layout = scale_layout
        self.data = torch.zeros(num_pages, page_size, dim, dtype=STORAGE_DTYPES[dtype], device=device)
        self.scale: torch.Tensor | None = None
        self.fp8_counts: torch.Tensor | None = None
        # An "auto" store's undecided flag: a bool [1] on the store's device, cleared by the first
        # write with real rows (device ops only, since whether a row is padding is only known
        # there); on CUDA a pinned host copy, refreshed without a sync after each such write, lets
        # later writes see the decision without reading the device. None once the host knows.
        self._auto_undecided: torch.Tensor | None = None
        self._auto_undecided_host: torch.Tensor | None = None
        if fp8_scale == AUTO_SCALE:
            self._auto_undecided = torch.ones(1, dtype=torch.bool, device=device)
            if self._auto_undecided.is_cuda:
                self._auto_undecided_host = torch.ones(1, dtype=torch.bool, pin_memory=True)
        if dtype == "fp8_e4m3":
            self.fp8_counts = torch.zeros(2, dtype=torch.int64, device=device)
            self.scale = (
                torch.full((1,), 1.0 if fp8_scale in (None, AUTO_SCALE) else float(fp8_scale), dtype=torch.float32, device=device)
                if scale_layout == "tensor"
                else torch.ones(num_pages, page_size, num_scale_groups(dim), dtype=torch.float32, device=device)
            )

    @property
    def is_fp8(self) -> bool:
        return self.data.dtype == FP8_DTYPE

    @property
    def num_slots(self) -> int:
        """Flat slots the store holds: num_pages * page_size."""
        return self.data.shape[0] * self.data.shape[1]

    @property
    def awaiting_auto_scale(self) -> bool:
        """True while an "auto" store's scale is not set (no write with real rows and no
        calibration yet). Reads a device flag: on CUDA a host sync."""
        if self._auto_undecided is not None and not bool(self._auto_undecided):
            self._auto_undecided = self._auto_undecided_host = None
        return self._auto_undecided is not None

    def write_slots(self, slots: torch.Tensor, rows: torch.Tensor, *, check_values: bool = True) -> None:
        """Stores rows `[n, dim]` at flat slots `[n]` (page * page_size + offset; -1 = padding, skipped),
        quantizing and counting for fp8.

        `check_values` reads the slots first (on a GPU, one host sync, so not while a CUDA graph is
        captured) and raises MLAInputError, with nothing written or counted, unless every slot is -1
        or in [0, num_slots). Per-step writes of slots from `PagedLatentCache.reserve` pass False:
        slots outside the cache are then skipped (never written). On a GPU the write is one fused
        Triton launch, after the auto scale's few device ops on the writes of an "auto" store until
        one with real rows has set it; with `check_values=False` it is graph-safe, with no host sync."""
        self._check_write(slots, rows)
        if check_values:
            self._check_slot_values(slots)
        if self._auto_undecided is not None and rows.shape[0] > 0:
            self._set_auto_scale(slots, rows)
        if self.data.is_cuda:
            from mlakit.kernels.cache_write import write_rows

            write_rows(self.data, self.scale, slots, rows, self.fp8_counts)
            return
        keep = self._in_cache(slots)
        slots, rows = slots[keep], rows[keep]
        flat = self.data.view(-1, self.data.shape[-1])
        if not self.is_fp8:
            flat[slots] = rows.to(self.data.dtype)
        elif self.scale_layout == "tensor":
            flat[slots] = quantize_rows_per_tensor(rows, self.scale, self.fp8_counts)
        else:
            values, scales = quantize_rows_per_group(rows, self.fp8_counts)
            flat[slots] = values
            self.scale.view(-1, self.scale.shape[-1])[slots] = scales

    def _check_write(self, slots: object, rows: object) -> None:
        """MLAInputError unless rows are a floating-point `[n, dim]` tensor and slots an integer
        `[n]` tensor, both on the store's device (shapes and dtypes only: no host sync)."""
        dim, device = self.data.shape[-1], self.data.device
        if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[1] != dim or not rows.is_floating_point():
            got = f"{rows.dtype} of shape {tuple(rows.shape)}" if isinstance(rows, torch.Tensor) else type(rows).__name__
            raise MLAInputError(f"rows: expected a floating-point tensor [n, {dim}] (the store's row width), got {got}")
        if not isinstance(slots, torch.Tensor) or tuple(slots.shape) != (rows.shape[0],) or slots.dtype not in (torch.int32, torch.int64):
            got = f"{slots.dtype} of shape {tuple(slots.shape)}" if isinstance(slots, torch.Tensor) else type(slots).__name__
            raise MLAInputError(f"slots: expected an int32 or int64 tensor [{rows.shape[0]}] (one per row), got {got}")
        for name, tensor in (("rows", rows), ("slots", slots)):
            if tensor.device != device:
                raise MLAInputError(f"{name}: expected a tensor on {device} (the store's device), got {tensor.device}")

    def _in_cache(self, slots: torch.Tensor) -> torch.Tensor:
        """Which slots name a row of the store (not -1 padding, nor outside it): the rows an unchecked write keeps."""
        return (slots >= 0) & (slots < self.num_slots)

    def _check_slot_values(self, slots: torch.Tensor) -> None:
        """MLAInputError naming the first slot that is neither -1 (padding) nor in [0, num_slots). Reads the
        slots: on a GPU one host sync, refused (by name) while a CUDA graph is being captured."""
        if self.data.is_cuda and torch.cuda.is_current_stream_capturing():
            raise MLAInputError(
                "check_values: expected False while a CUDA graph is being captured (checking reads the slots on the "
                "host), got True; pass check_values=False for slots from reserve() (slots outside the cache are "
                "then skipped)"
            )
        outside = slots_outside(slots, self.num_slots)
        if bool(outside.any()):
            raise slot_failure(slots, outside, self.num_slots)

    def _set_auto_scale(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """The "auto" scale from a write's real (non-padding) rows, on the device, if it is still
        undecided: a write of padding rows only leaves it undecided, a write whose real rows hold
        no finite non-zero value decides it at the current scale (1.0). No host sync: on CUDA the
        host learns of the decision from the pinned copy of the flag, on a later write."""
        known = self._auto_undecided_host if self._auto_undecided_host is not None else self._auto_undecided
        if not bool(known):  # a host tensor: no sync
            self._auto_undecided = self._auto_undecided_host = None
            return
        if self.data.is_cuda and torch.cuda.is_current_stream_capturing():
            raise MLAInputError(
                "fp8_scale='auto': this layer's scale is not known to be set and a CUDA graph is being captured "
                "(the graph would repeat the scale's update on every replay); write real rows (padding rows do not "
                "count) and synchronize, or call calibrate_fp8_scale first"
            )
        real = self._in_cache(slots)
        scale = fp8_scale_from_rows(torch.where(real[:, None], rows, 0))
        decides = self._auto_undecided & real.any()
        self.scale.copy_(torch.where(decides & (scale > 0), scale, self.scale))
        self._auto_undecided &= ~decides
        if self._auto_undecided_host is not None:
            self._auto_undecided_host.copy_(self._auto_undecided, non_blocking=True)
        elif not bool(self._auto_undecided):
            self._auto_undecided = None

    def calibrate_fp8_scale(self, samples: torch.Tensor, headroom: float = AUTO_SCALE_HEADROOM) -> float:
        """Sets the per-tensor fp8 scale from sample rows `[n, dim]` (e.g. latents of calibration
        prompts) to `amax * headroom / 448` and returns it; an "auto" store then stays at it.
        Reads the scale back, so it syncs: calibrate before serving.

        >>> store = LatentStore(2, 4, 8, dtype="fp8_e4m3", fp8_scale="auto")
        >>> store.calibrate_fp8_scale(torch.full((3, 8), 56.0))
        0.25
        """
        if not self.is_fp8 or self.scale_layout != "tensor":
            raise ConfigError(
                f"calibrate_fp8_scale needs dtype='fp8_e4m3' with scale_layout='tensor', got {self.dtype!r}, {self.scale_layout!r}"
            )
        if not (_is_finite_number(headroom) and headroom >= 1):
            raise ConfigError(
                f"headroom must be a finite number >= 1 (below 1 the samples' own largest values saturate), got {headroom!r}"
            )
        dim = self.data.shape[-1]
        if not isinstance(samples, torch.Tensor) or samples.dim() != 2 or samples.shape[0] == 0 or samples.shape[1] != dim:
            shape = tuple(samples.shape) if isinstance(samples, torch.Tensor) else type(samples).__name__
            raise MLAInputError(f"samples: expected a tensor [rows, {dim}] with rows >= 1, got {shape}")
        scale = float(fp8_scale_from_rows(samples.to(self.data.device), headroom))
        if scale == 0:
            raise MLAInputError("samples: expected at least one finite non-zero value, got none")
        self.scale.fill_(scale)
        self._auto_undecided = self._auto_undecided_host = None
        return scale

    def dequantized(self) -> torch.Tensor:
        """All rows as float32 values (what the stored bytes represent)."""
        return dequantize(self.data, self.scale)


class PagedLatentCache:
    """A paged latent KV cache: one page table (allocator, per-sequence pages and lengths)
    shared by `num_layers` LatentStores of `[num_pages, page_size, kv_lora_rank + rope_dim]`.

    `data`, `scale`, `write_slots` and `dequantized` are those of layer 0, for single-layer use.
    `fp8_scale` is one value for every layer (a float, "auto" or None, see LatentStore) or a
    sequence of per-layer floats (the per-layer kv scales a checkpoint carries).

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
        fp8_scale: FP8Scale | Sequence[float] = None,
        num_layers: int = 1,
    ) -> None:
        if not all(is_int(v) for v in (page_size, kv_lora_rank, rope_dim, num_layers)) or (
            page_size <= 0 or kv_lora_rank <= 0 or rope_dim < 0 or num_layers <= 0
        ):
            raise ConfigError(
                "page_size, kv_lora_rank and num_layers must be integers >= 1 and rope_dim an integer >= 0, got "
                f"{page_size!r}, {kv_lora_rank!r}, {num_layers!r} and {rope_dim!r}"
            )
        self.page_size = page_size
        self.kv_lora_rank = kv_lora_rank
        self.rope_dim = rope_dim
        self.allocator = PageAllocator(num_pages)
        if isinstance(fp8_scale, Sequence) and not isinstance(fp8_scale, str):
            if len(fp8_scale) != num_layers:
                raise ConfigError(f"fp8_scale: expected one scale per layer ({num_layers}), got {len(fp8_scale)}")
            per_layer = list(fp8_scale)
        else:
            per_layer = [fp8_scale] * num_layers
        self.stores = [
            LatentStore(num_pages, page_size, self.dim, dtype=dtype, device=device, scale_layout=scale_layout, fp8_scale=scale)
            for scale in per_layer
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

    @property
    def is_fp8(self) -> bool:
        return self.stores[0].is_fp8

    def fp8_saturation_counts(self) -> list[FP8Counts]:
        """Per layer, the values fp8 writes saturated at +-448 and the non-finite inputs they
        stored as NaN, since the cache was made. One host sync (one copy of every layer's
        counters): call it where a step already syncs, as Runner does after sampling.

        >>> cache = PagedLatentCache(2, 16, 8, 8, dtype="fp8_e4m3", num_layers=2)
        >>> cache.layer(1).write_slots(cache.reserve(0, 1), torch.tensor([[1e6] * 3 + [float("nan")] + [1.0] * 12]))
        >>> cache.fp8_saturation_counts()
        [FP8Counts(saturated=0, non_finite=0), FP8Counts(saturated=3, non_finite=1)]
        """
        if not self.is_fp8:
            raise ConfigError(f"fp8_saturation_counts needs an fp8_e4m3 cache, this one holds {self.stores[0].dtype}")
        return [FP8Counts(*layer) for layer in torch.stack([s.fp8_counts for s in self.stores]).tolist()]

    def calibrate_fp8_scale(self, samples: Sequence[torch.Tensor], headroom: float = AUTO_SCALE_HEADROOM) -> list[float]:
        """Sets each layer's per-tensor fp8 scale from its sample rows `[n, kv_lora_rank + rope_dim]`
        (`samples[i]` for layer i, e.g. `[c_kv ; k_pe]` of calibration prompts) and returns the scales;
        see `LatentStore.calibrate_fp8_scale`.

        >>> cache = PagedLatentCache(2, 16, 8, 8, dtype="fp8_e4m3", num_layers=2)
        >>> cache.calibrate_fp8_scale([torch.full((4, 16), 224.0), torch.full((4, 16), -2.0)], headroom=1.0)
        [0.5, 0.004464285913854837]
        """
        if isinstance(samples, torch.Tensor) or not isinstance(samples, Sequence):
            raise MLAInputError(f"samples: expected a list of one tensor per layer ({len(self.stores)}), "
                                f"got {type(samples).__name__}")
        if len(samples) != len(self.stores):
            raise MLAInputError(f"samples: expected one tensor per layer ({len(self.stores)}), got {len(samples)}")
        return [store.calibrate_fp8_scale(rows, headroom) for store, rows in zip(self.stores, samples)]

    def layer(self, index: int) -> LatentStore:
        """The rows of layer `index`."""
        if not is_int(index) or not 0 <= index < len(self.stores):
            raise MLAInputError(f"index: expected a layer in [0, {len(self.stores)}), got {index!r}")
        return self.stores[index]

    def write_slots(self, slots: torch.Tensor, rows: torch.Tensor, *, check_values: bool = True) -> None:
        """Layer 0's `LatentStore.write_slots`."""
        self.stores[0].write_slots(slots, rows, check_values=check_values)

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
        for name, tensor in (("c_kv", c_kv), ("k_pe", k_pe)):
            if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
                got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise MLAInputError(f"{name}: expected a floating-point tensor, got {got}")
        n = c_kv.shape[0] if c_kv.dim() == 2 else -1
        if c_kv.dim() != 2 or c_kv.shape[1] != self.kv_lora_rank:
            raise MLAInputError(f"c_kv: expected shape [tokens, {self.kv_lora_rank}], got {tuple(c_kv.shape)}")
        if k_pe.dim() != 2 or tuple(k_pe.shape) != (n, self.rope_dim):
            raise MLAInputError(f"k_pe: expected shape [{n}, {self.rope_dim}], got {tuple(k_pe.shape)}")
        for name, tensor in (("c_kv", c_kv), ("k_pe", k_pe)):
            if tensor.device != self.device:
                raise MLAInputError(f"{name}: expected a tensor on {self.device} (the cache's device), got {tensor.device}")
        slots = self.reserve(seq_id, n)
        self.write_slots(slots, torch.cat([c_kv, k_pe], dim=1), check_values=False)
        return slots

    def reserve(self, seq_id: int, n: int) -> torch.Tensor:
        """Extends a sequence by `n` tokens and returns their flat slots (int64), for a caller that
        writes the rows itself (e.g. an attention layer). Nothing changes when pages run out."""
        _check_seq_id(seq_id)
        if not is_int(n) or n < 0:
            raise MLAInputError(f"n: expected a token count (an integer >= 0), got {n!r}")
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
        _check_seq_id(seq_id)
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
        _check_seq_ids(seq_ids)
        if max_pages is not None and not is_int(max_pages):
            raise MLAInputError(f"max_pages: expected an integer or None, got {max_pages!r}")
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
        _check_seq_ids(seq_ids)
        return torch.tensor([self.seq_len(s) for s in seq_ids], dtype=torch.int32, device=self.device)


def _check_seq_id(seq_id: object, name: str = "seq_id") -> None:
    if not is_int(seq_id):
        raise MLAInputError(f"{name}: expected an integer sequence id, got {seq_id!r}")


def _check_seq_ids(seq_ids: object) -> None:
    if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Sequence):
        raise MLAInputError(f"seq_ids: expected a list of sequence ids, got {type(seq_ids).__name__}")
    for i, seq_id in enumerate(seq_ids):
        _check_seq_id(seq_id, f"seq_ids[{i}]")
