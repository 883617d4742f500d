"""CUDA graphs of decode steps: buckets, replays with changing lengths / tables / slots, padded rows,
target verify with k draft tokens, no host sync in capture or unchecked replay, the value checks of
`run`, and the capture guard; and `capture_graph`, the warm-up-then-capture sequence they and the GPU
tests share."""

import contextlib

import pytest
import torch

from mlakit.attention.functional import mla_decode
from mlakit.errors import ConfigError, MLAInputError
from mlakit.serving.graphs import DEFAULT_BATCH_BUCKETS, DecodeBuffers, DecodeGraphs, capture_graph
from mlakit.kernels.cache_write import write_rows
from mlakit.reference import reference_decode
from host_sync import forbidding_host_syncs
from paged_inputs import relative_error

RANK, ROPE, PAGE = 512, 64, 64
DIM = RANK + ROPE


def test_backends_that_cannot_be_captured_are_refused_naming_the_alternatives():
    with pytest.raises(ConfigError, match=r"backend 'intel_xpu' cannot be captured in a CUDA graph .* pick a backend that can: .*triton"):
        DecodeGraphs(lambda b: b.q, backend="intel_xpu", max_batch=4, q_len=1, heads=2, dim=DIM, max_pages=2,
                     page_size=PAGE, num_pages=8, dtype=torch.bfloat16, device=torch.device("cpu"))


def test_fill_pads_rows_so_kernels_read_nothing_and_writes_skip_them():
    buffers = DecodeBuffers.allocate(4, 2, 3, 8, 5, torch.bfloat16, torch.device("cpu"))
    buffers.q.fill_(7)
    buffers.cache_seqlens.fill_(9)
    q = torch.randn(2, 2, 3, 8).bfloat16()
    buffers.fill(q, torch.tensor([[3, 1], [2, 0]], dtype=torch.int32), torch.tensor([70, 0], dtype=torch.int32),
                 torch.tensor([5, 6, 7, 8]), rows=3)
    assert torch.equal(buffers.q[:2], q) and torch.equal(buffers.q[2], torch.zeros_like(buffers.q[2]))
    assert buffers.cache_seqlens.tolist() == [70, 0, 0, 9]  # row 3 is beyond this bucket: untouched
    assert buffers.block_table[:3].tolist() == [[3, 1, 0, 0, 0], [2, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert buffers.slots[:6].tolist() == [5, 6, 7, 8, -1, -1]
    assert buffers.real_rows[:3].tolist() == [True, True, False]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fn": 3}, r"^fn: expected a callable taking no arguments, got int 3$"),
        ({"warmup": -1}, r"^warmup: expected an int >= 0 \(eager calls before the capture\), got -1$"),
        ({"warmup": 1.0}, r"^warmup: expected an int >= 0 \(eager calls before the capture\), got 1.0$"),
        ({"warmup": True}, r"^warmup: expected an int >= 0 \(eager calls before the capture\), got True$"),
        ({"stream": "side"}, r"^stream: expected a torch.cuda.Stream or None, got str 'side'$"),
    ],
)
def test_capture_graph_refuses_bad_arguments_before_calling_fn(kwargs, message):
    calls = []
    arguments = {"fn": lambda: calls.append(1)} | kwargs
    fn = arguments.pop("fn")
    with pytest.raises(ConfigError, match=message):
        capture_graph(fn, **arguments)
    assert calls == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal where torch sees no CUDA device")
def test_capture_graph_without_cuda_is_refused_and_never_calls_fn():
    calls = []
    with pytest.raises(ConfigError, match=r"^capture_graph: CUDA graphs need a CUDA device \(torch sees none\); call fn eagerly"):
        capture_graph(lambda: calls.append(1), warmup=0)
    assert calls == []


@pytest.mark.gpu
def test_capture_graph_warms_up_on_a_side_stream_and_replays_rewritten_inputs():
    x = torch.zeros(4, device="cuda")
    caller = torch.cuda.current_stream()
    seen = []

    def fn():
        seen.append((torch.cuda.current_stream() == caller, torch.cuda.is_current_stream_capturing()))
        return x * 2 + 1

    graph, y = capture_graph(fn, warmup=2)
    assert seen == [(False, False), (False, False), (False, True)]  # two warm-ups, one capture, none on the caller's stream
    assert torch.cuda.current_stream() == caller
    for values in ([0.0, 1.0, 2.0, 3.0], [-5.0, 10.0, 0.5, 7.0]):
        x.copy_(torch.tensor(values))
        graph.replay()
        torch.cuda.synchronize()
        assert y.tolist() == [2 * v + 1 for v in values]


@pytest.mark.gpu
def test_capture_graph_shares_a_pool_and_stream_and_forbids_host_syncs_only_in_the_capture():
    pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    x = torch.arange(8.0, device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    modes = []

    def total():
        modes.append(torch.cuda.get_sync_debug_mode())
        return x.sum()

    whole, summed = capture_graph(total, pool=pool, stream=stream, forbid_host_sync=True)
    half, scaled = capture_graph(lambda: x[:4] * 10, pool=pool, stream=stream)
    assert modes == [before, 2] and torch.cuda.get_sync_debug_mode() == before  # "error" during the capture alone
    x.fill_(2.0)
    whole.replay()
    half.replay()
    torch.cuda.synchronize()
    assert summed.item() == 16.0 and scaled.tolist() == [20.0] * 4


class PagedWorld:
    """A bf16 cache with a pool of pages, sequences that grow step by step across page boundaries."""

    def __init__(self, max_batch: int, max_pages: int, heads: int, q_len: int, seed: int):
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.heads, self.q_len, self.max_pages = heads, q_len, max_pages
        self.cache = torch.randn(max_batch * max_pages + 4, PAGE, DIM, device="cuda", generator=self.gen).bfloat16()
        order = torch.randperm(self.cache.shape[0], device="cuda", generator=self.gen)[: max_batch * max_pages]
        self.table = order.view(max_batch, max_pages).int()

    def step_inputs(self, batch: int, step: int):
        lengths = torch.randint(0, self.max_pages * PAGE - 40, (batch,), device="cuda", generator=self.gen) + step
        lengths[torch.rand(batch, device="cuda", generator=self.gen) < 0.1] = 0  # some real sequences are empty
        lengths = torch.where(lengths > 0, torch.clamp(lengths, min=self.q_len), lengths).int()
        rows = torch.randperm(self.table.shape[0], device="cuda", generator=self.gen)[:batch]
        table = self.table[rows][:, : self.max_pages - (step % 2)]  # a narrower table on odd steps
        lengths = torch.clamp(lengths, max=table.shape[1] * PAGE)
        q = torch.randn(batch, self.q_len, self.heads, DIM, device="cuda", generator=self.gen).bfloat16()
        positions = lengths[:, None].long() - self.q_len + torch.arange(self.q_len, device="cuda")
        slots = table.gather(1, (positions.clamp(min=0) // PAGE)).long() * PAGE + positions.clamp(min=0) % PAGE
        slots = torch.where(lengths[:, None] > 0, slots, -1).flatten()
        return q, table, lengths, slots


def _attention_step(world: PagedWorld, scale: float, backend: str = "triton"):
    """Write each new token's row (head 0 of its query: fresh data) at its slot, then attend."""

    def step(b: DecodeBuffers) -> torch.Tensor:
        write_rows(world.cache, None, b.slots, b.q[:, :, 0, :].reshape(-1, DIM))
        out, _ = mla_decode(b.q, world.cache, b.block_table, b.cache_seqlens, softmax_scale=scale, backend=backend,
                            kv_lora_rank=RANK, return_lse=False, check_inputs=False)
        return out

    return step


def _eager(world: PagedWorld, q, table, lengths, slots, scale, backend: str = "triton"):
    write_rows(world.cache, None, slots, q[:, :, 0, :].reshape(-1, DIM))
    out, _ = mla_decode(q, world.cache, table, lengths, softmax_scale=scale, backend=backend, kv_lora_rank=RANK,
                        return_lse=False)
    ref, _ = reference_decode(q, world.cache, table, lengths, kv_lora_rank=RANK, softmax_scale=scale)
    return out, ref


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend, heads, q_len, max_batch",  # q_len k + 1: target verify with k 1, 3, 7
    [("triton", 16, 1, 128), ("triton", 128, 1, 128), ("triton", 16, 2, 128), ("triton", 16, 4, 128), ("triton", 16, 8, 128),
     ("reference", 16, 1, 16), ("reference", 5, 4, 16)],
)
def test_decode_graphs_replay_changing_steps_like_eager_runs_and_the_reference(backend, heads, q_len, max_batch):
    max_pages, scale = 6, 192**-0.5
    world = PagedWorld(max_batch, max_pages, heads, q_len, seed=heads + q_len)
    graphs = DecodeGraphs(_attention_step(world, scale, backend), backend=backend, max_batch=max_batch, q_len=q_len,
                          heads=heads, dim=DIM, max_pages=max_pages, page_size=PAGE, num_pages=world.cache.shape[0],
                          dtype=torch.bfloat16, device=torch.device("cuda"))
    assert graphs.buckets == tuple(b for b in DEFAULT_BATCH_BUCKETS if b <= max_batch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graphs.capture()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    batches = [1, 2, 3, 4, 7, 8, 9, 16, 31, 32, 33, 64, 65, 100, 128, 128, 5, 1, 64, 17]
    for step, batch in enumerate(min(b, max_batch) for b in batches):
        q, table, lengths, slots = world.step_inputs(batch, step)
        saved = world.cache.clone()
        checked = step // 2 % 2 == 0  # with both table widths: the value check syncs once, an unchecked run never
        with contextlib.nullcontext() if checked else forbidding_host_syncs():
            got = graphs.run(q, table, lengths, slots, check_values=checked).clone()
        after_graph = world.cache.clone()
        world.cache.copy_(saved)
        eager, ref = _eager(world, q, table, lengths, slots, scale, backend)
        assert torch.equal(world.cache, after_graph), f"step {step}: the graph wrote other cache rows than eager"
        assert got.shape == (batch, q_len, heads, RANK)
        assert relative_error(got, eager) < 1e-2 and relative_error(got, ref) < 1e-2, f"step {step}, batch {batch}"
        empty = lengths == 0
        assert torch.equal(got[empty], torch.zeros_like(got[empty]))
        full = graphs.replay(batch)
        assert full.shape[0] == graphs.bucket_for(batch)
        assert torch.equal(full[batch:], torch.zeros_like(full[batch:])), "padded rows must be zeros"


@pytest.mark.gpu
def test_run_refuses_a_batch_beyond_the_largest_bucket_and_a_wider_table():
    world = PagedWorld(8, 2, 4, 1, seed=1)
    graphs = DecodeGraphs(_attention_step(world, 0.1), backend="triton", max_batch=8, q_len=1, heads=4, dim=DIM,
                          max_pages=2, page_size=PAGE, num_pages=world.cache.shape[0], dtype=torch.bfloat16,
                          device=torch.device("cuda"), buckets=(2, 8))
    assert graphs.buckets == (2, 8)
    graphs.capture()
    q, table, lengths, slots = world.step_inputs(8, 0)
    with pytest.raises(MLAInputError, match="at most 8 sequences"):
        graphs.run(torch.cat([q, q[:1]]), torch.cat([table, table[:1]]), torch.cat([lengths, lengths[:1]]))
    with pytest.raises(MLAInputError, match="at most 2 pages per sequence"):
        graphs.run(q, torch.cat([table, table], dim=1), lengths)
    with pytest.raises(MLAInputError, match="cache_seqlens: expected torch.int32 of shape \\[8\\]"):
        graphs.run(q, table, lengths[:1])  # would broadcast one length over the batch
    with pytest.raises(MLAInputError, match="q: expected torch.bfloat16"):
        graphs.run(q.float(), table, lengths)
    with pytest.raises(MLAInputError, match="slots: expected torch.int64 of shape \\[8\\]"):
        graphs.run(q, table, lengths, slots[:3])
    with pytest.raises(MLAInputError, match="^q: expected a tensor, got list"):
        graphs.run(q.tolist(), table, lengths)
    with pytest.raises(MLAInputError, match="^slots: expected a tensor or None, got list"):
        graphs.run(q, table, lengths, slots.tolist())
    with pytest.raises(MLAInputError, match=r"^block_table: expected a tensor with a batch axis, got shape \(\)"):
        graphs.run(q, table[0, 0], lengths)


@pytest.mark.gpu
def test_run_refuses_values_the_kernels_would_misread_and_skips_the_check_without_a_sync_when_told():
    world = PagedWorld(4, 2, 4, 1, seed=2)
    num_pages, num_slots = world.cache.shape[0], world.cache.shape[0] * PAGE
    graphs = DecodeGraphs(_attention_step(world, 0.1), backend="triton", max_batch=4, q_len=1, heads=4, dim=DIM,
                          max_pages=2, page_size=PAGE, num_pages=num_pages, dtype=torch.bfloat16,
                          device=torch.device("cuda"), buckets=(4,))
    graphs.capture()
    q, table, lengths, slots = world.step_inputs(4, 0)
    lengths = lengths.clamp(max=PAGE)
    lengths[1] = PAGE + 1  # the one row that uses column 1
    bad_page, negative, bad_slots = table.clone(), lengths.clone(), slots.clone()
    bad_page[1, 1] = num_pages
    negative[3] = -1
    bad_slots[2] = num_slots
    before = world.cache.clone(), graphs.buffers.block_table.clone()
    refusals = [
        ((q, bad_page, lengths, slots), rf"^block_table: .*\[0, {num_pages}\).*block_table\[1, 1\] = {num_pages}$"),
        # fill would pad the missing column 1 with page 0, which the kernel would read
        ((q, table[:, :1], lengths, slots), rf"^cache_seqlens: .* = 1 \* {PAGE} .*cache_seqlens\[1\] = {PAGE + 1}$"),
        ((q, table, negative, slots), r"^cache_seqlens: expected lengths >= 0, got cache_seqlens\[3\] = -1$"),
        ((q, table, lengths, bad_slots), rf"^slots: expected -1 \(padding\) or a flat slot in \[0, {num_slots}\)"
                                         rf".*slots\[2\] = {num_slots}$"),
    ]
    for arguments, message in refusals:
        with pytest.raises(MLAInputError, match=message):
            graphs.run(*arguments)
    assert torch.equal(world.cache, before[0]) and torch.equal(graphs.buffers.block_table, before[1])  # nothing ran
    checked = graphs.run(q, table, lengths, slots).clone()
    world.cache.copy_(before[0])
    with forbidding_host_syncs():
        unchecked = graphs.run(q, table, lengths, slots, check_values=False)
    assert torch.equal(unchecked, checked)
