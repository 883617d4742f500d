"""`check_step_values`, the value check `DecodeGraphs.run` makes before a replay (the captured kernels check
nothing), on CPU: random valid steps pass, and every value a kernel would misread is refused naming the
argument and the index; and the cache description `DecodeGraphs` takes for it."""

import pytest
import torch

from mlakit.errors import ConfigError, MLAInputError
from mlakit.serving.graphs import DecodeGraphs, check_step_values


def random_step(seed: int) -> dict:
    """A valid step: used table columns hold pages in [0, num_pages), unused ones anything (-1, huge),
    lengths up to the table's pages (some 0), slots in [0, num_pages * page_size) or -1."""
    gen = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=gen)

    page_size, num_pages, batch, columns, q_len = (int(v) for v in (draw(1, 65, 1), draw(1, 40, 1), draw(1, 9, 1),
                                                                    draw(1, 6, 1), draw(1, 4, 1)))
    lengths = draw(0, columns * page_size + 1, batch)
    lengths[draw(0, 2, batch).bool()] = 0
    used = torch.arange(columns)[None, :] < (lengths[:, None] + page_size - 1) // page_size
    unused = torch.where(draw(0, 2, batch, columns).bool(), -1, num_pages + draw(0, 1000, batch, columns))
    table = torch.where(used, draw(0, num_pages, batch, columns), unused).int()
    slots = torch.where(draw(0, 4, batch * q_len) == 0, -1, draw(0, num_pages * page_size, batch * q_len))
    return dict(block_table=table, cache_seqlens=lengths.int(), slots=slots, page_size=page_size, num_pages=num_pages)


@pytest.mark.parametrize("seed", range(40))
def test_random_valid_steps_pass_with_and_without_slots(seed):
    step = random_step(seed)
    check_step_values(**step)
    check_step_values(**(step | {"slots": None}))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bad_page", ["num_pages", -1, -7])
def test_a_page_index_outside_the_cache_in_a_used_column_names_block_table_and_the_entry(seed, bad_page):
    step = random_step(seed)
    table, lengths = step["block_table"], step["cache_seqlens"]
    page_size, num_pages = step["page_size"], step["num_pages"]
    gen = torch.Generator().manual_seed(seed)
    b = int(torch.randint(0, lengths.shape[0], (1,), generator=gen))
    lengths[b] = max(int(lengths[b]), 1)
    used_columns = (int(lengths[b]) + page_size - 1) // page_size
    p = int(torch.randint(0, used_columns, (1,), generator=gen))
    value = num_pages if bad_page == "num_pages" else bad_page
    table[b, p] = value
    with pytest.raises(MLAInputError, match=rf"^block_table: expected page indices in \[0, {num_pages}\) .*"
                                            rf"got block_table\[{b}, {p}\] = {value}$"):
        check_step_values(**step)


@pytest.mark.parametrize("seed", range(6))
def test_minus_one_in_columns_the_lengths_do_not_use_passes(seed):
    step = random_step(seed)
    page_size = step["page_size"]
    table, lengths = step["block_table"], step["cache_seqlens"]
    lengths[0] = 0  # a row using no column at all
    unused = torch.arange(table.shape[1])[None, :] >= (lengths[:, None].long() + page_size - 1) // page_size
    table[unused] = -1
    check_step_values(**step)


@pytest.mark.parametrize("seed", range(6))
def test_a_length_beyond_the_tables_pages_names_cache_seqlens_and_the_row(seed):
    step = random_step(seed)
    table, lengths, page_size = step["block_table"], step["cache_seqlens"], step["page_size"]
    b = lengths.shape[0] - 1
    lengths[b] = table.shape[1] * page_size + 1 + seed  # fill would pad the missing pages with page 0
    with pytest.raises(MLAInputError, match=rf"^cache_seqlens: expected lengths <= max_pages \* page_size = "
                                            rf"{table.shape[1]} \* {page_size} = .* got cache_seqlens\[{b}\] = "
                                            rf"{int(lengths[b])}$"):
        check_step_values(**step)


@pytest.mark.parametrize("seed", range(6))
def test_a_negative_length_names_cache_seqlens_and_the_row(seed):
    step = random_step(seed)
    b = seed % step["cache_seqlens"].shape[0]
    step["cache_seqlens"][b] = -1 - seed
    message = rf"^cache_seqlens: expected lengths >= 0, got cache_seqlens\[{b}\] = {-1 - seed}$"
    with pytest.raises(MLAInputError, match=message):
        check_step_values(**step)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bad_slot", ["num_slots", -2, -100])
def test_a_slot_outside_the_cache_names_slots_and_the_index(seed, bad_slot):
    step = random_step(seed)
    slots, num_slots = step["slots"], step["num_pages"] * step["page_size"]
    i = seed % slots.shape[0]
    value = num_slots if bad_slot == "num_slots" else bad_slot
    slots[i] = value
    with pytest.raises(MLAInputError, match=rf"^slots: expected -1 \(padding\) or a flat slot in \[0, {num_slots}\) "
                                            rf".*got slots\[{i}\] = {value}$"):
        check_step_values(**step)


@pytest.mark.parametrize("seed", range(6))
def test_padding_slots_and_the_cache_edges_pass(seed):
    step = random_step(seed)
    slots, num_slots = step["slots"], step["num_pages"] * step["page_size"]
    slots[:] = -1
    check_step_values(**step)
    slots[0], slots[-1] = 0, num_slots - 1
    check_step_values(**step)


@pytest.mark.parametrize("page_size, num_pages", [(0, 8), (64, 0), (-1, 8), (64.0, 8), (True, 8), (64, None)])
def test_decode_graphs_refuses_a_cache_description_that_is_not_two_positive_ints(page_size, num_pages):
    with pytest.raises(ConfigError, match=rf"^page_size and num_pages: expected ints >= 1 .*got {page_size!r} and "
                                          rf"{num_pages!r}$"):
        DecodeGraphs(lambda b: b.q, backend="triton", max_batch=4, q_len=1, heads=2, dim=576, max_pages=2,
                     page_size=page_size, num_pages=num_pages, dtype=torch.bfloat16, device="cuda")
