"""Which seesaw variant a 128-head serving step compiles that the warm-up did not (s44b / s44c found one): runs
tests/test_warmup.py's step loop at 128 heads x 2 tokens (bf16), then prints each missed key's fields against the
warm-up's nearest key of the same kernel, and the seesaw launches the steps made (caller, flags, grid)."""
import ast
import sys
import traceback

sys.path[:0] = ["tests", "src"]
import test_warmup as tw  # noqa: E402
from mlakit.kernels.hopper_decode import dispatch  # noqa: E402

snapshots, launches = [], []
taken = tw.compiled_variants


def recording_variants():
    snapshots.append(taken())
    return snapshots[-1]


seesaw = dispatch.SEESAW


def recording_seesaw(key, grid, args, constants):
    caller = next((f.name for f in reversed(traceback.extract_stack()) if f.name in ("mla_decode", "mla_extend")), "?")
    flags = tuple(constants[k] for k in ("MERGE", "SHARES_TO_COMBINE", "EVICT_FIRST", "LEFT_SCORES_AHEAD"))
    launches.append((len(snapshots), caller, flags, grid, args[0].shape))
    seesaw(key, grid, args, constants)


tw.compiled_variants = recording_variants
dispatch.SEESAW = recording_seesaw
try:
    tw.test_after_warm_up_no_step_compiles_a_kernel("bf16", 1, 1)
    print("no variant missed")
except AssertionError as error:
    print("missed:", str(error)[:200])


def fields(key):
    signature = key[: key.index("]{") + 1]
    return ast.literal_eval(signature)


before, after = snapshots[0], snapshots[-1]
for name, keys in after.items():
    for key in keys - before[name]:
        new = fields(key)
        ranked = sorted(before[name], key=lambda old: sum(a != b for a, b in zip(fields(old), new)))
        for old in ranked[:2]:
            diff = [(i, a, b) for i, (a, b) in enumerate(zip(fields(old), new)) if a != b]
            print(name, "differs from a warm-up key in", diff)
seen = {}
for phase, caller, flags, grid, q_shape in launches:
    row = ("warm-up" if phase == 0 else "steps", caller, flags)
    seen.setdefault(row, []).append((grid, tuple(q_shape)))
for row, examples in seen.items():
    print(*row, len(examples), "launches, e.g.", examples[:3])
