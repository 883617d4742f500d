"""Fuzz of checkpoint loading (load_model, the config reader mlakit.config.hf, DeepseekConfig.from_hf_config):
a config.json with a key missing or of the wrong type, a bad rope block or fields inconsistent with
each other, a truncated / corrupt safetensors file, or a tensor of the wrong dtype, shape, name or
layer fails with a ConfigError naming the key or tensor and the file, and `mlakit check`'s reader
refuses what the loader's refuses with the same message; a harmless extra key, or a declared
multi-token-prediction layer, loads the same weights."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from safetensors.torch import load_file, save_file

from fuzz_outcomes import FUZZ, probe
from fuzz_strategies import NOT_A_POSITIVE_NUMBER, TINY_DEEPSEEK, save_tiny_deepseek
from mlakit.errors import ConfigError
from mlakit.model.deepseek import DeepseekConfig
from mlakit.model.loader import load_model
from mlakit.shape import MLAShape

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
    with pytest.raises(ConfigError, match=r"config\.json: vocab_size: expected an integer >= 1 \(a required key\), got nothing"):
        load_model(_variant(source, tmp_path, config=config))
    truncated = (source / "model.safetensors").read_bytes()[:-10]
    with pytest.raises(ConfigError, match=r"model\.safetensors is not a readable safetensors file"):
        load_model(_variant(source, tmp_path, shard=truncated))


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0,
        "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}
# (key, bad values) of fields that must agree with others: each value breaks the tiny config's consistency.
INCONSISTENT = [
    ("num_experts_per_tok", st.integers(5, 10**6)), ("n_group", st.sampled_from([3, 4, 8])), ("topk_group", st.integers(3, 99)),
    ("first_k_dense_replace", st.integers(3, 99)), ("eos_token_id", st.integers(64, 10**9) | st.just([1, 64])),
    ("qk_rope_head_dim", st.sampled_from([1, 3, 7, 9])), ("tie_word_embeddings", st.sampled_from(["yes", 1, 0])),
    ("num_nextn_predict_layers", st.sampled_from([-1, 1.5, "1"])), ("hidden_act", st.sampled_from(["gelu", "", 3])),
]


@settings(FUZZ, max_examples=40)
@given(key=st.sampled_from(sorted(set(YARN) - {"rope_type"})), value=NOT_A_POSITIVE_NUMBER | st.just(...))
def test_fuzz_yarn_block_check_and_loader_refuse_alike(key, value):
    """A YaRN parameter missing, NaN, inf, <= 0 or not a number: `mlakit check`'s reader and the
    loader's refuse it with one and the same message naming rope_scaling.<key>."""
    rope = {k: v for k, v in YARN.items() if k != key} | ({} if value is ... else {key: value})
    config = TINY_DEEPSEEK | {"rope_scaling": rope}
    # Only `factor` is required; absent, the others take their defaults (original_max_position_embeddings: max_position_embeddings).
    names = None if value is ... and key != "factor" else (f"rope_scaling.{key}",)
    check = probe("config reader (check)", names, lambda: MLAShape.from_hf_config(config), lambda shape: None)
    loader = probe("config reader (loader)", names, lambda: DeepseekConfig.from_hf_config(config), lambda model: None)
    assert str(check) == str(loader)


@settings(FUZZ, max_examples=30)
@given(data=st.data(), field=st.sampled_from(INCONSISTENT))
def test_fuzz_inconsistent_fields_are_refused_naming_them(data, field):
    key, values = field
    config = TINY_DEEPSEEK | {key: data.draw(values)}
    probe("config reader (loader)", (key,), lambda: DeepseekConfig.from_hf_config(config))


@st.composite
def _tensor_edits(draw: st.DrawFn, names: list[str]) -> tuple[str, str, object]:
    """(tensor name, edit kind, argument) of one tensor of the tiny checkpoint."""
    name = draw(st.sampled_from(names))
    kind = draw(st.sampled_from(["dtype", "shape", "rename", "extra layer", "declared mtp layer"]))
    if kind == "dtype":
        return name, kind, draw(st.sampled_from([torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn]))
    if kind == "shape":
        return name, kind, draw(st.integers(-1, 1).filter(bool))
    return name, kind, draw(st.integers(2, 5))


@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_fuzz_tensor_name_dtype_shape_and_layer_are_checked_before_loading(checkpoint, data):
    """A tensor of a non-floating dtype, a wrong shape, an unknown name, or a layer past
    num_hidden_layers that is not a declared MTP layer fails naming the tensor; a declared MTP
    layer is skipped and the weights load unchanged."""
    source, weights = checkpoint
    tensors = load_file(str(source / "model.safetensors"))
    name, kind, arg = data.draw(_tensor_edits(sorted(tensors)))
    config = json.loads((source / "config.json").read_text())
    blamed: tuple[str, ...] | None = (name,)
    if kind == "dtype":
        tensors[name] = tensors[name].to(arg)
    elif kind == "shape":
        tensors[name] = torch.zeros(*tensors[name].shape[:-1], tensors[name].shape[-1] + arg)
    elif kind == "rename":
        tensors[name + "_extra"] = tensors.pop(name)
        blamed = (name + "_extra", name)
    else:
        layer_name = f"model.layers.{arg}.eh_proj.weight"
        tensors[layer_name] = torch.zeros(2, 2)
        blamed = (layer_name,)
        if kind == "declared mtp layer":
            config["num_nextn_predict_layers"] = arg - 1
            blamed = None
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "config.json").write_text(json.dumps(config))
        save_file(tensors, str(directory / "model.safetensors"))
        probe("load_model (tensors)", blamed, lambda: load_model(directory),
              lambda model: all(torch.equal(model.state_dict()[k], weights[k]) for k in weights) or pytest.fail("weights differ"))
