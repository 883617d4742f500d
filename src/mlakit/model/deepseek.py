"""A DeepSeek-V2/V3-architecture causal LM whose attention runs on mlakit's paged latent cache.

Module and parameter names follow Hugging Face checkpoints (`model.embed_tokens`,
`model.layers.N.self_attn.*`, `model.layers.N.mlp.*`, `model.norm`, `lm_head`), so a
checkpoint's tensors load by name.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mlakit.cache import PagedLatentCache
from mlakit.distributed.groups import ParallelGroups
from mlakit.distributed.step import DCPStep
from mlakit.distributed.tensor_parallel import VocabParallelEmbedding, all_reduce, gather_last_axis, shard_size
from mlakit.config.hf import HFConfig
from mlakit.errors import ConfigError, MLAInputError
from mlakit.model.mla_attention import MLAAttention, MLALayerConfig, RMSNorm
from mlakit.model.moe import MLP, MoE, MoEConfig
from mlakit.prefill.metadata import upload_ints
from mlakit.serving.step import AttentionStep

SUPPORTED_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")


@dataclasses.dataclass(frozen=True)
class DeepseekConfig:
    """The parts of a DeepSeek `config.json` the runner uses; `attention` is the per-rank layer
    of `tp_size` tensor-parallel ranks, the other sizes are the whole model's. `mtp_layers`
    (`num_nextn_predict_layers`) multi-token-prediction layers follow the `num_layers` decoder
    layers in a checkpoint; the model does not run them and the loader skips them."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    rms_norm_eps: float
    first_dense_layers: int
    moe: MoEConfig | None
    attention: MLALayerConfig
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    tp_size: int = 1
    mtp_layers: int = 0

    @classmethod
    def from_hf_config(cls, config: HFConfig | Mapping[str, Any], tp_size: int = 1) -> DeepseekConfig:
        """Reads every field the model uses through the shared reader (`mlakit.config.hf`), which
        `mlakit check` uses too; errors name the field and, for a file, the file.

        >>> DeepseekConfig.from_hf_config({"num_hidden_layers": 2, "first_k_dense_replace": 3})
        Traceback (most recent call last):
        ...
        mlakit.errors.ConfigError: config: first_k_dense_replace: expected an integer <= num_hidden_layers (2), got 3
        """
        hf = HFConfig.load(config)
        architectures = hf.data.get("architectures") or []
        if not isinstance(architectures, list) or (architectures and not set(map(str, architectures)) & set(SUPPORTED_ARCHITECTURES)):
            raise hf.error("architectures", f"a list naming one of {list(SUPPORTED_ARCHITECTURES)}", repr(architectures))
        hf.choice("hidden_act", ("silu",), "silu")
        num_layers = hf.integer("num_hidden_layers")
        first_dense = hf.integer("first_k_dense_replace", 0, minimum=0)
        if first_dense > num_layers:
            raise hf.error("first_k_dense_replace", f"an integer <= num_hidden_layers ({num_layers})", first_dense)
        has_moe = hf.integer("n_routed_experts", 0, minimum=0) and first_dense < num_layers
        vocab_size = hf.integer("vocab_size")
        return cls(
            vocab_size=vocab_size,
            hidden_size=hf.integer("hidden_size"),
            num_layers=num_layers,
            intermediate_size=hf.integer("intermediate_size"),
            rms_norm_eps=hf.number("rms_norm_eps", 1e-6),
            first_dense_layers=first_dense,
            moe=MoEConfig.from_hf_config(hf) if has_moe else None,
            attention=MLALayerConfig.from_hf_config(hf, tp_size),
            tie_word_embeddings=hf.flag("tie_word_embeddings", False),
            eos_token_ids=hf.token_ids("eos_token_id", vocab_size),
            tp_size=tp_size,
            mtp_layers=hf.integer("num_nextn_predict_layers", 0, minimum=0),
        )


class DecoderLayer(nn.Module):
    def __init__(self, config: DeepseekConfig, index: int, parallel: ParallelGroups | None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLAAttention(config.attention, parallel)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.moe is not None and index >= config.first_dense_layers:
            self.mlp: nn.Module = MoE(config.hidden_size, config.moe, config.tp_size)
        else:
            self.mlp = MLP(config.hidden_size, shard_size(config.intermediate_size, config.tp_size, "intermediate_size"))


class DeepseekBody(nn.Module):
    def __init__(self, config: DeepseekConfig, parallel: ParallelGroups | None) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, parallel)
        self.layers = nn.ModuleList(DecoderLayer(config, i, parallel) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekForCausalLM(nn.Module):
    """Embeddings, decoder layers (MLA attention + MLP/MoE), final norm and LM head.

    With `parallel` (`mlakit.distributed.init_parallel`), this process is one TP rank: `config`
    must be made with `tp_size=parallel.tp_size`, and the module holds its rank's slices
    (`mlakit.distributed.tensor_parallel`): per layer one all-reduce after `o_proj` and one after
    the MLP / MoE block, plus one for the vocabulary-parallel embedding and an all-gather of the
    logits.
    """

    def __init__(self, config: DeepseekConfig, parallel: ParallelGroups | None = None) -> None:
        super().__init__()
        tp_size = 1 if parallel is None else parallel.tp_size
        if config.tp_size != tp_size:
            raise ConfigError(
                f"DeepseekConfig was made for tp_size={config.tp_size}, the process groups have tp_size={tp_size}; "
                f"make it with DeepseekConfig.from_hf_config(hf_config, tp_size={tp_size})"
            )
        self.config = config
        self.parallel = parallel
        self.model = DeepseekBody(config, parallel)
        vocab_rows = shard_size(config.vocab_size, tp_size, "vocab_size")
        self.lm_head = nn.Linear(config.hidden_size, vocab_rows, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        step: AttentionStep | DCPStep,
        cache: PagedLatentCache,
        *,
        decode_backend: str = "auto",
        prefill_backend: str = "auto",
        check_inputs: bool = True,
    ) -> torch.Tensor:
        """Logits `[batch, vocab]` (float32) of each sequence's last new token.

        `input_ids` and `positions` are `[T]`, the step's new tokens packed in sequence
        order; layer i writes and reads `cache.layer(i)`. Under decode context parallelism the
        step is this rank's `DCPStep` (`mlakit.model.steps.reserve_step` makes either). Every sequence of an
        `AttentionStep` must add a token (an idle one has no last token to take logits of: MLAInputError).
        `check_inputs`: each layer's (`MLAAttention.forward`).
        """
        if isinstance(step, AttentionStep) and 0 in step.new_tokens:
            raise MLAInputError(f"step: expected every sequence to add a token (logits are taken at each sequence's "
                                f"last new token), got new_tokens {list(step.new_tokens)}")
        tokens = step.num_tokens
        for name, tensor in (("input_ids", input_ids), ("positions", positions)):
            if (not isinstance(tensor, torch.Tensor) or tensor.shape != (tokens,) or tensor.dtype.is_floating_point
                    or tensor.dtype == torch.bool):
                raise MLAInputError(f"{name}: expected an integer tensor [{tokens}] (the step's new tokens), got "
                                    f"{getattr(tensor, 'dtype', type(tensor).__name__)} "
                                    f"{list(getattr(tensor, 'shape', []))}")
        hidden = self.model.embed_tokens(input_ids)
        for index, layer in enumerate(self.model.layers):
            attn = layer.self_attn(
                layer.input_layernorm(hidden), positions, step, cache.layer(index),
                decode_backend=decode_backend, prefill_backend=prefill_backend, check_inputs=check_inputs,
            )
            hidden = hidden + all_reduce(attn, self.parallel)
            hidden = hidden + all_reduce(layer.mlp(layer.post_attention_layernorm(hidden)), self.parallel)
        if isinstance(step, DCPStep):
            last = step.cu_seqlens_q[1:].long() - 1
        else:
            last = upload_ints(list(itertools.accumulate(step.new_tokens, initial=-1))[1:], hidden.device, torch.int64)
        return gather_last_axis(self.lm_head(self.model.norm(hidden[last])), self.parallel).float()
