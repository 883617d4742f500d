"""What the decode experiments share (a case from its command-line spec is `mlakit.bench.decode.DecodeCase.parse`): its
inputs and default split plan, our kernel's call over them with the plan built beforehand (as the benchmark
times it), variants of a call timed in turns, and the module settings experiments vary."""

import ast
import importlib
from collections.abc import Callable

import torch

from mlakit.bench.decode import DecodeCase, DecodeInputs, make_inputs, time_graph_replay
from mlakit.kernels.triton_decode import DecodePlan, DecodeTuning, plan_decode, triton_mla_decode


def set_setting(setting: str, value: object) -> None:
    """Sets `mlakit.kernels.MODULE.NAME` (`setting` = "MODULE.NAME") to `value`; kernels read such settings when a
    plan prepares its launches. A name the module lacks is refused (an old script's setting, since renamed or
    removed, would otherwise compare identical variants)."""
    module_name, name = setting.rsplit(".", 1)
    module = importlib.import_module(f"mlakit.kernels.{module_name}")
    if not hasattr(module, name):
        raise AttributeError(f"setting: mlakit.kernels.{module_name} has no {name!r} (renamed or removed?)")
    setattr(module, name, value)


def parse_assignment(spec: str) -> tuple[str, object]:
    """(NAME, value) from "NAME=VALUE" (e.g. a setting's "MODULE.NAME=VALUE"), VALUE a Python literal."""
    setting, value = spec.split("=", 1)
    return setting, ast.literal_eval(value)


def setting_variants(arguments: list[str]) -> tuple[str, dict[str, object], list[str]]:
    """A setting experiment's command line, `MODULE.NAME LABEL=VALUE [...] [+MODULE.NAME=VALUE ...] -- REST`: the
    setting, its variants by label and the arguments after "--"; each "+" argument sets another setting for every
    variant, here."""
    setting, arguments = arguments[0], arguments[1:]
    split = arguments.index("--")
    for fixed in [argument[1:] for argument in arguments[:split] if argument.startswith("+")]:
        set_setting(*parse_assignment(fixed))
    variants = dict(parse_assignment(argument) for argument in arguments[:split] if not argument.startswith("+"))
    return setting, variants, arguments[split + 1:]


def case_inputs(case: DecodeCase, e4m3_scores: bool = False, hinted: bool = False) -> tuple[DecodeInputs, DecodePlan]:
    """The case's inputs on the GPU and their split plan (the default one; `case_plan`'s keywords)."""
    inputs = make_inputs(case, torch.device("cuda"))
    return inputs, case_plan(case, inputs, e4m3_scores=e4m3_scores, hinted=hinted)


def case_plan(case: DecodeCase, inputs: DecodeInputs, tuning: DecodeTuning | None = None, e4m3_scores: bool = False,
              hinted: bool = False) -> DecodePlan:
    """A new split plan for the case's inputs (the default tuning unless one is given; `e4m3_scores` as
    `plan_decode`'s; `hinted`: told the batch's cached tokens, its `kv_tokens_hint`). A plan keeps the launches it
    prepared, so variants that must launch differently each need their own."""
    return _plan_for(inputs, case.q_len, case.heads, tuning, e4m3_scores, hinted)


def _plan_for(inputs: DecodeInputs, q_len: int, heads: int, tuning: DecodeTuning | None, e4m3_scores: bool,
              hinted: bool) -> DecodePlan:
    """`plan_decode` over the inputs' lengths, cache dtype and page size (`case_plan`'s keywords)."""
    hint = int(inputs.cache_seqlens.sum()) if hinted else None
    return plan_decode(inputs.cache_seqlens, q_len=q_len, heads=heads, kv_dtype=inputs.kv_cache.dtype,
                       tuning=tuning, e4m3_scores=e4m3_scores, kv_tokens_hint=hint, page_size=inputs.kv_cache.shape[1])


PLAN_FLAGS = ("--e4m3-scores", "--hinted")


def cases_and_plan_flags(arguments: list[str]) -> tuple[list[str], dict[str, bool]]:
    """Case specs and `case_plan`'s keywords from a command line: `--e4m3-scores` (S on 8-bit tensor cores over fp8
    pages), `--hinted` (the plan told the batch's cached tokens); any other `--` flag stops the tool, naming it."""
    unknown = [argument for argument in arguments if argument.startswith("--") and argument not in PLAN_FLAGS]
    if unknown:
        raise SystemExit(f"unknown flag(s) {unknown}: expected {PLAN_FLAGS} and cases")
    specs = [argument for argument in arguments if not argument.startswith("--")]
    return specs, {"e4m3_scores": "--e4m3-scores" in arguments, "hinted": "--hinted" in arguments}


def decode_call(inputs: DecodeInputs, plan: DecodePlan) -> Callable:
    """One decode call of our kernel over `inputs` with `plan`."""
    def call():
        return triton_mla_decode(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                 kv_lora_rank=512, softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale, plan=plan)

    return call


def own_plan_kernel(e4m3_scores: bool = False, hinted: bool = False) -> Callable[[DecodeInputs], Callable]:
    """`check_against_reference`'s factory of our decode: each inputs' call with a plan of its own (with
    `e4m3_scores`, `DecodePlan.e4m3_scores`; `hinted`: the plan told the batch's cached tokens, `plan_decode`'s
    `kv_tokens_hint`)."""
    def factory(inputs: DecodeInputs) -> Callable:
        return decode_call(inputs, _plan_for(inputs, inputs.q.shape[1], inputs.q.shape[2], None, e4m3_scores, hinted))

    return factory


def interleaved_times(variants: list[str], cases: list, call_for: Callable, rounds: int = 3,
                      timing: str = "flushed") -> dict[tuple, list[float]]:
    """Each (case, variant)'s call timed as the benchmark times it (`timing`, as `time_graph_replay` names it),
    `rounds` times, the variants taking turns within every round (run-to-run noise on one case reaches 4%, NOTES.md
    v38). `call_for(variant, case)` returns the call; keys are (case, variant)."""
    times = {(case, variant): [] for case in cases for variant in variants}
    for _ in range(rounds):
        for variant in variants:
            for case in cases:
                times[case, variant].append(time_graph_replay(call_for(variant, case), timing))
    return times
