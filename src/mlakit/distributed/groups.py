"""Process groups for tensor parallelism (TP) and decode context parallelism (DCP).

The processes are started by the launcher (torchrun) and joined by the engine with
`torch.distributed.init_process_group` (NCCL on GPUs, gloo on CPU); `init_parallel` checks
that the world matches the configuration and builds the groups. The layout is vLLM's: the
TP group is every rank (rank r holds query heads `r * H/tp .. (r+1) * H/tp - 1`), and DCP
reuses the TP ranks: consecutive groups of `dcp_size` ranks split the cached tokens, and
the `tp_size / dcp_size` groups hold the same shards. `join_ranks` does both for a command
started by torchrun (`mlakit generate`, `mlakit bench decode --graphs`).
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist

from mlakit.config import AUTO, ServingConfig
from mlakit.distributed.ownership import TokenSharding
from mlakit.errors import ConfigError


def dcp_group_ranks(tp_size: int, dcp_size: int) -> list[list[int]]:
    """The ranks of each DCP group: consecutive runs of `dcp_size` TP ranks.

    >>> dcp_group_ranks(tp_size=8, dcp_size=2)
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    ServingConfig(tp_size=tp_size, dcp_size=dcp_size)  # the same checks as the configuration's
    return [list(range(first, first + dcp_size)) for first in range(0, tp_size, dcp_size)]


@dataclasses.dataclass(frozen=True)
class ParallelGroups:
    """This process's place in the TP and DCP groups, with the groups to pass to collectives.

    `sharding` and `dcp_rank` say which of every sequence's tokens this rank's cache holds.
    """

    rank: int
    tp_size: int
    dcp_size: int
    sharding: TokenSharding
    tp_group: dist.ProcessGroup
    dcp_group: dist.ProcessGroup

    @property
    def dcp_rank(self) -> int:
        """This rank's index inside its DCP group (the token shard it caches)."""
        return self.rank % self.dcp_size


def init_parallel(config: ServingConfig) -> ParallelGroups:
    """Checks `torch.distributed` against `config` and builds the TP and DCP groups.

    Every process must call it, in the same order as its other group creations: the world
    size must equal `config.tp_size` (pipeline and data parallelism are not served).

    >>> init_parallel(ServingConfig(tp_size=2, dcp_size=2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mlakit.errors.ConfigError: tp_size=2 needs torch.distributed, which is not initialized: ...
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            f"tp_size={config.tp_size} needs torch.distributed, which is not initialized: start one process per rank "
            f"(torchrun --nproc-per-node {config.tp_size} ...) and call torch.distributed.init_process_group('nccl') on "
            "GPUs or ('gloo') on CPU before init_parallel"
        )
    world = dist.get_world_size()
    if world != config.tp_size:
        raise ConfigError(
            f"world size {world} does not equal tp_size={config.tp_size}: mlakit runs one rank per TP shard; start "
            f"{config.tp_size} processes (torchrun --nproc-per-node {config.tp_size}) or set tp_size={world}"
        )
    rank = dist.get_rank()
    dcp_group = None
    for ranks in dcp_group_ranks(config.tp_size, config.dcp_size):
        group = dist.new_group(ranks)  # every rank creates every group, in the same order
        if rank in ranks:
            dcp_group = group
    assert dcp_group is not None  # the groups cover every rank
    return ParallelGroups(
        rank=rank,
        tp_size=config.tp_size,
        dcp_size=config.dcp_size,
        sharding=TokenSharding(config.dcp_size, config.dcp_interleave),
        tp_group=dist.group.WORLD,
        dcp_group=dcp_group,
    )


# NVLink SHARP (NVLS) multicast stays off: the machines mlakit is tested on do not support it.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def join_ranks(config: ServingConfig, command: str = "-m mlakit.cli generate ...") -> tuple[ServingConfig, ParallelGroups | None]:
    """For `tp_size > 1`: joins the torchrun process group, if not yet joined (NCCL when every
    local rank has its own GPU, else gloo), and builds the TP / DCP groups (`init_parallel`
    checks the world size); `device='auto'` becomes this rank's GPU, `cuda:LOCAL_RANK` (GPUs
    shared round-robin when fewer), or the CPU. The variables of `NO_MULTICAST` are set where
    unset, before NCCL starts. `command` (what torchrun runs) goes into the error for a process
    not started by torchrun. One process: `config` unchanged and no groups.

    >>> join_ranks(ServingConfig())[1] is None
    True
    >>> join_ranks(ServingConfig(tp_size=2), "-m mlakit.bench decode --graphs")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mlakit.errors.ConfigError: tp_size=2 runs one process per rank: start them with torchrun --nproc-per-node 2 -m mlakit.bench decode --graphs --tp-size 2
    """
    if config.tp_size == 1:
        return config, None
    if not dist.is_initialized() and ("RANK" not in os.environ or "WORLD_SIZE" not in os.environ):
        raise ConfigError(
            f"tp_size={config.tp_size} runs one process per rank: start them with torchrun --nproc-per-node "
            f"{config.tp_size} {command} --tp-size {config.tp_size}"
        )
    for name, value in NO_MULTICAST.items():
        os.environ.setdefault(name, value)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if config.device == AUTO:
        config = dataclasses.replace(config, device=f"cuda:{local_rank % gpus}" if gpus else "cpu")
    if not dist.is_initialized():
        own_gpu = config.device.startswith("cuda") and gpus >= int(os.environ.get("LOCAL_WORLD_SIZE", config.tp_size))
        dist.init_process_group("nccl" if own_gpu else "gloo", device_id=torch.device(config.device) if own_gpu else None)
    return config, init_parallel(config)
