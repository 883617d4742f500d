"""Loads a DeepSeek-architecture checkpoint (config.json + safetensors shards) from a local directory.

Every tensor the model needs must be present with the right shape; a missing, mis-shaped or
unexpected tensor fails the load with a message naming it. Under tensor parallelism each rank
reads only its slice of each split tensor (safetensors `get_slice`, the slices of
`mlakit.distributed.tensor_parallel`), never the whole tensor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from mlakit.distributed.groups import ParallelGroups
from mlakit.distributed.tensor_parallel import held_by, shard_slice, split_axis
from mlakit.errors import ConfigError
from mlakit.model.deepseek import DeepseekConfig, DeepseekForCausalLM

_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


def read_config(directory: str | Path) -> dict:
    """The checkpoint's config.json as a dict."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; a checkpoint directory holds config.json and *.safetensors")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def load_model(
    directory: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    parallel: ParallelGroups | None = None,
) -> DeepseekForCausalLM:
    """A `DeepseekForCausalLM` with the checkpoint's weights, in `dtype` on `device`; with
    `parallel`, this TP rank's slices of them (each checked against the full tensor's shape).

    Multi-token-prediction layers past `num_hidden_layers` are skipped.
    """
    directory = Path(directory)
    rank, tp_size = (0, 1) if parallel is None else (parallel.rank, parallel.tp_size)
    try:
        config = DeepseekConfig.from_hf_config(read_config(directory), tp_size)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if str(directory) in message else f"{directory / 'config.json'}: {message}") from exc
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise ConfigError(f"no *.safetensors files in {directory}")
    with torch.device("meta"):
        model = DeepseekForCausalLM(config, parallel)
    expected = {name: _full_shape(name, tensor.shape, tp_size) for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    loaded: dict[str, torch.Tensor] = {}
    for shard in shards:
        for name, full_shape, tensor in _shard_tensors(shard, config.num_layers, rank, tp_size):
            if name.endswith("weight_scale_inv"):
                raise ConfigError(f"tensor {name} in {shard.name}: block-quantized fp8 weights are not supported; dequantize the checkpoint to bf16 first")
            if tensor is None:  # held by another rank (a row-parallel bias)
                continue
            if name not in expected:
                raise ConfigError(f"unexpected tensor {name} in {shard.name}: not part of a {config.num_layers}-layer DeepSeek model")
            if full_shape != tuple(expected[name]):
                raise ConfigError(f"tensor {name} in {shard.name} has shape {full_shape}, expected {tuple(expected[name])}")
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


def _full_shape(name: str, local_shape: torch.Size, tp_size: int) -> tuple[int, ...]:
    """The checkpoint shape of a tensor whose rank slice has `local_shape`."""
    axis = split_axis(name)
    shape = list(local_shape)
    if axis is not None:
        shape[axis] *= tp_size
    return tuple(shape)


def _shard_tensors(
    shard: Path, num_layers: int, rank: int, tp_size: int
) -> Iterator[tuple[str, tuple[int, ...], torch.Tensor | None]]:
    """The shard's tensors one at a time as (name, full shape, this rank's slice), the slice None
    for a tensor another rank holds; layers past `num_layers` (multi-token prediction) left out;
    a file safetensors cannot read (truncated, corrupt header) raises ConfigError naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                if _is_extra_layer(name, num_layers):
                    continue
                reader = handle.get_slice(name)
                shape = tuple(reader.get_shape())
                axis = split_axis(name)
                if not held_by(name, rank):
                    yield name, shape, None
                elif axis is None or tp_size == 1 or len(shape) <= axis or shape[axis] % tp_size:
                    yield name, shape, handle.get_tensor(name)  # a shape that does not split fails the shape check
                else:
                    yield name, shape, reader[shard_slice(name, shape, rank, tp_size)]
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"{shard} is not a readable safetensors file (truncated or corrupt?): {exc}") from exc


def _is_extra_layer(name: str, num_layers: int) -> bool:
    match = _LAYER_INDEX.match(name)
    return match is not None and int(match.group(1)) >= num_layers
