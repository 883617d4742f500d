"""Decode context parallelism in one process: the token ownership map, the per-step metadata,
and the configuration rules (resolve, the CLI). The multi-process runs are in
tests/test_distributed_dcp.py."""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch
from click.testing import CliRunner

from mlakit import ConfigError, DeviceInfo, MLAInputError, MLAShape, ServingConfig, resolve
from mlakit.cli import main
from mlakit.distributed import TokenSharding, dcp_decode_step, dcp_group_ranks, dcp_step, init_parallel

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


def _model_slots(sharding: TokenSharding, rank: int, table: torch.Tensor, lengths: list[int], new: list[int],
                 page_size: int) -> list[int]:
    """Each new token's slot on `rank`, walking positions one by one: -1 where another rank owns it."""
    slots = []
    for b, (length, n) in enumerate(zip(lengths, new)):
        mine = [p for p in range(length) if sharding.owner(p)[0] == rank]
        for p in range(length - n, length):
            local = mine.index(p) if p in mine else None
            slots.append(-1 if local is None else int(table[b, local // page_size]) * page_size + local % page_size)
    return slots


@pytest.mark.parametrize("seed", range(6))
def test_dcp_step_slots_of_full_tables_match_a_model(seed: int) -> None:
    """Random page tables (pages in random order) filled up to the last slot on this rank, and lengths whose
    last tokens belong to another rank past this rank's pages (their slot is -1): slots as the model's."""
    gen = torch.Generator().manual_seed(seed)
    dcp_size, interleave = int(torch.randint(1, 4, (), generator=gen)), int(torch.randint(1, 4, (), generator=gen))
    sharding, rank, page_size = TokenSharding(dcp_size, interleave), seed % dcp_size, 4
    batch, max_pages = 4, int(torch.randint(1, 4, (), generator=gen))
    table = torch.randperm(batch * max_pages * 2, generator=gen)[: batch * max_pages].view(batch, max_pages).int()
    capacity = max_pages * page_size
    fitting = [length for length in range(200) if sharding.local_length(length, rank) <= capacity]
    lengths = [fitting[-1], *(fitting[int(torch.randint(len(fitting), (), generator=gen))] for _ in range(batch - 1))]
    new = [min(length, int(torch.randint(1, 4, (), generator=gen))) for length in lengths]
    cu = torch.tensor([0, *itertools.accumulate(new)], dtype=torch.int32)
    step = dcp_step(sharding, rank, table, torch.tensor(lengths, dtype=torch.int32), cu, num_tokens=sum(new),
                    page_size=page_size)
    assert step.slots.tolist() == _model_slots(sharding, rank, table, lengths, new, page_size)
    q_len = int(torch.randint(1, 4, (), generator=gen))  # may exceed a length: those queries see no key
    step = dcp_decode_step(sharding, rank, table, torch.tensor(lengths, dtype=torch.int32), q_len=q_len, page_size=page_size)
    assert step.slots.tolist() == _model_slots(sharding, rank, table, lengths, [q_len] * batch, page_size)


def test_dcp_step_keeps_the_clamp_for_other_ranks_tokens_past_its_pages() -> None:
    # rank 1 of 2 holds local positions 0..3 of 9 tokens in its one page; position 8 is rank 0's local 4
    step = dcp_decode_step(TokenSharding(2), 1, torch.tensor([[5]], dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
                           q_len=2, page_size=4)
    assert step.slots.tolist() == [23, -1]


@pytest.mark.parametrize("seed", range(4))
def test_dcp_step_refuses_lengths_past_the_ranks_pages(seed: int) -> None:
    """A length whose tokens on this rank need one more page than the table row holds would give a new token
    an existing token's slot: refused, naming cache_seqlens, before any slot is made."""
    gen = torch.Generator().manual_seed(100 + seed)
    dcp_size, interleave = int(torch.randint(1, 4, (), generator=gen)), int(torch.randint(1, 4, (), generator=gen))
    sharding, rank, page_size = TokenSharding(dcp_size, interleave), seed % dcp_size, 4
    batch, max_pages = 3, int(torch.randint(1, 4, (), generator=gen))
    table = torch.randperm(batch * max_pages, generator=gen).view(batch, max_pages).int()
    capacity = max_pages * page_size
    too_long = next(length for length in range(500) if sharding.local_length(length, rank) > capacity)
    bad = int(torch.randint(batch, (), generator=gen))
    lengths = [too_long if b == bad else 1 for b in range(batch)]
    message = (rf"cache_seqlens: expected .* at most max_pages \* page_size = {max_pages} \* {page_size} = {capacity} "
               rf"tokens on this rank .*got cache_seqlens\[{bad}\] = {too_long} \({capacity + 1} tokens on rank {rank}\)")
    with pytest.raises(MLAInputError, match=message):
        dcp_decode_step(sharding, rank, table, torch.tensor(lengths, dtype=torch.int32), q_len=1, page_size=page_size)
    cu = torch.arange(batch + 1, dtype=torch.int32)
    with pytest.raises(MLAInputError, match=message):
        dcp_step(sharding, rank, table, torch.tensor(lengths, dtype=torch.int32), cu, num_tokens=batch, page_size=page_size)


@pytest.mark.parametrize(("table", "length", "q_len", "got"), [([[0]], 6, 1, 6), ([[2, 3]], 11, 2, 11), ([[3, 1]], 9, 1, 9)])
def test_dcp_decode_step_refuses_the_audits_cases(table: list, length: int, q_len: int, got: int) -> None:
    with pytest.raises(MLAInputError, match=rf"cache_seqlens: expected .*got cache_seqlens\[0\] = {got}"):
        dcp_decode_step(TokenSharding(1), 0, torch.tensor(table, dtype=torch.int32),
                        torch.tensor([length], dtype=torch.int32), q_len=q_len, page_size=4)


@pytest.mark.parametrize(("cu", "num_tokens"), [([0, 2], 3), ([0, 2], 1), ([0, 2, 1], 1), ([1, 2, 3], 3), ([0, 3, 2], 2)])
def test_dcp_step_refuses_offsets_that_disagree_with_num_tokens(cu: list, num_tokens: int) -> None:
    batch = len(cu) - 1
    table = torch.randperm(batch * 2, generator=torch.Generator().manual_seed(1)).view(batch, 2).int()
    with pytest.raises(MLAInputError, match=rf"cu_seqlens_q: expected non-decreasing offsets from 0 to num_tokens = "
                                            rf"{num_tokens}, got {re.escape(str(cu))}"):
        dcp_step(TokenSharding(1), 0, table, torch.full((batch,), 4, dtype=torch.int32),
                 torch.tensor(cu, dtype=torch.int32), num_tokens=num_tokens, page_size=4)


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


def test_unchecked_device_steps_never_give_a_new_token_an_existing_slot(monkeypatch):
    """On a GPU the step builders read no values (no sync), so a length past the rank's table is not refused there;
    its new tokens get slot -1 (never written) instead of the last page's slots, which hold existing tokens."""
    from mlakit.distributed import step as step_module

    monkeypatch.setattr(step_module, "_check_step_values", lambda *args: None)  # as for device tensors
    table = torch.tensor([[2, 3]], dtype=torch.int32)
    step = dcp_decode_step(TokenSharding(1), 0, table, torch.tensor([11], dtype=torch.int32), q_len=4, page_size=4)
    assert step.slots.tolist() == [3 * 4 + 3, -1, -1, -1]  # token 7 is page 3's last row; tokens 8-10 lie past it
