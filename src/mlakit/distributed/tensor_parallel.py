"""Tensor parallelism of a DeepSeek-architecture model: which slice of each weight a rank holds,
and the model's two collectives.

One place decides the slices, for the model (its per-rank module sizes) and the loader (what
it reads of each checkpoint tensor). The rules are Megatron's / vLLM's:
- attention heads: `q_proj` / `q_b_proj` and `kv_b_proj` rows (column parallel: rank r holds
  heads `r * H/tp ..`), `o_proj` columns (row parallel: partial outputs, all-reduced; its bias,
  if any, is held by rank 0 only so the sum adds it once);
- MLP: the dense MLP's, every routed expert's and the shared experts' `gate_proj` / `up_proj`
  rows and `down_proj` columns (the intermediate dimension), one all-reduce per MLP or MoE block;
- vocabulary: `embed_tokens` rows (each rank looks up the ids in its range, zeros elsewhere,
  all-reduce) and `lm_head` rows (each rank's logits, all-gathered);
- everything else (`q_a_proj`, `kv_a_proj_with_mqa`, the norms, the router) is replicated: the
  latent cache rows are the same on every rank.
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from torch import nn

from mlakit.distributed.groups import ParallelGroups
from mlakit.errors import ConfigError

_SPLIT_AXIS = (
    (re.compile(r"\.self_attn\.(q_proj|q_b_proj|kv_b_proj)\.weight$"), 0),
    (re.compile(r"\.self_attn\.o_proj\.weight$"), 1),
    (re.compile(r"\.mlp\.(experts\.\d+\.|shared_experts\.)?(gate_proj|up_proj)\.weight$"), 0),
    (re.compile(r"\.mlp\.(experts\.\d+\.|shared_experts\.)?down_proj\.weight$"), 1),
    (re.compile(r"^(model\.embed_tokens|lm_head)\.weight$"), 0),
)
_RANK_ZERO_ONLY = re.compile(r"\.self_attn\.o_proj\.bias$")


def split_axis(name: str) -> int | None:
    """The axis along which tensor parallelism splits checkpoint tensor `name` (0: rows, 1:
    columns), or None when every rank holds all of it.

    >>> split_axis("model.layers.3.self_attn.kv_b_proj.weight"), split_axis("model.layers.3.mlp.experts.7.down_proj.weight")
    (0, 1)
    >>> split_axis("model.layers.3.self_attn.kv_a_proj_with_mqa.weight") is None
    True
    """
    return next((axis for pattern, axis in _SPLIT_AXIS if pattern.search(name)), None)


def held_by(name: str, rank: int) -> bool:
    """Whether TP rank `rank` holds tensor `name` at all (a row-parallel bias lives on rank 0 only).

    >>> held_by("model.layers.0.self_attn.o_proj.bias", 1), held_by("model.layers.0.self_attn.o_proj.weight", 1)
    (False, True)
    """
    return rank == 0 or not _RANK_ZERO_ONLY.search(name)


# The largest tp_size an error lists among a dimension's divisors (a vocabulary has many more).
MAX_LISTED_TP = 64


def shard_size(total: int, tp_size: int, what: str) -> int:
    """Each rank's part of a dimension of `total` split over `tp_size` ranks; `what` names the
    setting in the error when it does not divide.

    >>> shard_size(384, 4, "intermediate_size")
    96
    >>> shard_size(384, 5, "intermediate_size")
    Traceback (most recent call last):
    ...
    mlakit.errors.ConfigError: tp_size=5 does not divide intermediate_size=384: every rank holds an equal share; use a tp_size in [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64] (its divisors up to 64)
    """
    if total % tp_size:
        divisors = [d for d in range(1, min(total, MAX_LISTED_TP) + 1) if total % d == 0]
        raise ConfigError(
            f"tp_size={tp_size} does not divide {what}={total}: every rank holds an equal share; use a tp_size in {divisors} "
            f"(its divisors up to {MAX_LISTED_TP})"
        )
    return total // tp_size


def shard_slice(name: str, shape: tuple[int, ...], rank: int, tp_size: int) -> tuple[slice, ...]:
    """The index of rank `rank`'s part of checkpoint tensor `name` of full `shape` (all of it when
    replicated): contiguous equal blocks along `split_axis(name)`.

    >>> shard_slice("model.layers.0.self_attn.o_proj.weight", (256, 512), rank=1, tp_size=4)
    (slice(None, None, None), slice(128, 256, None))
    """
    axis = split_axis(name)
    index = [slice(None)] * len(shape)
    if axis is not None and tp_size > 1:
        size = shard_size(shape[axis], tp_size, f"dimension {axis} of {name}")
        index[axis] = slice(rank * size, (rank + 1) * size)
    return tuple(index)


def all_reduce(x: torch.Tensor, parallel: ParallelGroups | None) -> torch.Tensor:
    """Sums `x` over the TP group in place and returns it (a row-parallel layer's partial
    outputs); `x` itself with one rank.

    >>> all_reduce(torch.ones(2), None)
    tensor([1., 1.])
    """
    if parallel is not None and parallel.tp_size > 1:
        dist.all_reduce(x, group=parallel.tp_group)
    return x


def gather_last_axis(x: torch.Tensor, parallel: ParallelGroups | None) -> torch.Tensor:
    """All-gathers `x [..., n]` along its last axis over the TP group: `[..., tp_size * n]`, rank
    r's part at `r * n ..` (the column-parallel LM head's logits); `x` itself with one rank.

    >>> gather_last_axis(torch.ones(2, 3), None).shape
    torch.Size([2, 3])
    """
    if parallel is None or parallel.tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(parallel.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=parallel.tp_group)
    return torch.cat(parts, dim=-1)


class VocabParallelEmbedding(nn.Embedding):
    """`nn.Embedding` over this rank's block of the vocabulary: ids outside it look up zeros,
    and the ranks' rows are summed (all-reduce). With `parallel=None` it is `nn.Embedding`.

    >>> VocabParallelEmbedding(512, 8, None)(torch.tensor([3, 511])).shape
    torch.Size([2, 8])
    """

    def __init__(self, vocab_size: int, hidden_size: int, parallel: ParallelGroups | None) -> None:
        tp_size = 1 if parallel is None else parallel.tp_size
        rows = shard_size(vocab_size, tp_size, "vocab_size")
        super().__init__(rows, hidden_size)
        self.parallel = parallel
        self.first_id = 0 if parallel is None else parallel.rank * rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.parallel is None or self.parallel.tp_size == 1:
            return super().forward(ids)
        local = ids - self.first_id
        outside = (local < 0) | (local >= self.num_embeddings)
        rows = super().forward(local.masked_fill(outside, 0)).masked_fill(outside[..., None], 0)
        return all_reduce(rows, self.parallel)
