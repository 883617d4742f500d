"""Loads a DeepSeek-architecture checkpoint (config.json + safetensors shards) from a local directory.

Every tensor the model needs must be present with the right shape; a missing, mis-shaped or
unexpected tensor fails the load with a message naming it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from mlakit.errors import ConfigError
from mlakit.model.deepseek import DeepseekConfig, DeepseekForCausalLM

_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


def read_config(directory: str | Path) -> dict:
    """The checkpoint's config.json as a dict."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; a checkpoint directory holds config.json and *.safetensors")
    return json.loads(path.read_text())


def load_model(directory: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> DeepseekForCausalLM:
    """A `DeepseekForCausalLM` with the checkpoint's weights, in `dtype` on `device`.

    Multi-token-prediction layers past `num_hidden_layers` are skipped.
    """
    from safetensors import safe_open

    directory = Path(directory)
    config = DeepseekConfig.from_hf_config(read_config(directory))
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise ConfigError(f"no *.safetensors files in {directory}")
    with torch.device("meta"):
        model = DeepseekForCausalLM(config)
    expected = {name: tensor.shape for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    loaded: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                if _is_extra_layer(name, config.num_layers):
                    continue
                if name.endswith("weight_scale_inv"):
                    raise ConfigError(f"tensor {name} in {shard.name}: block-quantized fp8 weights are not supported; dequantize the checkpoint to bf16 first")
                if name not in expected:
                    raise ConfigError(f"unexpected tensor {name} in {shard.name}: not part of a {config.num_layers}-layer DeepSeek model")
                tensor = handle.get_tensor(name)
                if tuple(tensor.shape) != tuple(expected[name]):
                    raise ConfigError(
                        f"tensor {name} in {shard.name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name])}"
                    )
                loaded[name] = tensor.to(dtype=dtype, device=device)
    missing = sorted(set(expected) - set(loaded))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ConfigError(f"checkpoint {directory} lacks tensor {', '.join(missing[:5])}{more}")
    model.load_state_dict(loaded, strict=not config.tie_word_embeddings, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for layer in model.model.layers:
        layer.self_attn.rotary.to_empty(device=device)
        layer.self_attn.rotary.inv_freq.copy_(layer.self_attn.config.rope.inverse_frequencies())
    return model.eval()


def _is_extra_layer(name: str, num_layers: int) -> bool:
    match = _LAYER_INDEX.match(name)
    return match is not None and int(match.group(1)) >= num_layers
