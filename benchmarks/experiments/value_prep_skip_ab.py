"""Device experiment: `e4m3_scores_ab.py` with the seesaw's per-tile value preparation skipped (v64's conversion of
the fp8 values to fp16 in place; on the v66 patches' trees the transposes into tokens-contiguous rows; on v67's the
byte permutes and conversions of the register operand, its words then taken as fp16 bits as they are; on v68's the
converter warpgroup's conversions, its waits and arrivals kept): the time
the 128-head fp8 kernel would take were that work free. The values are then wrong (the output is meaningless, the
errors printed are too); only the times count (NOTES.md "What the value preparation costs", "v67 / v67b measured").

Usage, from benchmarks/experiments on a GPU machine:
    PYTHONPATH=SRC python value_prep_skip_ab.py skip|keep [--json PATH] HEADS,BATCH,SEQLEN|ragged,Q_LEN [...]
"""

import runpy
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

from mlakit.kernels import hopper_decode as hd
from mlakit.kernels.gluon_compat import thread_barrier


@gluon.jit
def _fence_and_sync_only(buffer, part: gl.constexpr, valid_rows):
    """Stands in for any of the preparations below (each takes a buffer, a constexpr part of it and the valid rows):
    their fence and barrier without their work."""
    fence_async_shared()
    thread_barrier()


# two tokens' words in, their four halves each out twice: the operand's registers filled without permutes or conversions
_WORDS_AS_F16 = gl.constexpr("""{
mov.b32 {$0, $1}, $8;
mov.b32 {$2, $3}, $9;
mov.b32 {$4, $5}, $8;
mov.b32 {$6, $7}, $9;
}""")

mode = sys.argv.pop(1)
if mode == "skip":
    if hasattr(hd, "_seesaw_convert_partition"):
        hd._convert_block_in_place = _fence_and_sync_only
    elif hasattr(hd, "_TOKEN_PAIRS_TO_F16"):
        hd._TOKEN_PAIRS_TO_F16 = _WORDS_AS_F16
    elif hasattr(hd, "_transpose_half_values"):
        hd._transpose_half_values = _fence_and_sync_only
    else:  # today's package: the seesaw's partitions look the conversion up in their module
        from mlakit.kernels.hopper_decode import seesaw_partitions

        seesaw_partitions._convert_four_blocks_in_place = _fence_and_sync_only
sys.argv[0] = "e4m3_scores_ab.py"
sys.path.insert(0, ".")
runpy.run_path("e4m3_scores_ab.py", run_name="__main__")
