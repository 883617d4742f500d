"""Decode context parallelism in one process: the token ownership map, the per-step metadata,
and the configuration rules (resolve, the CLI). The multi-process runs are in
tests/test_distributed_dcp.py."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from click.testing import CliRunner

from mlakit import ConfigError, DeviceInfo, MLAInputError, MLAShape, ServingConfig, resolve
from mlakit.cli import main
from mlakit.distributed import TokenSharding, dcp_group_ranks, dcp_step, init_parallel

SHARDINGS = [TokenSharding(d, i) for d, i in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 4, 16))]


@pytest.mark.parametrize("sharding", SHARDINGS, ids=str)
def test_owner_and_global_position_round_trip(sharding: TokenSharding) -> None:
    positions = torch.arange(300)
    ranks, local = sharding.owner(positions)
    assert ranks.min() >= 0 and ranks.max() < sharding.dcp_size
    for rank in range(sharding.dcp_size):
        held = positions[ranks == rank]
        assert torch.equal(local[ranks == rank], torch.arange(held.numel())), "local positions are 0, 1, 2, ... in order"
        assert torch.equal(sharding.global_position(rank, torch.arange(held.numel())), held)
    assert [sharding.owner(p) for p in (0, 37, 299)] == [tuple(int(v[p]) for v in (ranks, local)) for p in (0, 37, 299)]


@pytest.mark.parametrize("sharding", SHARDINGS, ids=str)
def test_local_length_counts_owned_positions(sharding: TokenSharding) -> None:
    lengths = torch.arange(0, 200, dtype=torch.int32)
    owners = sharding.owner(torch.arange(200))[0]
    counts = [sharding.local_length(lengths, rank) for rank in range(sharding.dcp_size)]
    for rank, count in enumerate(counts):
        brute = torch.tensor([int((owners[:n] == rank).sum()) for n in range(200)], dtype=torch.int32)
        assert count.dtype == torch.int32 and torch.equal(count, brute)
        assert [sharding.local_length(n, rank) for n in (0, 5, 199)] == brute[[0, 5, 199]].tolist()
    assert torch.equal(sum(counts), lengths), "every token is held by exactly one rank"


def test_sharding_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="dcp_size must be an integer >= 1, got 0"):
        TokenSharding(0)
    with pytest.raises(ConfigError, match="interleave must be an integer >= 1, got 2.0"):
        TokenSharding(2, 2.0)
    with pytest.raises(ConfigError, match=r"rank must be a DCP rank in \[0, 2\), got 2"):
        TokenSharding(2).local_length(5, rank=2)


@pytest.mark.parametrize(("dcp_size", "interleave", "rank"), [(2, 1, 0), (2, 1, 1), (4, 3, 2), (4, 2, 3), (3, 4, 0)])
def test_dcp_step_against_a_brute_force_walk(dcp_size: int, interleave: int, rank: int) -> None:
    """Visible local keys and local slots of every query token, by walking the positions one by one."""
    sharding, page_size = TokenSharding(dcp_size, interleave), 4
    lengths, new = [9, 1, 14, 0, 6, 1], [3, 1, 5, 0, 1, 3]  # the last is shorter than its queries: two see no key
    max_pages = 4
    table = torch.randperm(len(lengths) * max_pages, generator=torch.Generator().manual_seed(rank)).view(-1, max_pages)
    cu = torch.tensor([0, *itertools.accumulate(new)], dtype=torch.int32)
    step = dcp_step(sharding, rank, table.int(), torch.tensor(lengths, dtype=torch.int32), cu,
                    num_tokens=sum(new), page_size=page_size)
    visible, slots, positions = [], [], []
    for b, (length, n) in enumerate(zip(lengths, new)):
        mine = [p for p in range(length) if sharding.owner(p)[0] == rank]
        for p in range(length - n, length):
            positions.append(p)
            visible.append(sum(1 for q in mine if q <= p))
            local = mine.index(p) if p in mine else None
            slots.append(-1 if local is None else int(table[b, local // page_size]) * page_size + local % page_size)
    assert step.positions.tolist() == positions
    assert step.visible.tolist() == visible and step.visible.dtype == torch.int32
    assert step.slots.tolist() == slots
    assert step.cache_seqlens.tolist() == [sharding.local_length(n, rank) for n in lengths]
    assert step.block_table.shape == (sum(new), max_pages)


def test_dcp_step_checks_shapes() -> None:
    table, lens = torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(MLAInputError, match=r"cu_seqlens_q: expected int32 \[3\], got torch.int32 \[2\]"):
        dcp_step(TokenSharding(2), 0, table, lens, lens, num_tokens=2, page_size=4)
    with pytest.raises(MLAInputError, match="block_table: expected int32"):
        dcp_step(TokenSharding(2), 0, table.long(), lens, torch.arange(3, dtype=torch.int32), num_tokens=2, page_size=4)
    with pytest.raises(MLAInputError, match="page_size: expected an integer >= 1, got 0"):
        dcp_step(TokenSharding(2), 0, table, lens, torch.arange(3, dtype=torch.int32), num_tokens=2, page_size=0)


def test_dcp_group_layout_is_consecutive_tp_ranks() -> None:
    assert dcp_group_ranks(4, 4) == [[0, 1, 2, 3]]
    assert dcp_group_ranks(4, 1) == [[0], [1], [2], [3]]
    with pytest.raises(ConfigError, match="dcp_size=3 does not divide tp_size=4"):
        dcp_group_ranks(4, 3)


def test_init_parallel_needs_torch_distributed() -> None:
    with pytest.raises(ConfigError, match=r"tp_size=8 needs torch.distributed.*torchrun --nproc-per-node 8"):
        init_parallel(ServingConfig(tp_size=8, dcp_size=8))


# --- configuration ---------------------------------------------------------------------------

CPU = DeviceInfo.from_arch("cpu")
V3 = MLAShape.preset("deepseek-v3")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": 8, "dcp_size": 3}, r"dcp_size=3 does not divide tp_size=8: .*use a dcp_size in \[1, 2, 4, 8\]"),
        ({"dcp_size": 0}, "dcp_size must be an integer >= 1, got 0"),
        ({"dcp_interleave": 0}, "dcp_interleave must be an integer >= 1, got 0"),
        ({"tp_size": 2, "dcp_size": True}, "dcp_size must be an integer >= 1, got True"),
    ],
)
def test_serving_config_rejects_bad_dcp(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServingConfig(**kwargs)


def test_resolve_plans_dcp_and_explains_it() -> None:
    plan = resolve(ServingConfig(tp_size=8, dcp_size=4, dcp_interleave=16), V3, CPU)
    assert (plan.dcp_size, plan.dcp_interleave, plan.page_size % 16) == (4, 16, 0)
    assert plan.to_dict()["dcp_size"] == 4 and plan.to_dict()["dcp_interleave"] == 16
    note = next(n for n in plan.notes if n.startswith("decode context parallelism"))
    assert "2 DCP group(s) of 4 consecutive TP ranks" in note and "(p // 16) % 4" in note
    assert "64 heads (16 per rank x 4)" in note and "all-to-all" in note


def test_resolve_refuses_a_decode_backend_without_lse_under_dcp() -> None:
    with pytest.raises(ConfigError) as info:
        resolve(ServingConfig(tp_size=8, dcp_size=2, decode_backend="trtllm_mla"), V3, DeviceInfo.from_arch("sm100"))
    message = str(info.value)
    assert "does not return the log-sum-exp, which dcp_size=2 needs" in message and "set dcp_size=1" in message
    assert "backends that fit this decode configuration:" in message
    plan = resolve(ServingConfig(tp_size=8, dcp_size=2), V3, DeviceInfo.from_arch("sm100"))
    decode_note = next(n for n in plan.notes if n.startswith("decode backend:"))
    assert plan.decode_backend != "trtllm_mla" and "skipped trtllm_mla (does not return the log-sum-exp" in decode_note


def test_resolve_counts_the_dcp_groups_heads_against_backend_limits() -> None:
    # flashmla takes at most 128 heads per call: TP8 x DCP8 of DeepSeek-V3 gathers 128, a 256-head model 256.
    assert resolve(ServingConfig(tp_size=8, dcp_size=8, decode_backend="flashmla"), V3, DeviceInfo.from_arch("sm90"))
    big = MLAShape(256, 512, 128, 64, 128)
    with pytest.raises(ConfigError, match=r"got 256 \(32 heads per rank x dcp_size 8: .*raise tp_size or lower dcp_size"):
        resolve(ServingConfig(tp_size=8, dcp_size=8, decode_backend="flashmla"), big, DeviceInfo.from_arch("sm90"))


def test_resolve_page_size_and_interleave() -> None:
    with pytest.raises(ConfigError, match="page_size=16 is not a multiple of dcp_interleave=32: .*or dcp_interleave to a divisor of 16"):
        resolve(ServingConfig(tp_size=2, dcp_size=2, dcp_interleave=32, page_size=16), V3, CPU)
    assert resolve(ServingConfig(tp_size=2, dcp_size=2, dcp_interleave=512), V3, CPU).page_size == 512
    with pytest.raises(ConfigError, match=r"no page size that flashmla \{64\} .* is a multiple of dcp_interleave=128"):
        resolve(ServingConfig(tp_size=2, dcp_size=2, dcp_interleave=128, decode_backend="flashmla"), V3, DeviceInfo.from_arch("sm90"))
    # Without DCP the interleave does not constrain anything.
    assert resolve(ServingConfig(dcp_interleave=128, page_size=16), V3, CPU).page_size == 16


def test_cli_check_takes_dcp_options() -> None:
    runner = CliRunner()
    ok = runner.invoke(main, ["check", "--device-arch", "cpu", "--tp-size", "4", "--dcp-size", "2", "--dcp-interleave", "8", "--json"])
    assert ok.exit_code == 0, ok.output
    plan = json.loads(ok.output)
    assert (plan["dcp_size"], plan["dcp_interleave"]) == (2, 8)
    bad = runner.invoke(main, ["check", "--device-arch", "cpu", "--tp-size", "4", "--dcp-size", "3"])
    assert bad.exit_code == 2 and "dcp_size=3 does not divide tp_size=4" in bad.output


def test_the_helpers_are_reachable_from_the_package() -> None:
    import mlakit

    assert mlakit.distributed.merge_across_ranks is not None and mlakit.distributed.TokenSharding is TokenSharding
