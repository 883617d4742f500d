"""Device experiment (issue 22, fp8 prefill): in one process, on the same inputs (`bench prefill`'s attention part),
the bf16 kernel and the fp8 kernel of the source tree on PYTHONPATH over tile settings, timed sustained
(`timing.sustained_ms`), plus the operands' rounding (`quantize_prefill_operands`) alone; each fp8 setting's error
against the bf16 kernel's output. Run it under two trees to compare kernel versions.

    PYTHONPATH=src python benchmarks/experiments/fp8_prefill_variants.py --case 128,1,8192,0 --stages 2,3
"""

from __future__ import annotations

import click
import torch

from mlakit.bench.prefill import SOFTMAX_SCALE, PrefillCase, make_attention_inputs
from mlakit.bench.timing import sustained_ms
from mlakit.kernels.triton_prefill import PrefillTuning, triton_mha_prefill
from mlakit.prefill import fp8


@click.command()
@click.option("--case", "case_specs", multiple=True, required=True, help="heads,batch,new_tokens,prefix")
@click.option("--stages", default="2,3", show_default=True, help="fp8 ring depths to try with 128-key tiles")
def main(case_specs: tuple[str, ...], stages: str) -> None:
    print(f"{torch.cuda.get_device_name()} {fp8.__file__}")
    for spec in case_specs:
        case = PrefillCase.parse(spec)
        x = make_attention_inputs(case, torch.device("cuda"))
        common = dict(max_q_len=case.new_tokens, causal=True, softmax_scale=SOFTMAX_SCALE)

        def bf16() -> torch.Tensor:
            return triton_mha_prefill(x.q, x.k_nope, x.k_pe, x.v, x.cu_seqlens_q, x.cu_seqlens_k, **common)[0]

        expected = bf16().float()
        bf16_ms = sustained_ms(bf16)
        print(f"{case.label}: bf16 {bf16_ms:.3f} ms")
        operands = fp8.quantize_prefill_operands(x.q, x.k_nope, x.k_pe, x.v, x.cu_seqlens_k)
        quantize_ms = sustained_ms(lambda: fp8.quantize_prefill_operands(x.q, x.k_nope, x.k_pe, x.v, x.cu_seqlens_k))
        print(f"{case.label}: rounding the operands {quantize_ms:.3f} ms")
        for depth in map(int, stages.split(",")):
            tuning = PrefillTuning(128, 128, 4, depth, kernel="hopper_persistent")

            def run(tuning: PrefillTuning = tuning) -> torch.Tensor:
                return fp8.fp8_mha_prefill(operands, x.cu_seqlens_q, tuning=tuning, **common)[0]

            error = float((run().float() - expected).norm() / expected.norm())
            ms = sustained_ms(run)
            print(f"{case.label}: fp8 n128 s{depth} {ms:.3f} ms, {bf16_ms / ms:.3f}x bf16, error vs bf16 {error:.2e}")


if __name__ == "__main__":
    main()
