"""s36a: the FlashMLA drop-in over fp8 pages with per-group scales (a grid kernel reads them), its schedule planned
as before this session (the page size as the hint, equal shares allowed) and as now (`decode_page_size_hint`: None):
times in CUDA-graph replay (L2 not flushed; each batch's cache is larger than L2), outputs compared. Run from the
repository root with PYTHONPATH=src:tests."""

from unittest import mock

import torch

from mlakit.compat import flash_mla as compat
from paged_inputs import make_paged_batch


def graph_time_us(fn, replays: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / replays


def drop_in_call(inputs):
    schedule = compat.get_mla_metadata()
    q = inputs.q
    return lambda: compat.flash_mla_with_kvcache(q, inputs.kv_cache.unsqueeze(2), inputs.block_table,
                                                 inputs.cache_seqlens, 512, *schedule, softmax_scale=inputs.softmax_scale,
                                                 causal=True, is_fp8_kvcache=True, kv_scale=inputs.kv_scale)


for batch, length, q_len in [(96, 2048, 1), (48, 4096, 2), (40, 8192, 2), (24, 16384, 2)]:
    inputs = make_paged_batch([length] * batch, heads=128, q_len=q_len, page_size=64, kv_lora_rank=512, rope_dim=64,
                              kv_dtype="fp8_e4m3", scale_layout="group", device="cuda")
    compat._CALL_LAYOUTS.clear()
    with mock.patch.object(compat, "decode_page_size_hint", return_value=64):
        before = drop_in_call(inputs)
        t_before, out_before = graph_time_us(before), before()[0].clone()
    compat._CALL_LAYOUTS.clear()
    now = drop_in_call(inputs)
    t_now, out_now = graph_time_us(now), now()[0].clone()
    print(f"drop-in 128h {batch} x {length} x {q_len} per-group fp8: page size as hint {t_before:.1f} us, "
          f"decode_page_size_hint {t_now:.1f} us: {t_now / t_before:.3f}x; outputs differ by "
          f"{(out_before.float() - out_now.float()).abs().max().item():.2e}")
