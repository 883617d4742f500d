"""Multi-GPU MLA on torch.distributed: process groups, decode context parallelism (DCP).

- `join_ranks(config)`: a torchrun rank joins the process group (NCCL with a GPU per rank, else
  gloo) and builds the groups; `init_parallel(config)` checks the world against `ServingConfig.tp_size` / `dcp_size` and
  builds the TP and DCP groups (`ParallelGroups`);
- `TokenSharding`: which DCP rank caches which token (position -> rank, local position;
  local lengths), on ints or device tensors;
- `dcp_step` / `dcp_decode_step`: one step's per-rank metadata (local lengths, visible keys
  per query token, local cache slots with -1 for other ranks' tokens), no host sync;
- `dcp_attention`: one layer's exact attention over the sharded cache (`dcp_mla_forward`: the
  same from a model's q_nope / q_pe and `kv_b_proj`, as `mlakit.serving.forward.mla_forward`);
- `mlakit.distributed.tensor_parallel`: which slice of each model weight a TP rank holds, and
  the model's all-reduce / all-gather;
- `gather_heads` / `merge_across_ranks`: its two collectives, for engines with their own kernels
  (`exchange_partials`: the second one's all-to-all without the merge).
"""

from mlakit.distributed.attention import dcp_attention, dcp_mla_forward
from mlakit.distributed.collectives import exchange_partials, gather_heads, merge_across_ranks
from mlakit.distributed.groups import ParallelGroups, dcp_group_ranks, init_parallel, join_ranks
from mlakit.distributed.ownership import TokenSharding
from mlakit.distributed.step import DCPStep, dcp_decode_step, dcp_step

__all__ = [
    "DCPStep",
    "ParallelGroups",
    "TokenSharding",
    "dcp_attention",
    "dcp_mla_forward",
    "dcp_decode_step",
    "dcp_group_ranks",
    "dcp_step",
    "exchange_partials",
    "gather_heads",
    "init_parallel",
    "join_ranks",
    "merge_across_ranks",
]
