"""Device probe of fp8 values as a register operand (NOTES.md "Next (issue 23)", way 2 with fp16 MMAs): one
warpgroup's P . V over a half-tile (64 query rows x 64 tokens x 256 latent columns, e4m3 values, fp16 P) three ways,
checked against torch and timed per half-tile:

- `registers`: O^T = V^T P^T with A = V^T built in registers from the e4m3 boxes as TMA leaves them (four
  [64 tokens, 64 columns] boxes, 64-byte swizzle): row 64 x r + j of A is latent column 4 x j + r, so that one 32-bit
  word of a box (four columns of one token) feeds the same row slot of the four 64-row MMA tiles; per two tokens of a
  word, 2 `prmt` and 4 `cvt.rn.f16x2.e4m3x2`, no stores. B = P^T from shared memory.
- `given`: O = P V with the values already fp16 in shared memory (the preparation free: v64's skip bound).
- `converted`: as `given`, the fp8 boxes first converted to fp16 in place each time (v64's
  `_convert_four_blocks_in_place`; after the first pass it converts its own output again: times only).

Usage (H100): PYTHONPATH=src python benchmarks/experiments/register_values_probe.py [JSON_PATH]
"""

import json
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from mlakit.bench.ceilings import measure_ceilings
from mlakit.bench.decode import environment
from mlakit.kernels.hopper_decode import seesaw_fp8, seesaw_loads
from mlakit.kernels.gluon_compat import thread_barrier

ROWS, TOKENS, COLUMNS = gl.constexpr(64), gl.constexpr(64), gl.constexpr(256)
MODES = ("registers", "given", "converted")
# The four boxes as int32 words [box x 64 + token, word]: each thread the two words (j and j + 8 of its box) of the
# tokens its A fragment holds (k = 2 x (lane % 4) + {0, 1} + 8 x kb, four 16-token steps), its box the warp's.
BOX_WORDS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[1, 0], [0, 8], [8, 0], [16, 0], [32, 0]], lane_bases=[[2, 0], [4, 0], [0, 1], [0, 2], [0, 4]],
    warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[256, 16]))
FILL = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))
# Two tokens' words in, each column's pair of values out as fp16 (r0 even, r0 odd, r1 even, ...).
_PAIRS_TO_F16 = gl.constexpr("""{
.reg .b32 t0, t1, f;
.reg .b16 l0, h0, l1, h1;
prmt.b32 t0, $8, $9, 0x5140;
prmt.b32 t1, $8, $9, 0x7362;
mov.b32 {l0, h0}, t0;
mov.b32 {l1, h1}, t1;
cvt.rn.f16x2.e4m3x2 f, l0;
mov.b32 {$0, $1}, f;
cvt.rn.f16x2.e4m3x2 f, h0;
mov.b32 {$2, $3}, f;
cvt.rn.f16x2.e4m3x2 f, l1;
mov.b32 {$4, $5}, f;
cvt.rn.f16x2.e4m3x2 f, h1;
mov.b32 {$6, $7}, f;
}""")


@gluon.jit
def _values_operand(words_view, a_layout: gl.constexpr):
    """A = V^T `[256, 64]` fp16 (row 64 x r + j = latent column 4 x j + r, column = token) from the boxes' words."""
    words = gl.reshape(words_view.load(BOX_WORDS), [4, 4, 8, 2, 16])  # [box, step, token pair, token in pair, word]
    even, odd = gl.split(gl.permute(words, [0, 1, 2, 4, 3]))
    a0, b0, a1, b1, a2, b2, a3, b3 = gl.inline_asm_elementwise(
        _PAIRS_TO_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [even, odd], dtype=(gl.float16,) * 8, is_pure=True, pack=1)
    columns = gl.join(gl.join(gl.join(a0, b0), gl.join(a1, b1)), gl.join(gl.join(a2, b2), gl.join(a3, b3)))
    # [box, step, pair, word, token in pair, r0, r1] -> [r1, r0, box, word, step, pair, token in pair]
    a = gl.reshape(gl.permute(columns, [6, 5, 0, 3, 1, 2, 4]), [256, 64])
    return gl.convert_layout(a, a_layout)


@gluon.jit
def probe_kernel(V8, V16, P, OUT, iterations, MODE: gl.constexpr):
    rows = gl.arange(0, 256, layout=gl.SliceLayout(1, FILL))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, FILL))
    rows64 = gl.arange(0, 64, layout=gl.SliceLayout(1, FILL))
    cols256 = gl.arange(0, 256, layout=gl.SliceLayout(0, FILL))
    box_values = gl.load(V8 + (rows[:, None] % 64) * COLUMNS + (rows[:, None] // 64) * 64 + cols[None, :])
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, TOKENS], gl.float16)
    p_smem = gl.allocate_shared_memory(gl.float16, [ROWS, TOKENS], p_layout)
    p_smem.store(gl.load(P + rows64[:, None] * TOKENS + cols[None, :]))
    if MODE == 0:
        # two copies, taken in turn, so that the compiler cannot hoist the preparation out of the loop
        boxes = gl.allocate_shared_memory(gl.float8e4nv, [2, 256, 64], gl.NVMMASharedLayout(
            swizzle_byte_width=64, element_bitwidth=8, rank=2))
        boxes.index(0).store(box_values)
        boxes.index(1).store(box_values)
        words_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2)
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, 64, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        fence_async_shared()
        thread_barrier()
        acc = gl.zeros([256, ROWS], gl.float32, acc_layout)
        for i in range(iterations):
            words = boxes.index(i % 2)._reinterpret(gl.int32, [256, 16], words_layout)
            acc = warpgroup_mma(_values_operand(words, a_layout), p_smem.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        # [256 (r, j), rows] -> [rows, latent column 4 x j + r]
        out = gl.reshape(gl.permute(gl.reshape(gl.permute(acc, [1, 0]), [ROWS, 4, 64]), [0, 2, 1]), [ROWS, 256])
    else:
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, 256, 16])
        v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TOKENS, COLUMNS], gl.float16)
        values = gl.allocate_shared_memory(gl.float16, [TOKENS, COLUMNS], v_layout)
        if MODE == 1:
            values.store(gl.load(V16 + rows64[:, None] * COLUMNS + cols256[None, :]))
        else:
            for block in gl.static_range(4):
                seesaw_loads._fp8_block(values, block, gl.float8e4nv).store(
                    gl.load(V8 + rows64[:, None] * COLUMNS + block * 64 + cols[None, :]))
        fence_async_shared()
        thread_barrier()
        acc = gl.zeros([ROWS, 256], gl.float32, acc_layout)
        for _ in range(iterations):
            if MODE == 2:
                seesaw_fp8._convert_four_blocks_in_place(values, 0, TOKENS)
            acc = warpgroup_mma(p_smem, values, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        out = acc
    out = gl.convert_layout(out, FILL)
    base = gl.program_id(0) * ROWS * COLUMNS
    gl.store(OUT + base + rows64[:, None] * COLUMNS + cols256[None, :], out)


def run(mode: str, v8: torch.Tensor, v16: torch.Tensor, p: torch.Tensor, out: torch.Tensor, iterations: int) -> None:
    """`iterations` passes of `mode` in each of `out`'s programs (`out`: `[programs, 64, 256]`)."""
    probe_kernel[(out.shape[0],)](v8, v16, p, out, iterations, MODE=MODES.index(mode), num_warps=4)


def main() -> None:
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    print(f"ceilings: copy {ceilings.copy_gb_per_s:.0f} GB/s, matmul {ceilings.matmul_tflop_per_s:.0f} TFLOP/s")
    gen = torch.Generator(device=device).manual_seed(0)
    v8 = torch.randn(TOKENS.value, COLUMNS.value, generator=gen, device=device).to(torch.float8_e4m3fn)
    p = torch.rand(ROWS.value, TOKENS.value, generator=gen, device=device).to(torch.float16)
    reference = p.float() @ v8.float()
    programs = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    v16 = v8.to(torch.float16)
    out = torch.empty(programs, ROWS.value, COLUMNS.value, device=device, dtype=torch.float32)
    rows = []
    for mode in MODES:
        out.fill_(float("nan"))
        run(mode, v8, v16, p, out, 1)
        error = ((out - reference).norm() / reference.norm()).item()
        spread = (out - out[:1]).abs().max().item()
        print(f"{mode}: error {error:.2e}, programs differ by {spread:.1e}", flush=True)
        rows.append({"mode": mode, "error": error, "programs_differ_by": spread})
    iterations = 512
    flops = 2 * ROWS.value * TOKENS.value * COLUMNS.value * programs
    for row in rows:
        ms = triton.testing.do_bench(lambda: run(row["mode"], v8, v16, p, out, iterations), warmup=5, rep=50)
        row["us_a_pass"] = per_pass = ms * 1e3 / iterations
        row["us_a_half_tile_an_sm"] = per_pass * 132 / programs
        row["matmul_ratio"] = flops / per_pass / 1e6 / ceilings.matmul_tflop_per_s
        print(f"{row['mode']}: {per_pass:.3f} us a pass of {programs} programs ({row['us_a_half_tile_an_sm']:.3f} us a "
              f"half-tile an SM, {row['matmul_ratio']:.2f} of the matmul ceiling)", flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"environment": environment(device, ceilings), "programs": programs,
                                                 "iterations": iterations, "results": rows}, indent=1))

if __name__ == "__main__":
    main()
