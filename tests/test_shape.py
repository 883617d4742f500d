"""Model shapes: presets, Hugging Face configs, YaRN softmax scale, tensor-parallel split."""

import json
import math

import pytest

from mlakit import ConfigError, MLAShape
from mlakit.shape import PRESETS, yarn_mscale


def test_presets_match_the_published_models():
    v3 = MLAShape.preset("DeepSeek-V3")
    assert (v3.num_heads, v3.q_lora_rank, v3.kv_lora_rank, v3.qk_nope_head_dim, v3.qk_rope_head_dim, v3.v_head_dim) == (128, 1536, 512, 128, 64, 128)
    assert MLAShape.preset("deepseek-r1") == v3
    lite = MLAShape.preset("deepseek-v2-lite")
    assert lite.num_heads == 16 and lite.q_lora_rank is None
    assert MLAShape.preset("kimi-k2").num_heads == 64
    mini = MLAShape.preset("minicpm3")
    assert (mini.num_heads, mini.kv_lora_rank, mini.qk_rope_head_dim, mini.kv_cache_dim) == (40, 256, 32, 288)
    with pytest.raises(ConfigError, match=r"unknown model preset 'llama'; known presets: \["):
        MLAShape.preset("llama")


def test_softmax_scale_with_and_without_yarn():
    plain = MLAShape(16, 512, 128, 64, 128)
    assert plain.softmax_scale == pytest.approx(192**-0.5)
    v3 = MLAShape.preset("deepseek-v3")
    mscale = 0.1 * 1.0 * math.log(40.0) + 1.0
    assert v3.softmax_scale == pytest.approx(192**-0.5 * mscale**2)
    assert yarn_mscale(1.0, 1.0) == 1.0


def test_from_hf_config_dict_file_and_directory(tmp_path):
    config = {
        "num_attention_heads": 20,
        "kv_lora_rank": 256,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "q_lora_rank": None,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale_all_dim": 0.5},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_dict = MLAShape.from_hf_config(config)
    assert from_dict == MLAShape.from_hf_config(tmp_path) == MLAShape.from_hf_config(tmp_path / "config.json")
    assert from_dict.num_heads == 20 and from_dict.q_lora_rank is None
    assert from_dict.softmax_scale == pytest.approx(96**-0.5 * (0.1 * 0.5 * math.log(4.0) + 1) ** 2)
    rope_parameters = dict(config, rope_scaling=None, rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": 0.5})
    assert MLAShape.from_hf_config(rope_parameters) == from_dict


def test_from_hf_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"missing \['kv_lora_rank'"):
        MLAShape.from_hf_config({"num_attention_heads": 8, "qk_nope_head_dim": 1, "qk_rope_head_dim": 1, "v_head_dim": 1})
    with pytest.raises(ConfigError, match="does not exist"):
        MLAShape.from_hf_config(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(ConfigError, match="not valid JSON"):
        MLAShape.from_hf_config(tmp_path)


def test_tensor_parallel_split():
    v3 = PRESETS["deepseek-v3"]
    assert v3.for_tp(8).num_heads == 16
    assert MLAShape(20, 512, 128, 64, 128).for_tp(4).num_heads == 5
    with pytest.raises(ConfigError, match=r"tp_size=3 does not divide num_heads=128; use one of \[1, 2, 4, 8, 16, 32, 64, 128\]"):
        v3.for_tp(3)


@pytest.mark.parametrize("field, value", [("num_heads", 0), ("kv_lora_rank", -1), ("v_head_dim", 1.5), ("q_lora_rank", 0)])
def test_invalid_shapes_are_refused(field, value):
    kwargs = dict(num_heads=4, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    kwargs[field] = value
    with pytest.raises(ConfigError, match=field):
        MLAShape(**kwargs)
