"""Feed-forward blocks of DeepSeek-architecture models: the dense MLP and the routed MoE.

Routing follows the checkpoint's config: DeepSeek-V3 scores experts with a sigmoid plus a
correction bias and picks within the best groups (by the sum of each group's top two);
DeepSeek-V2 scores with a softmax and picks greedily, or within the best groups (by each
group's best expert). Parameter names match Hugging Face checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from mlakit.distributed.tensor_parallel import shard_size
from mlakit.config.hf import HFConfig

Scoring = Literal["sigmoid_group_sum", "softmax_greedy", "softmax_group_max"]


class MLP(nn.Module):
    """SiLU-gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Routed-expert settings read from a DeepSeek config."""

    num_experts: int
    top_k: int
    intermediate_size: int
    shared_experts: int
    scoring: Scoring
    num_groups: int
    top_groups: int
    normalize_top_k: bool
    routed_scaling_factor: float

    @classmethod
    def from_hf_config(cls, config: HFConfig | Mapping[str, Any]) -> MoEConfig:
        """Reads the routing fields through the shared reader and checks them against each other:
        `num_experts_per_tok` <= `n_routed_experts`, `n_group` divides the experts, `topk_group` <=
        `n_group`, and the chosen groups hold at least `num_experts_per_tok` experts (two per group
        for V3's top-two group score).

        >>> MoEConfig.from_hf_config({"n_routed_experts": 4, "num_experts_per_tok": 8, "moe_intermediate_size": 16})
        Traceback (most recent call last):
        ...
        mlakit.errors.ConfigError: config: num_experts_per_tok: expected an integer <= n_routed_experts (4), got 8
        """
        hf = HFConfig.load(config)
        model_type = hf.choice("model_type", ("deepseek_v2", "deepseek_v3"), "deepseek_v3")
        scoring: Scoring = "sigmoid_group_sum"
        if model_type == "deepseek_v2":
            method = hf.choice("topk_method", ("greedy", "group_limited_greedy"), "greedy")
            scoring = "softmax_group_max" if method == "group_limited_greedy" else "softmax_greedy"
        num_experts, top_k = hf.integer("n_routed_experts"), hf.integer("num_experts_per_tok")
        num_groups, top_groups = hf.integer("n_group", 1), hf.integer("topk_group", 1)
        if top_k > num_experts:
            raise hf.error("num_experts_per_tok", f"an integer <= n_routed_experts ({num_experts})", top_k)
        if scoring != "softmax_greedy":
            if num_experts % num_groups:
                raise hf.error("n_group", f"a divisor of n_routed_experts ({num_experts})", num_groups)
            if top_groups > num_groups:
                raise hf.error("topk_group", f"an integer <= n_group ({num_groups})", top_groups)
            per_group = num_experts // num_groups
            if scoring == "sigmoid_group_sum" and per_group < 2:
                raise hf.error("n_group", f"at most n_routed_experts / 2 = {num_experts // 2} groups (V3 scores a group by its top two experts)", num_groups)
            if top_k > top_groups * per_group:
                raise hf.error("num_experts_per_tok", f"<= topk_group * experts per group = {top_groups * per_group}", top_k)
        return cls(
            num_experts=num_experts,
            top_k=top_k,
            intermediate_size=hf.integer("moe_intermediate_size"),
            shared_experts=hf.integer("n_shared_experts", 0, minimum=0),
            scoring=scoring,
            num_groups=num_groups,
            top_groups=top_groups,
            normalize_top_k=hf.flag("norm_topk_prob", False) and model_type == "deepseek_v3",
            routed_scaling_factor=hf.number("routed_scaling_factor", 1.0),
        )


class Router(nn.Module):
    """Chooses `top_k` experts per token and their weights."""

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.zeros(config.num_experts, hidden_size))
        if config.scoring == "sigmoid_group_sum":
            self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert weights `[T, top_k]` (float32) and indices `[T, top_k]`."""
        cfg = self.config
        logits = nn.functional.linear(x.float(), self.weight.float())
        if cfg.scoring == "sigmoid_group_sum":
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias
            group_score = choice.view(-1, cfg.num_groups, cfg.num_experts // cfg.num_groups).topk(2, dim=-1)[0].sum(-1)
            choice = self._mask_to_top_groups(choice, group_score, float("-inf"))
        else:
            scores = logits.softmax(dim=-1)
            choice = scores
            if cfg.scoring == "softmax_group_max":
                group_score = scores.view(-1, cfg.num_groups, cfg.num_experts // cfg.num_groups).amax(-1)
                choice = self._mask_to_top_groups(scores, group_score, 0.0)
        indices = choice.topk(cfg.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, indices)
        if cfg.normalize_top_k:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, indices

    def _mask_to_top_groups(self, choice: torch.Tensor, group_score: torch.Tensor, fill: float) -> torch.Tensor:
        cfg = self.config
        best_groups = group_score.topk(cfg.top_groups, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_score).scatter_(1, best_groups, 1).bool()
        expert_mask = group_mask.repeat_interleave(cfg.num_experts // cfg.num_groups, dim=1)
        return choice.masked_fill(~expert_mask, fill)


class MoE(nn.Module):
    """Routed experts plus always-on shared experts.

    With `tp_size > 1` every rank routes every token (the router is replicated) and holds a
    `1/tp_size` slice of each expert's intermediate dimension, so its output is a partial sum
    for the TP group to all-reduce (SGLang's TP MoE).
    """

    def __init__(self, hidden_size: int, config: MoEConfig, tp_size: int = 1) -> None:
        super().__init__()
        self.gate = Router(hidden_size, config)
        expert_size = shard_size(config.intermediate_size, tp_size, "moe_intermediate_size")
        self.experts = nn.ModuleList(MLP(hidden_size, expert_size) for _ in range(config.num_experts))
        self.shared_experts = MLP(hidden_size, expert_size * config.shared_experts) if config.shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, indices = self.gate(x)
        out = torch.zeros_like(x)
        for expert_id in indices.unique().tolist():
            token, slot = torch.nonzero(indices == expert_id, as_tuple=True)
            routed = self.experts[expert_id](x[token]) * weights[token, slot, None]
            out.index_add_(0, token, routed.to(out.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
