"""Tensor-parallel sharding rules, the loader's per-rank slices and start-up errors, in one
process (no collective runs: ranks are described, not started), plus `mlakit generate` under
torchrun with two CPU processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import safetensors
import torch
from click.testing import CliRunner

from mlakit import ConfigError
from mlakit.cli import main
from mlakit.demo.checkpoint import demo_hf_config, ensure_demo_checkpoint
from mlakit.distributed import ParallelGroups, TokenSharding
from mlakit.distributed.tensor_parallel import shard_slice, split_axis
from mlakit.model.deepseek import DeepseekConfig, DeepseekForCausalLM
from mlakit.model.loader import load_model


def _rank(rank: int, tp_size: int) -> ParallelGroups:
    """A rank's place without process groups: enough to build and load its slices."""
    return ParallelGroups(rank=rank, tp_size=tp_size, dcp_size=1, sharding=TokenSharding(1), tp_group=None, dcp_group=None)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory):
    return ensure_demo_checkpoint(tmp_path_factory.mktemp("demo") / "model")


@pytest.mark.parametrize(("name", "axis"), [
    ("model.layers.0.self_attn.q_b_proj.weight", 0),
    ("model.layers.0.self_attn.q_proj.weight", 0),
    ("model.layers.0.self_attn.kv_b_proj.weight", 0),
    ("model.layers.0.self_attn.o_proj.weight", 1),
    ("model.layers.0.self_attn.q_a_proj.weight", None),
    ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", None),
    ("model.layers.0.self_attn.kv_a_layernorm.weight", None),
    ("model.layers.0.mlp.gate_proj.weight", 0),
    ("model.layers.1.mlp.experts.5.up_proj.weight", 0),
    ("model.layers.1.mlp.shared_experts.down_proj.weight", 1),
    ("model.layers.1.mlp.gate.weight", None),
    ("model.layers.1.mlp.gate.e_score_correction_bias", None),
    ("model.embed_tokens.weight", 0),
    ("lm_head.weight", 0),
    ("model.norm.weight", None),
])
def test_split_axis_of_every_kind_of_tensor(name: str, axis: int | None) -> None:
    assert split_axis(name) == axis


@pytest.mark.parametrize("tp_size", [2, 4])
def test_loader_reads_only_each_ranks_slices_and_they_tile_the_checkpoint(demo_dir, monkeypatch, tp_size: int) -> None:
    full = load_model(demo_dir).state_dict()
    whole_reads: list[str] = []
    real_open = safetensors.safe_open

    class RecordingHandle:
        def __init__(self, *args, **kwargs) -> None:
            self.inner = real_open(*args, **kwargs)

        def __enter__(self):
            self.handle = self.inner.__enter__()
            return self

        def __exit__(self, *exc) -> None:
            self.inner.__exit__(*exc)

        def keys(self):
            return self.handle.keys()

        def get_slice(self, name):
            return self.handle.get_slice(name)

        def get_tensor(self, name):
            whole_reads.append(name)
            return self.handle.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", RecordingHandle)
    ranks = [load_model(demo_dir, parallel=_rank(r, tp_size)).state_dict() for r in range(tp_size)]
    assert whole_reads and all(split_axis(name) is None for name in whole_reads)
    for name, tensor in full.items():
        axis = split_axis(name)
        if axis is None:
            assert all(torch.equal(r[name], tensor) for r in ranks), name
        else:
            assert torch.equal(torch.cat([r[name] for r in ranks], dim=axis), tensor), name
            assert torch.equal(ranks[1][name], tensor[shard_slice(name, tuple(tensor.shape), 1, tp_size)]), name


def test_heads_not_divisible_by_tp_size_fail_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"tp_size=3 does not divide num_heads=16; use one of \[1, 2, 4, 8, 16\]"):
        DeepseekConfig.from_hf_config(demo_hf_config(), tp_size=3)


@pytest.mark.parametrize(("field", "value", "what"), [
    ("intermediate_size", 100, "intermediate_size=100"),
    ("moe_intermediate_size", 36, "moe_intermediate_size=36"),
    ("vocab_size", 500, "vocab_size=500"),
])
def test_mlp_and_vocab_sizes_not_divisible_by_tp_size_fail_naming_the_setting(field: str, value: int, what: str) -> None:
    config = DeepseekConfig.from_hf_config(demo_hf_config() | {field: value}, tp_size=8)
    with pytest.raises(ConfigError, match=f"tp_size=8 does not divide {what}"), torch.device("meta"):
        DeepseekForCausalLM(config, _rank(0, 8))


def test_model_config_must_be_made_for_the_groups_tp_size() -> None:
    with pytest.raises(ConfigError, match=r"made for tp_size=1, the process groups have tp_size=2.*tp_size=2\)"), torch.device("meta"):
        DeepseekForCausalLM(DeepseekConfig.from_hf_config(demo_hf_config()), _rank(0, 2))


def test_o_proj_bias_is_added_by_rank_zero_only() -> None:
    config = DeepseekConfig.from_hf_config(demo_hf_config() | {"attention_bias": True}, tp_size=2)
    with torch.device("meta"):
        biases = [DeepseekForCausalLM(config, _rank(r, 2)).model.layers[0].self_attn.o_proj.bias for r in range(2)]
    assert biases[0] is not None and biases[1] is None


@pytest.mark.parametrize(("args", "message"), [
    (["--tp-size", "2"], "tp_size=2 runs one process per rank: start them with torchrun --nproc-per-node 2"),
    (["--tp-size", "2", "--dcp-size", "3"], "dcp_size=3 does not divide tp_size=2"),
])
def test_generate_cli_refuses_bad_parallel_settings(demo_dir, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["generate", "--model", str(demo_dir), "--prompt-ids", "1,2", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_generate_cli_under_torchrun_prints_one_process_tokens_once(demo_dir) -> None:
    command = ["--model", str(demo_dir), "--prompt-ids", "11,402,7,99,250", "--prompt-ids", "5", "--max-new-tokens", "6",
               "--cache-mb", "8"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    alone = subprocess.run([sys.executable, "-m", "mlakit.cli", "generate", *command], capture_output=True, text=True, env=env)
    ranks = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "mlakit.cli", "generate", *command,
         "--tp-size", "2", "--dcp-size", "2", "--dcp-interleave", "2"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert alone.returncode == 0 and ranks.returncode == 0, ranks.stderr[-2000:]
    lines = [line for line in alone.stdout.splitlines() if " -> " in line]
    assert len(lines) == 2
    for line in lines:
        assert ranks.stdout.count(line) == 1, ranks.stdout
    assert "8 heads per rank" in ranks.stdout
