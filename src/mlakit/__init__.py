"""mlakit: Multi-head Latent Attention for LLM serving.

>>> import mlakit
>>> mlakit.resolve(mlakit.ServingConfig(), mlakit.MLAShape.preset("deepseek-v3"), mlakit.DeviceInfo.from_arch("cpu")).decode_backend
'reference'
"""

from mlakit.attention.functional import (DecodeMetadata, backend_for, mla_decode, mla_decode_metadata,
                                        mla_extend, mla_extend_metadata, mla_prefill)
from mlakit.cache import PageAllocator, PagedLatentCache
from mlakit.config import ServingConfig
from mlakit.device import DeviceInfo
from mlakit.kernels.seesaw_layout import decode_page_size_hint
from mlakit.errors import CacheFullError, ConfigError, FP8SaturationWarning, MLAInputError, MLAKitError, WorkspaceError
from mlakit.plan import Plan, WorkspaceRequest
from mlakit.prefill.metadata import PrefillMetadata, plan_prefill
from mlakit.reference import merge_attention_states, reference_decode, reference_extend
from mlakit.registry.resolve import resolve
from mlakit.shape import MLAShape
from mlakit.workspace import WorkspacePool
from mlakit import distributed  # the multi-GPU helpers: mlakit.distributed.merge_across_ranks, ...

__all__ = [
    "CacheFullError",
    "ConfigError",
    "DecodeMetadata",
    "DeviceInfo",
    "FP8SaturationWarning",
    "MLAInputError",
    "MLAKitError",
    "MLAShape",
    "PageAllocator",
    "PagedLatentCache",
    "Plan",
    "PrefillMetadata",
    "ServingConfig",
    "WorkspaceError",
    "WorkspacePool",
    "WorkspaceRequest",
    "backend_for",
    "decode_page_size_hint",
    "distributed",
    "merge_attention_states",
    "mla_decode",
    "mla_decode_metadata",
    "mla_extend",
    "mla_extend_metadata",
    "mla_prefill",
    "plan_prefill",
    "reference_decode",
    "reference_extend",
    "resolve",
]
