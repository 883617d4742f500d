"""s35f: fp8 with per-group scales at pages of 64 (a grid kernel reads them) over a plan built with the page-size hint
(equal shares allowed, as before the change) and without it (what `page_size_hint` now gives): times in CUDA-graph
replay (L2 not flushed; each batch's cache is larger than L2), outputs compared. Run from the repository root with
PYTHONPATH=src:tests."""

import torch

from mlakit.kernels.triton_decode import page_size_hint, plan_decode, triton_mla_decode
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


for batch, length, q_len in [(96, 2048, 1), (48, 4096, 2), (40, 8192, 2), (24, 16384, 2)]:
    inputs = make_paged_batch([length] * batch, heads=128, q_len=q_len, page_size=64, kv_lora_rank=512, rope_dim=64,
                              kv_dtype="fp8_e4m3", scale_layout="group", device="cuda")
    hint = page_size_hint(inputs.kv_cache, inputs.kv_scale, 512)
    results = {}
    for label, page_size in (("hinted", 64), ("no hint", hint)):
        plan = plan_decode(inputs.cache_seqlens, q_len=q_len, heads=128, kv_dtype=inputs.kv_cache.dtype,
                           page_size=page_size)
        out = torch.empty(batch, q_len, 128, 512, dtype=inputs.q.dtype, device="cuda")
        lse = torch.empty(batch, 128, q_len, dtype=torch.float32, device="cuda")

        def call(plan=plan, out=out, lse=lse):
            triton_mla_decode(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens, kv_lora_rank=512,
                              softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale, plan=plan, out=out, lse=lse)

        results[label] = (graph_time_us(call), out.clone(), int(plan.work_state[2]))
    (t_hint, o_hint, order_hint), (t_none, o_none, order_none) = results["hinted"], results["no hint"]
    print(f"128h {batch} x {length} x {q_len}: hint given {hint}; hinted {t_hint:.1f} us (order {order_hint}), "
          f"no hint {t_none:.1f} us (order {order_none}): {t_none / t_hint:.3f}x; outputs differ by "
          f"{(o_hint.float() - o_none.float()).abs().max().item():.2e}")
