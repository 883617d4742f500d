"""Hopper (SM90) MLA decode split kernels in Gluon, with the work split by warpgroup.

Drop-ins for the portable split kernel on 64-row tiles (same split plan, partial buffers
and combine). Two warpgroups work on 64 query rows and one split of a sequence's KV at a
time (one program per such unit, or, for the persistent seesaw kernel, one program per SM
taking units in turn); Q and two stages of the 64-token K tile (latent + rope) live in swizzled
shared memory, and V is the latent part of the same tile. Three kernels:

- `mla_decode_hopper_seesaw_kernel`, for 16-bit pages holding whole tiles (page size a
  multiple of 64): the two warpgroups take turns over pairs of tiles. Warpgroup 0 computes S
  and the softmax of the even tiles, warpgroup 1 those of the odd tiles (while warpgroup 0's
  softmax runs), against one running max handed over through shared memory (on named barriers:
  the giving warpgroup arrives and goes on, the taking one waits); each owns half of
  the output columns, multiplies its own P from registers and the other's from shared memory.
  Tiles arrive as two halves of the latent columns, one TMA copy and one barrier each, and the
  rope on a third (S starts on the first half; a split's partial 16-bit last tile waits for all of
  them, to zero its rows past the end); each half is reloaded as soon as its last reader is done
  with it. P goes into the tile's rope columns, which S no longer needs. For batches that fill
  the GPU (few split sequences) the program that finishes a sequence's last split merges its
  partials, but for an equal-share plan's, whose merges the combine launched behind the kernel takes
  (`dispatch.SHARE_MERGES_BY_COMBINE`).
  It also takes fp8 (e4m3) pages with one per-tensor scale at 512 + 64 widths: each chunk's fp8
  box lands in the first half of the chunk's 16-bit place and is converted there to fp16, half a
  tile at a time, by the warpgroup whose S reads it first (rows past the split's end zeroed as they
  go); its MMAs then run in fp16, query rows scaled per row into fp16's range. Over fp8 pages a program asks L2
  for its next unit's query rows and first tiles a tile pair before this unit's end;
- `mla_decode_hopper_fp8_kernel`, for other fp8 (e4m3) pages with one per-tensor scale (any size):
  warpgroup 0 computes S for the whole tile, the softmax, and writes P and the row rescale
  factors to shared memory; both warpgroups then do P . V for half of the latent columns each.
  The value warpgroup gathers the tile three ahead into registers, converts the one two ahead
  to the query's dtype and stores it into the stage it frees (the scale is folded into the
  scores and the output);
- `mla_decode_hopper_split_kernel`, for other 16-bit pages: rows gathered with `cp.async`
  one tile ahead (tokens past the split's end zero-filled), S split between the
  warpgroups over the tile's tokens, P . V over half of the latent columns each.

Otherwise queries and KV share one 16-bit dtype. The latent width is 64, 128, 256 or 512
(the seesaw kernel needs two chunks: 64 goes to the cp.async kernel), the rope width 16,
32 or 64. The CPU interpreter does not run Gluon: the portable kernel serves there and
everywhere else.

The modules: `dispatch` (host side: which kernel takes a call, and `prepare`), `descriptors` (the seesaw's TMA
descriptors), the kernels `split_kernel`, `fp8_split_kernel` and `seesaw_kernel` (with the seesaw's warpgroups in
`seesaw_partitions`, its loads in `seesaw_loads`, its fp8 conversions in `seesaw_fp8` and its L2 prefetch of the next
unit in `next_unit_prefetch`), and what several of them
share: `constants`, `tile_helpers`, `e4m3_words`. A setting such as `dispatch.MERGE_MAX_SPLITS` is read where it is
defined: an experiment changes it there.
"""
from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.kernels.hopper_decode.constants import BLOCK_M, NUM_WARPS
from mlakit.kernels.hopper_decode.descriptors import chunk_descriptors
from mlakit.kernels.hopper_decode.dispatch import (SEESAW, Merges, SplitPass, partial_dtype, prepare,
                                                   rows_are_contiguous, supports)
from mlakit.kernels.hopper_decode.fp8_split_kernel import mla_decode_hopper_fp8_kernel
from mlakit.kernels.hopper_decode.seesaw_kernel import mla_decode_hopper_seesaw_kernel
from mlakit.kernels.hopper_decode.split_kernel import mla_decode_hopper_split_kernel

__all__ = [
    "BLOCK_M",
    "FP8_DTYPE",
    "Merges",
    "NUM_WARPS",
    "SEESAW",
    "SplitPass",
    "chunk_descriptors",
    "mla_decode_hopper_fp8_kernel",
    "mla_decode_hopper_seesaw_kernel",
    "mla_decode_hopper_split_kernel",
    "partial_dtype",
    "prepare",
    "rows_are_contiguous",
    "supports",
]
