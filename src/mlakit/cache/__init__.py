"""The paged latent KV cache: pages and their allocator (`paged`), fp8 storage and scales (`kv_quant`)."""

from mlakit.cache.paged import FP8Counts, LatentStore, PageAllocator, PagedLatentCache, num_pages_for_budget

__all__ = ["FP8Counts", "LatentStore", "PageAllocator", "PagedLatentCache", "num_pages_for_budget"]
