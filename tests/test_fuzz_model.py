"""Fuzz of checkpoint loading (load_model, read_config, DeepseekConfig.from_hf_config): a config.json
with a key missing or of the wrong type, or a truncated / corrupt safetensors file, fails with a
ConfigError naming the key and the file; a harmless extra key loads the same weights."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_outcomes import FUZZ, probe
from fuzz_strategies import save_tiny_deepseek
from mlakit.errors import ConfigError
from mlakit.model.loader import load_model

REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                 "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts_per_tok",
                 "moe_intermediate_size")
OPTIONAL_INT_KEYS = ("first_k_dense_replace", "n_shared_experts", "n_group", "topk_group", "n_routed_experts")
OPTIONAL_NUMBER_KEYS = ("rms_norm_eps", "routed_scaling_factor", "rope_theta")
WRONG_TYPES = st.sampled_from(["x", 2.5, True, [1], {"a": 1}, -3])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    directory = save_tiny_deepseek(tmp_path_factory.mktemp("tiny"))
    return directory, load_model(directory).state_dict()


def _variant(source: Path, target: Path, config: dict | None = None, shard: bytes | None = None) -> Path:
    """A copy of the checkpoint in `target` with its config.json or its shard replaced."""
    (target / "config.json").write_text(json.dumps(config) if config is not None else (source / "config.json").read_text())
    if shard is None:
        shutil.copy(source / "model.safetensors", target / "model.safetensors")
    else:
        (target / "model.safetensors").write_bytes(shard)
    return target


@st.composite
def _config_edits(draw: st.DrawFn) -> tuple[str, object]:
    """(key, new value); `...` deletes the key."""
    kind = draw(st.sampled_from(["required", "int", "number"]))
    if kind == "required":
        return draw(st.sampled_from(REQUIRED_KEYS)), draw(st.just(...) | st.none() | WRONG_TYPES | st.just(0))
    if kind == "int":
        return draw(st.sampled_from(OPTIONAL_INT_KEYS)), draw(WRONG_TYPES.filter(lambda v: v != 2 and v is not True) | st.just(-1))
    return draw(st.sampled_from(OPTIONAL_NUMBER_KEYS)), draw(st.sampled_from(["x", True, [1.0], -1.0, 0.0, float("nan")]))


@settings(FUZZ, max_examples=40)
@given(edit=_config_edits())
def test_fuzz_config_json_names_the_key_and_the_file(checkpoint, edit):
    source, _ = checkpoint
    key, value = edit
    config = json.loads((source / "config.json").read_text())
    if value is ...:
        del config[key]
    else:
        config[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        directory = _variant(source, Path(tmp), config=config)
        error = probe("load_model (config.json)", (key,), lambda: load_model(directory))
    assert str(Path(tmp) / "config.json") in str(error)


def test_fuzz_config_json_extra_key_loads_the_same_weights(checkpoint):
    source, weights = checkpoint
    config = json.loads((source / "config.json").read_text()) | {"some_new_field": [1, 2]}
    with tempfile.TemporaryDirectory() as tmp:
        directory = _variant(source, Path(tmp), config=config)
        probe("load_model (config.json)", None, lambda: load_model(directory),
              lambda model: all(torch.equal(model.state_dict()[k], weights[k]) for k in weights) or pytest.fail("weights differ"))


@settings(FUZZ, max_examples=30)
@given(cut=st.floats(0, 1, exclude_max=True), header=st.binary(min_size=0, max_size=8), truncate=st.booleans())
def test_fuzz_truncated_or_corrupt_safetensors_names_the_file(checkpoint, cut, header, truncate):
    source, _ = checkpoint
    data = (source / "model.safetensors").read_bytes()
    header = header.ljust(8, b"\xff")  # the header's length field, garbled
    shard = data[: int(cut * len(data))] if truncate else header + data[8:]
    with tempfile.TemporaryDirectory() as tmp:
        directory = _variant(source, Path(tmp), shard=shard)
        error = probe("load_model (safetensors)", ("model.safetensors",), lambda: load_model(directory))
    assert str(Path(tmp) / "model.safetensors") in str(error)


@settings(FUZZ, max_examples=10)
@given(content=st.sampled_from(["", "{", "[1, 2]", "null", "\x00\xff", '{"vocab_size": 64'])
       | st.text(max_size=20).filter(lambda t: not t.strip().startswith("{")))
def test_fuzz_unreadable_config_json_names_the_file(checkpoint, content):
    source, _ = checkpoint
    with tempfile.TemporaryDirectory() as tmp:
        directory = _variant(source, Path(tmp))
        (directory / "config.json").write_text(content)
        error = probe("load_model (config.json)", ("config.json",), lambda: load_model(directory))
    assert str(Path(tmp) / "config.json") in str(error)


def test_regression_config_json_missing_key_and_truncated_shard(checkpoint, tmp_path):
    """Before: KeyError 'vocab_size' and safetensors' SafetensorError, neither naming the file."""
    source, _ = checkpoint
    config = json.loads((source / "config.json").read_text())
    del config["vocab_size"]
    with pytest.raises(ConfigError, match=r"config\.json: config is missing the required key 'vocab_size'"):
        load_model(_variant(source, tmp_path, config=config))
    truncated = (source / "model.safetensors").read_bytes()[:-10]
    with pytest.raises(ConfigError, match=r"model\.safetensors is not a readable safetensors file"):
        load_model(_variant(source, tmp_path, shard=truncated))
