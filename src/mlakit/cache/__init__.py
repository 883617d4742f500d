"""The paged latent KV cache: pages and their allocator (`paged`), fp8 storage and scales (`kv_quant`)."""

from mlakit.cache.paged import LatentStore, PageAllocator, PagedLatentCache, num_pages_for_budget

__all__ = ["LatentStore", "PageAllocator", "PagedLatentCache", "num_pages_for_budget"]
