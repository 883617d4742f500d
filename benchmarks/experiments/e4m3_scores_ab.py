"""Device experiment: fp8 pages with S on 8-bit tensor cores (`DecodePlan.e4m3_scores`: queries rounded to e4m3),
planned without and with the batch's cached tokens as `kv_tokens_hint` (which may give 17-32 query rows a sequence the
narrow kernel's 32-row tile), against fp8 pages with fp16 MMAs (the default) and against bf16 pages holding the same
values, under the benchmark's method (CUDA-graph replay; L2 clean before each, and flushed dirty as do_bench leaves
it), the four taking turns over two rounds. Each case's errors first: e4m3 S (unhinted, hinted) against the reference
on rounded queries and on the queries as given, the default fp8 kernel against the latter. Ceilings measured in the same run; a JSON of every row with --json PATH.

Usage: python benchmarks/experiments/e4m3_scores_ab.py [--json PATH] HEADS,BATCH,SEQLEN|~SEQLEN|ragged,Q_LEN [...]
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
from decode_case import interleaved_times, own_plan_kernel

from mlakit.bench.ceilings import measure_ceilings
from mlakit.bench.decode import DecodeCase, case_cost, check_against_reference, environment, make_inputs
from mlakit.reference import e4m3_rounded_queries

VARIANTS = ("bf16", "fp8", "fp8_e4m3_scores", "fp8_e4m3_scores_hinted")


def errors(inputs) -> dict[str, float]:
    """The e4m3-scores calls' errors (unhinted, hinted) against the reference on rounded queries, the unhinted one's
    on given queries, and the default fp8 call's against the latter, over the first sequences
    (`check_against_reference`'s)."""
    return {"e4m3_vs_rounded_reference": check_against_reference(own_plan_kernel(True), inputs,
                                                                 reference_queries=e4m3_rounded_queries),
            "e4m3_hinted_vs_rounded_reference": check_against_reference(own_plan_kernel(True, hinted=True), inputs,
                                                                        reference_queries=e4m3_rounded_queries),
            "e4m3_vs_reference": check_against_reference(own_plan_kernel(True), inputs),
            "fp8_vs_reference": check_against_reference(own_plan_kernel(False), inputs)}


arguments = sys.argv[1:]
json_path = None
if arguments[:1] == ["--json"]:
    json_path, arguments = Path(arguments[1]), arguments[2:]
device = torch.device("cuda")
ceilings = measure_ceilings(device)
print(f"ceilings: copy {ceilings.copy_gb_per_s:.0f} GB/s, matmul {ceilings.matmul_tflop_per_s:.0f} TFLOP/s", flush=True)
calls, costs = {}, {}
for spec in arguments:
    case = DecodeCase.parse(spec)
    for variant in VARIANTS:
        kv_dtype = "bf16" if variant == "bf16" else "fp8_e4m3"
        variant_case = dataclasses.replace(case, kv_dtype=kv_dtype)
        inputs = make_inputs(variant_case, device)
        calls[spec, variant] = own_plan_kernel(variant.startswith("fp8_e4m3_scores"), variant.endswith("hinted"))(inputs)
        costs[spec, variant] = case_cost(variant_case)
        if variant == "fp8_e4m3_scores_hinted":
            print(f"{spec} errors: " + ", ".join(f"{k} {v:.2e}" for k, v in errors(inputs).items()), flush=True)
rows = []
for timing in ("clean-l2", "flushed"):
    times = interleaved_times(list(VARIANTS), arguments, lambda variant, spec: calls[spec, variant], rounds=2,
                              timing=timing)
    for spec in arguments:
        best = {variant: min(times[spec, variant]) for variant in VARIANTS}
        print(f"{timing:<8} {spec:<18} " + " | ".join(f"{v} {best[v]:6.1f} us" for v in VARIANTS)
              + f" | fp8/bf16 {best['fp8'] / best['bf16']:.3f}, e4m3/bf16 {best['fp8_e4m3_scores'] / best['bf16']:.3f}, "
              f"hinted/bf16 {best['fp8_e4m3_scores_hinted'] / best['bf16']:.3f}, "
              f"hinted/e4m3 {best['fp8_e4m3_scores_hinted'] / best['fp8_e4m3_scores']:.3f}", flush=True)
        for variant in VARIANTS:
            kv_bytes, flops = costs[spec, variant]
            us = best[variant]
            rows.append({"case": spec, "variant": variant, "timing": timing, "time_us": us, "rounds_us": times[spec, variant],
                         "copy_ratio": kv_bytes / (us * 1e-6) / (ceilings.copy_gb_per_s * 1e9),
                         "matmul_ratio": flops / (us * 1e-6) / (ceilings.matmul_tflop_per_s * 1e12)})
if json_path is not None:
    json_path.write_text(json.dumps({"environment": environment(device, ceilings), "results": rows}, indent=1))
