"""The one Hugging Face config reader (mlakit.config.hf): `mlakit check` (MLAShape.from_hf_config) and
the loader (DeepseekConfig.from_hf_config) accept and refuse the same configs, with the same message."""

from __future__ import annotations

import json
import math
import time

import pytest

from fuzz_strategies import TINY_DEEPSEEK
from mlakit.config.hf import HFConfig
from mlakit.errors import ConfigError, divisors
from mlakit.model.deepseek import DeepseekConfig
from mlakit.shape import MLAShape

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0}


def _both(config: dict) -> tuple[str | None, str | None]:
    """The refusal (or None) of each reader."""
    outcomes = []
    for read in (MLAShape.from_hf_config, DeepseekConfig.from_hf_config):
        try:
            read(config)
            outcomes.append(None)
        except ConfigError as exc:
            outcomes.append(str(exc))
    return outcomes[0], outcomes[1]


@pytest.mark.parametrize(
    "rope, refusal",
    [
        (YARN | {"factor": float("nan")}, "rope_scaling.factor: expected a finite number > 0, got nan"),
        (YARN | {"mscale_all_dim": float("inf")}, "rope_scaling.mscale_all_dim: expected a finite number > 0, got inf"),
        ({k: v for k, v in YARN.items() if k != "factor"}, "rope_scaling.factor: expected a finite number > 0 (a required key), got nothing"),
        (YARN | {"mscale": -1.0}, "rope_scaling.mscale: expected a finite number > 0, got -1.0"),
        (YARN | {"beta_fast": "32"}, "rope_scaling.beta_fast: expected a finite number > 0, got '32'"),
        (YARN | {"rope_theta": 1.0}, "rope_scaling.rope_theta: expected a finite number > 1, got 1.0"),
        ("yarn", "rope_scaling: expected an object or null, got 'yarn'"),
    ],
)
def test_both_readers_refuse_a_bad_yarn_block_with_one_message(rope, refusal):
    """Issue 27: NaN factor planned softmax_scale nan; a block without factor was 1.0 for check, a KeyError for generate."""
    check, loader = _both(TINY_DEEPSEEK | {"rope_scaling": rope})
    assert check == loader == f"config: {refusal}"


def test_both_readers_take_a_good_yarn_block_to_the_same_softmax_scale():
    config = TINY_DEEPSEEK | {"rope_scaling": YARN}
    shape = MLAShape.from_hf_config(config)
    assert DeepseekConfig.from_hf_config(config).attention.shape == shape
    assert shape.softmax_scale == pytest.approx(16**-0.5 * (0.1 * math.log(4.0) + 1) ** 2)


@pytest.mark.parametrize(
    "edit, refusal",
    [
        ({"num_experts_per_tok": 5}, "num_experts_per_tok: expected an integer <= n_routed_experts (4), got 5"),
        ({"n_group": 3}, "n_group: expected a divisor of n_routed_experts (4), got 3"),
        ({"topk_group": 3}, "topk_group: expected an integer <= n_group (2), got 3"),
        ({"n_group": 4, "topk_group": 1}, "n_group: expected at most n_routed_experts / 2 = 2 groups"),
        ({"num_experts_per_tok": 3}, "num_experts_per_tok: expected <= topk_group * experts per group = 2, got 3"),
        ({"first_k_dense_replace": 3}, "first_k_dense_replace: expected an integer <= num_hidden_layers (2), got 3"),
        ({"eos_token_id": 64}, "eos_token_id: expected a token id in [0, 64) (vocab_size), a list of them or null, got 64"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: expected true or false, got 'yes'"),
        ({"qk_rope_head_dim": 7}, "qk_rope_head_dim: expected an even number (rope rotates pairs of values), got 7"),
        ({"hidden_act": "gelu"}, "hidden_act: expected one of ['silu'], got 'gelu'"),
        ({"num_nextn_predict_layers": -1}, "num_nextn_predict_layers: expected an integer >= 0, got -1"),
    ],
)
def test_the_loader_refuses_inconsistent_fields_naming_them(edit, refusal):
    with pytest.raises(ConfigError) as error:
        DeepseekConfig.from_hf_config(TINY_DEEPSEEK | edit)
    assert str(error.value).startswith("config: " + refusal), str(error.value)


def test_heads_that_tp_does_not_split_are_refused_at_once(tmp_path):
    """Issue 27: a billion heads and --tp-size 7 took 66 s listing the divisors one by one."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_DEEPSEEK | {"num_attention_heads": 10**9}))
    began = time.perf_counter()
    with pytest.raises(ConfigError, match=r"tp_size=7 does not divide num_heads=1000000000; use one of \[1, 2, 4, 5,"):
        MLAShape.from_hf_config(path).for_tp(7)
    assert time.perf_counter() - began < 1.0
    assert divisors(10**9)[:4] == [1, 2, 4, 5] and len(divisors(10**9)) == 100 and divisors(1) == [1]


def test_errors_name_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_DEEPSEEK | {"vocab_size": 0}))
    with pytest.raises(ConfigError, match=rf"^{path}: vocab_size: expected an integer >= 1, got 0$"):
        DeepseekConfig.from_hf_config(HFConfig.load(tmp_path))
