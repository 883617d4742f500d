"""Loads a DeepSeek-architecture checkpoint (config.json + safetensors shards) from a local directory.

Every tensor the model needs must be present with the right shape and a floating dtype; a
missing, mis-shaped, non-floating or unexpected tensor fails the load with a message naming it
and its file, before the tensor is read. Under tensor parallelism each rank
reads only its slice of each split tensor (safetensors `get_slice`, the slices of
`mlakit.distributed.tensor_parallel`), never the whole tensor.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import torch

from mlakit.distributed.groups import ParallelGroups
from mlakit.distributed.tensor_parallel import held_by, shard_slice, split_axis
from mlakit.config.hf import HFConfig
from mlakit.errors import ConfigError
from mlakit.model.deepseek import DeepseekConfig, DeepseekForCausalLM

_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")
# Weight dtypes the model loads by casting to the requested dtype (safetensors' names). Quantized
# or integer tensors are refused: no quantized checkpoint format is supported today.
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def load_model(
    directory: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    parallel: ParallelGroups | None = None,
) -> DeepseekForCausalLM:
    """A `DeepseekForCausalLM` with the checkpoint's weights, in `dtype` on `device`; with
    `parallel`, this TP rank's slices of them (each checked against the full tensor's shape).

    config.json is read by the shared reader (`mlakit.config.hf.HFConfig`). Each tensor's name,
    dtype (floating only, `FLOAT_DTYPES`) and shape are checked before it is read; the
    `num_nextn_predict_layers` multi-token-prediction layers past `num_hidden_layers` are
    skipped, and any other layer past it is refused (a config with too few layers).
    """
    directory = Path(directory)
    rank, tp_size = (0, 1) if parallel is None else (parallel.rank, parallel.tp_size)
    hf = HFConfig.load(directory / "config.json")
    try:
        config = DeepseekConfig.from_hf_config(hf, tp_size)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if hf.source in message else f"{hf.source}: {message}") from exc
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise ConfigError(f"{directory}: no *.safetensors files; expected the checkpoint's weights next to config.json")
    with torch.device("meta"):
        model = DeepseekForCausalLM(config, parallel)
    expected = {name: _full_shape(name, tensor.shape, tp_size) for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    loaded: dict[str, torch.Tensor] = {}
    for shard in shards:
        for name, tensor in _shard_tensors(shard, expected, config, rank, tp_size):
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
    shard: Path, expected: dict[str, tuple[int, ...]], config: DeepseekConfig, rank: int, tp_size: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's slice of each tensor in `shard`, one at a time, each checked by `_wanted` before
    it is read; a file safetensors cannot read (truncated, corrupt header) raises ConfigError naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                reader = handle.get_slice(name)
                shape = tuple(reader.get_shape())
                if not held_by(name, rank) or not _wanted(name, shape, reader.get_dtype(), shard, expected, config):
                    continue
                if split_axis(name) is None or tp_size == 1:
                    yield name, handle.get_tensor(name)
                else:
                    yield name, reader[shard_slice(name, shape, rank, tp_size)]
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"{shard} is not a readable safetensors file (truncated or corrupt?): {exc}") from exc


def _wanted(name: str, shape: tuple[int, ...], dtype: str, shard: Path, expected: dict[str, tuple[int, ...]], config: DeepseekConfig) -> bool:
    """False for a declared multi-token-prediction layer's tensor (skipped); True for a tensor
    the model needs with a floating dtype and its full shape; ConfigError for anything else."""
    where = f"tensor {name} in {shard}"
    match = _LAYER_INDEX.match(name)
    if match is not None and int(match.group(1)) >= config.num_layers:
        layer, last = int(match.group(1)), config.num_layers + config.mtp_layers
        if layer < last:
            return False
        raise ConfigError(
            f"{where}: layer {layer} is past the config's num_hidden_layers ({config.num_layers}) + "
            f"num_nextn_predict_layers ({config.mtp_layers}); expected layers < {last} (does config.json declare too few layers?)"
        )
    if name.endswith("weight_scale_inv"):
        raise ConfigError(f"{where}: block-quantized fp8 weights are not supported; dequantize the checkpoint to bf16 first")
    if name not in expected:
        raise ConfigError(f"{where}: unexpected, not part of a {config.num_layers}-layer DeepSeek model")
    if dtype not in FLOAT_DTYPES:
        raise ConfigError(f"{where}: dtype {dtype}, expected a floating dtype in {list(FLOAT_DTYPES)} (quantized weights are not supported)")
    if shape != tuple(expected[name]):
        raise ConfigError(f"{where}: shape {shape}, expected {tuple(expected[name])}")
    return True
