"""fp8 (e4m3) values held as int32 words of four, converted to 16-bit pairs by inline PTX and stored (the fp8 split
kernel's tiles, the seesaw's in-place conversions)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


def _e4m3_pair_to_bf16_ptx(out: str, byte_selector: str) -> str:
    """PTX: two e4m3 bytes of $2 (picked by `byte_selector`) as a bf16 pair in `out`. The byte s.eeee.mmm
    placed by prmt and shifted by 4 is the bf16 s.0000eeee.mmm0000; times 2^120 (0x7B80, in k) it moves
    the exponent bias from 127 to 7: exact for every finite value, subnormals included (the NaN
    byte s.1111.111, which no quantizer writes, comes out as +-480)."""
    return (f"prmt.b32 t, $2, 0, {byte_selector};\nshr.b32 u, t, 4;\nand.b32 u, u, 0x07F007F0;\n"
            f"and.b32 t, t, 0x80008000;\nor.b32 t, t, u;\nmul.rn.bf16x2 {out}, t, k;\n")


# One int32 word of four e4m3 values in, two 16-bit pairs out.
_E4M3_TO_BF16_PAIRS = gl.constexpr("{\n.reg .b32 t, u, k;\nmov.b32 k, 0x7B807B80;\n" + _e4m3_pair_to_bf16_ptx("$0", "0x1404")
                                   + _e4m3_pair_to_bf16_ptx("$1", "0x3424") + "}")
_E4M3_TO_F16_PAIRS = gl.constexpr("""{
.reg .b16 lo, hi;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}""")


@gluon.jit
def _store_words_converted(words, pairs_dst, dtype: gl.constexpr):
    """fp8 words `[rows, n]` as `dtype` (16-bit) pairs into the int32 `[rows, 2n]` view `pairs_dst`."""
    asm: gl.constexpr = _E4M3_TO_BF16_PAIRS if dtype == gl.bfloat16 else _E4M3_TO_F16_PAIRS
    low, high = gl.inline_asm_elementwise(asm, "=r,=r,r", [words], dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    pairs_dst.store(gl.reshape(gl.join(low, high), [words.shape[0], 2 * words.shape[1]]))
