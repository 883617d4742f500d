"""The MLA attention layer of DeepSeek-V2/V3-architecture models, over mlakit's paged latent cache.

Parameter names match Hugging Face checkpoints (`q_a_proj`, `q_a_layernorm`, `q_b_proj` or
`q_proj`, `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`), so a checkpoint's
layer state dict loads as is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mlakit.cache import LatentStore
from mlakit.config import AUTO
from mlakit.config.hf import HFConfig
from mlakit.distributed.attention import dcp_mla_forward
from mlakit.distributed.groups import ParallelGroups
from mlakit.distributed.step import DCPStep
from mlakit.errors import ConfigError
from mlakit.serving.forward import mla_forward
from mlakit.model.rope import RopeConfig, RopeLayout, RotaryEmbedding
from mlakit.shape import MLAShape
from mlakit.serving.step import AttentionStep

LATENT_NORM_EPS = 1e-6


class RMSNorm(nn.Module):
    """RMS normalisation computed in float32, cast back, times the weight (as DeepSeek checkpoints expect)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


@dataclasses.dataclass(frozen=True)
class MLALayerConfig:
    """Hidden size, per-rank shape and rope of one MLA layer.

    >>> cfg = MLALayerConfig.from_hf_config({"model_type": "deepseek_v3", "hidden_size": 256,
    ...     "num_attention_heads": 8, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    ...     "v_head_dim": 128, "q_lora_rank": 64, "rope_theta": 10000.0})
    >>> cfg.rope.layout, cfg.shape.num_heads
    ('deinterleave', 8)
    """

    hidden_size: int
    shape: MLAShape
    rope: RopeConfig
    attention_bias: bool = False

    @classmethod
    def from_hf_config(cls, config: HFConfig | Mapping[str, Any], tp_size: int = 1) -> MLALayerConfig:
        hf = HFConfig.load(config)
        model_type = hf.choice("model_type", ("deepseek_v2", "deepseek_v3"), "deepseek_v3")
        layout: RopeLayout = "interleaved"
        if model_type == "deepseek_v3":
            layout = "deinterleave" if hf.flag("rope_interleave", True) else "halves"
        return cls(
            hidden_size=hf.integer("hidden_size"),
            shape=hf.mla_shape().for_tp(tp_size),
            rope=RopeConfig.from_hf_config(hf, layout),
            attention_bias=hf.flag("attention_bias", False),
        )


class MLAAttention(nn.Module):
    """MLA attention of one layer: projections, rope, cache write, attention, output projection.

    Decode sequences and short extends run in the latent (absorbed) form (`mla_decode` /
    `mla_extend`, the query in the cache's 16-bit dtype; a float32 cache, kept for exact
    reference runs, goes through the torch oracles); longer prefills run in MHA form
    (`mla_prefill`: decompressed K/V, cached prefix in chunks). One step may mix them. The
    absorbed weights W_UK / W_UV are views of `kv_b_proj`, so loading a state dict updates them.

    Under tensor parallelism (`parallel`, with `config.shape` the per-rank shape) the layer holds
    its rank's heads and returns its PARTIAL `o_proj` output, to be summed over the TP group
    (`mlakit.distributed.tensor_parallel.all_reduce`); `o_proj`'s bias lives on rank 0 only.
    Under decode context parallelism the step is a `DCPStep`: the layer writes only the tokens
    this rank owns and attends through `dcp_mla_forward`.
    """

    def __init__(self, config: MLALayerConfig, parallel: ParallelGroups | None = None) -> None:
        super().__init__()
        self.config = config
        self.parallel = parallel
        shape = config.shape
        hidden, heads = config.hidden_size, shape.num_heads
        if shape.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * shape.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, shape.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm = RMSNorm(shape.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(shape.q_lora_rank, heads * shape.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, shape.kv_cache_dim, bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(shape.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(shape.kv_lora_rank, heads * (shape.qk_nope_head_dim + shape.v_head_dim), bias=False)
        o_proj_bias = config.attention_bias and (parallel is None or parallel.rank == 0)
        self.o_proj = nn.Linear(heads * shape.v_head_dim, hidden, bias=o_proj_bias)
        self.rotary = RotaryEmbedding(config.rope)

    def project_query(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q_nope `[T, H, d_nope]` and roped q_pe `[T, H, d_rope]` for hidden states `[T, hidden]`."""
        shape = self.config.shape
        if shape.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(x.shape[0], shape.num_heads, shape.qk_head_dim)
        q_nope, q_pe = q.split([shape.qk_nope_head_dim, shape.qk_rope_head_dim], dim=-1)
        return q_nope, self.rotary(q_pe, positions)

    def project_latent(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The cache rows `[T, kv_lora_rank + d_rope]`: normalised latent and roped shared key."""
        shape = self.config.shape
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([shape.kv_lora_rank, shape.qk_rope_head_dim], dim=-1)
        return torch.cat([self.kv_a_layernorm(c_kv), self.rotary(k_pe, positions)], dim=-1)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        step: AttentionStep | DCPStep,
        cache: LatentStore,
        *,
        decode_backend: str = AUTO,
        prefill_backend: str = AUTO,
        check_inputs: bool = True,
    ) -> torch.Tensor:
        """Attention output `[T, hidden]` for the step's packed new tokens `x [T, hidden]`.

        Writes the new tokens' latent rows into `cache` at `step.slots` (-1: another DCP rank's
        token; unchecked, as slots from the cache's `reserve`: any outside it are skipped), then
        attends over each sequence's cached tokens (causal among the new ones), each part of the
        step on its kernel (`mlakit.serving.forward.mla_forward`, with `check_inputs`: False skips its value
        checks and their host sync, for steps whose tables and lengths the caller's own allocator made), or every
        token in the latent form over the DCP group's shards (`dcp_mla_forward`).
        """
        q_nope, q_pe = self.project_query(x, positions)
        cache.write_slots(step.slots, self.project_latent(x, positions), check_values=False)
        scale = self.config.shape.softmax_scale
        if isinstance(step, DCPStep):
            if self.parallel is None:
                raise ConfigError("a DCPStep needs a model built with ParallelGroups (decode context parallelism)")
            out = dcp_mla_forward(q_nope, q_pe, cache.data, cache.scale, self.kv_b_proj.weight, step, self.parallel.dcp_group,
                                  softmax_scale=scale, backend=decode_backend)
        else:
            out = mla_forward(
                q_nope, q_pe, cache.data, cache.scale, self.kv_b_proj.weight, step,
                softmax_scale=scale, decode_backend=decode_backend, prefill_backend=prefill_backend,
                check_inputs=check_inputs,
            )
        return self.o_proj(out.to(x.dtype).flatten(1))
