"""Host preparation of s29a-prepared.sh's trees (after `git archive HEAD src` into each): the share estimate's gain
test removed in build/dev/shares and build/dev/shares-combine, and MERGE_MAX_SPLITS = 1 in build/dev/shares-combine."""
from pathlib import Path

GAIN_TEST = "\n                            & (span * MULTI_WAVE_MIN_GAIN_DEN < best * (MULTI_WAVE_MIN_GAIN_DEN - 1)))"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


for tree in ("shares", "shares-combine"):
    edit(Path(f"build/dev/{tree}/src/mlakit/kernels/decode_split_plan.py"), GAIN_TEST, ")")
edit(Path("build/dev/shares-combine/src/mlakit/kernels/hopper_decode/dispatch.py"), "MERGE_MAX_SPLITS = 4\n",
     "MERGE_MAX_SPLITS = 1\n")
