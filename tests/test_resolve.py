"""resolve(): every rule of registry/resolve.py, checked against every registered backend.

Devices are hypothetical (`DeviceInfo.from_arch`), so vendor packages that are missing on
this machine do not block a plan; one group of tests makes the device local to check that
missing packages are refused there.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch

from mlakit import ConfigError, DeviceInfo, MLAShape, ServingConfig, resolve
from mlakit.prefill.metadata import PrefillMetadata
from mlakit.registry import BackendRecord, PageSizeRule, WorkspaceInputs, all_records, backend_names, get_backend
from mlakit.registry.catalog import _REGISTRY, PrefillKernel, RegisteredBackend, missing_adapter
from mlakit.registry.records import KV_DTYPES

ARCHS = ("cpu", "xpu", "sm80", "sm90", "sm100")
RECORDS = all_records()
BY_NAME = {r.name: r for r in RECORDS}
DECODE_RECORDS = [r for r in RECORDS if "decode" in r.phases]
V3 = MLAShape.preset("deepseek-v3")


def dev(arch: str) -> DeviceInfo:
    return DeviceInfo.from_arch(arch)


def home_arch(record: BackendRecord) -> str:
    """The first of ARCHS (cpu, xpu, sm80, sm90, sm100) the record runs on."""
    for arch in ARCHS:
        if not record.hardware_problems(dev(arch)):
            return arch
    pytest.skip(f"{record.name} runs on none of {ARCHS}")


def ids(records):
    return [r.name for r in records]


def plan_for(arch: str = "sm90", shape: MLAShape = V3, **config):
    return resolve(ServingConfig(**config), shape, dev(arch))


def refusal(arch: str = "sm90", shape: MLAShape = V3, **config) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(ServingConfig(**config), shape, dev(arch))
    return str(info.value)


def fits_alone(name: str, arch: str, shape: MLAShape = V3, phase: str = "decode", **config) -> bool:
    try:
        resolve(ServingConfig(**{f"{phase}_backend": name}, **config), shape, dev(arch))
    except ConfigError:
        return False
    return True


def listed_alternatives(message: str, phase: str) -> list[str]:
    match = re.search(rf"backends that fit this {phase} configuration: (.*)$", message, re.MULTILINE)
    assert match, f"no list of alternatives in:\n{message}"
    return [n.strip() for n in match.group(1).split(",")]


def note(plan, prefix: str) -> str:
    found = [n for n in plan.notes if n.startswith(prefix)]
    assert len(found) == 1, f"expected one note starting {prefix!r}, notes: {plan.notes}"
    return found[0]


# Test-only backends. Each is registered for one test through monkeypatch (removed when the test
# ends), under a "zz_" name that must not be registered already, and ranked after every real backend.


def _fake_decode(q, kv_cache, block_table, cache_seqlens, *, kv_lora_rank, softmax_scale, kv_scale):
    """A decode kernel for test-only records: the reference backend's."""
    return get_backend("reference").decode(
        q, kv_cache, block_table, cache_seqlens, kv_lora_rank=kv_lora_rank, softmax_scale=softmax_scale, kv_scale=kv_scale
    )


def _fake_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_b_weight: torch.Tensor,
    meta: PrefillMetadata,
    *,
    softmax_scale: float,
    kv_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill kernel (an adapter, for resolve()) for test-only records: the reference backend's."""
    return get_backend("reference").prefill(q, kv_cache, kv_b_weight, meta, softmax_scale=softmax_scale, kv_scale=kv_scale)


def _fake_record(
    name: str,
    sizes: set[int] | None,
    preferred: int,
    phases: set[str],
    *,
    device_kinds: set[str] = frozenset({"xpu"}),
    kv_dtypes: set[str] = frozenset({"bf16"}),
    **fields,
) -> BackendRecord:
    """A test-only record (XPU and bf16 unless told), ranked after every real backend, so "auto" never picks
    it over one; `sizes` None takes any page size."""
    return BackendRecord(
        name=name,
        summary="test-only record",
        phases=frozenset(phases),
        device_kinds=frozenset(device_kinds),
        page_sizes=PageSizeRule(sizes=None if sizes is None else frozenset(sizes)),
        kv_dtypes=frozenset(kv_dtypes),
        auto_rank=10_000,
        preferred_page_size=preferred,
        **fields,
    )


def register_fake(monkeypatch, record: BackendRecord, prefill_adapter: bool = True) -> str:
    """Registers `record` for the current test only: a decode kernel when it lists decode, and a prefill
    kernel when it lists prefill (unless `prefill_adapter` is False: a prefill mlakit cannot run)."""
    all_records()  # loads the built-in backends before the registry is patched
    assert record.name.startswith("zz_") and record.name not in _REGISTRY, f"test backend {record.name!r} collides or leaked"
    decode = _fake_decode if "decode" in record.phases else None
    prefill = _fake_prefill if "prefill" in record.phases and prefill_adapter else None
    monkeypatch.setitem(_REGISTRY, record.name, RegisteredBackend(record, decode, None, prefill))
    return record.name


@pytest.fixture
def adapted(monkeypatch):
    """Registers, for one test, a stand-in for a vendor backend as if mlakit had an adapter for its prefill
    kernel: the vendor's record (hardware, page sizes, KV dtypes, workspace) under a "zz_" name, with the
    phases given (prefill only by default) and a prefill kernel. Returns a function vendor -> the name."""

    def make(vendor: str, phases: tuple[str, ...] = ("prefill",), **changes) -> str:
        record = dataclasses.replace(
            BY_NAME[vendor],
            name=f"zz_{vendor}_{'_'.join(sorted(phases))}",
            phases=frozenset(phases),
            auto_rank=10_000,
            **changes,
        )
        return register_fake(monkeypatch, record)

    return make


def test_fake_prefill_kernel_has_the_prefill_kernel_signature():
    def parameters(fn):
        return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]

    assert parameters(_fake_prefill) == parameters(PrefillKernel.__call__)[1:]  # without self
    assert parameters(_fake_prefill) == parameters(get_backend("reference").prefill)


@pytest.fixture(autouse=True)
def _test_backends_do_not_outlive_their_test():
    yield  # torn down after monkeypatch has undone the test's registrations
    leaked = [name for name in _REGISTRY if name.startswith("zz_")]
    assert not leaked, f"test-only backends left registered: {leaked}"


def test_registry_holds_the_documented_backends_in_auto_order():
    names = backend_names()
    assert set(names) >= {"reference", "flashmla", "flashinfer_mla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "intel_xpu"}
    # reference fits every configuration, so auto never reaches what ranks past it: the opt-in triton_fp8
    assert names[names.index("reference"):] == ["reference", "triton_fp8"]
    ranks = [BY_NAME[n].auto_rank for n in names]
    assert ranks == sorted(ranks)


# --- explicit backends are kept or refused, never swapped -------------------------------------------------


def _wrong_arch_cases():
    cases = []
    for record in RECORDS:
        for arch in ARCHS:
            if record.hardware_problems(dev(arch)):
                cases.append(pytest.param(record.name, arch, id=f"{record.name}-on-{arch}"))
    return cases


@pytest.mark.parametrize("name, arch", _wrong_arch_cases())
@pytest.mark.parametrize("field", ["attention_backend", "decode_backend"])
def test_explicit_backend_on_wrong_hardware_is_refused_with_reason_and_alternatives(name, arch, field):
    record = BY_NAME[name]
    message = refusal(arch, **{field: name})
    assert f"decode_backend {name!r} cannot serve this configuration on {arch}" in message
    assert record.hardware_problems(dev(arch))[0] in message
    alternatives = listed_alternatives(message, "decode")
    assert name not in alternatives
    assert alternatives == [r.name for r in RECORDS if fits_alone(r.name, arch)]
    assert "reference" in alternatives


def test_explicit_backend_that_cannot_be_captured_is_refused_not_swapped(monkeypatch):
    name = register_fake(monkeypatch, _fake_record("zz_eager_only", None, 64, {"prefill", "decode"}, device_kinds={"cuda"}))
    message = refusal("sm90", attention_backend=name, cuda_graphs=True)
    assert f"decode_backend '{name}'" in message
    assert "cannot be captured in a CUDA graph" in message
    alternatives = listed_alternatives(message, "decode")
    assert alternatives == [r.name for r in RECORDS if fits_alone(r.name, "sm90", cuda_graphs=True)]
    assert "flashmla" in alternatives and "reference" in alternatives and name not in alternatives
    assert all(BY_NAME[n].cuda_graphs for n in alternatives)


def test_unset_cuda_graphs_stay_off_for_a_backend_that_cannot_be_captured(monkeypatch):
    name = register_fake(monkeypatch, _fake_record("zz_eager_only", None, 64, {"prefill", "decode"}, device_kinds={"cuda"}))
    plan = plan_for("sm90", attention_backend=name)
    assert plan.cuda_graphs is False
    assert f"cuda_graphs: off (auto: {name} cannot be captured)" in plan.notes


@pytest.mark.parametrize(
    "arch, prefill, reason, alternatives",
    [
        ("xpu", "triton", "runs on cuda, not on xpu", ["reference"]),
        ("sm90", "trtllm_mla", "needs SM10x, the device is sm90", ["triton", "reference", "triton_fp8"]),
    ],
)
def test_explicit_prefill_backend_on_wrong_hardware_is_refused(adapted, arch, prefill, reason, alternatives):
    if prefill != "triton":
        prefill = adapted(prefill)  # the vendor's hardware rule, with a prefill kernel mlakit can run
    message = refusal(arch, prefill_backend=prefill)
    assert f"prefill_backend {prefill!r} cannot serve this configuration on {arch}:\n  - {reason}\nbackends that fit" in message
    assert listed_alternatives(message, "prefill") == alternatives


def test_explicit_pair_sharing_no_kv_dtype_is_refused(adapted):
    prefill = adapted("flashinfer_mla")  # bf16/fp16, against tokenspeed's fp8-only cache
    message = refusal("sm100", decode_backend="tokenspeed_mla", prefill_backend=prefill)
    assert f"prefill_backend {prefill!r}" in message
    assert "shares no KV dtype with tokenspeed_mla (['bf16', 'fp16'] vs ['fp8_e4m3'])" in message
    assert listed_alternatives(message, "prefill") == ["triton", "reference"]


def test_explicit_pair_sharing_no_page_size_is_refused(adapted):
    prefill = adapted("trtllm_mla", page_sizes=PageSizeRule(sizes=frozenset({32})), preferred_page_size=32)
    message = refusal("sm100", decode_backend="flashmla", prefill_backend=prefill)
    assert f"prefill_backend {prefill!r}" in message
    assert "shares no page size with flashmla ({32} vs {64})" in message
    assert listed_alternatives(message, "prefill") == ["triton", "reference"]


def test_fp8_prefill_is_opt_in_and_fits_the_hopper_kernels_widths():
    from mlakit.kernels import hopper_prefill

    record = BY_NAME["triton_fp8"]
    assert (record.qk_nope_dims, record.rope_dims, record.v_dims) == (
        hopper_prefill.NOPE_DIMS, hopper_prefill.ROPE_DIMS, hopper_prefill.V_DIMS)
    assert record.attention_dtype == "fp8_e4m3" and record.describe_capabilities()["attention_dtype"] == "fp8_e4m3"
    assert plan_for("sm90").prefill_backend == "triton"  # auto keeps the bf16 kernel
    plan = plan_for("sm90", prefill_backend="triton_fp8", kv_cache_dtype="fp8_e4m3")
    assert (plan.prefill_backend, plan.decode_backend, plan.kv_cache_dtype) == ("triton_fp8", "triton", "fp8_e4m3")
    assert "prefill backend: triton_fp8 (as configured; its attention computes in fp8_e4m3)" in plan.notes
    assert plan_for("sm90", MLAShape.preset("minicpm3"), prefill_backend="triton_fp8").prefill_backend == "triton_fp8"
    narrow = dataclasses.replace(V3, qk_nope_head_dim=32, v_head_dim=48)
    message = refusal("sm90", narrow, prefill_backend="triton_fp8")
    assert "prefill_backend 'triton_fp8' cannot serve this configuration on sm90" in message
    assert "qk_nope_head_dim 32 is not supported; allowed: [64, 128]" in message
    assert "v_head_dim 48 is not supported; allowed: [64, 128]" in message
    assert "needs SM9x, the device is sm80" in refusal("sm80", prefill_backend="triton_fp8")


NO_PREFILL_ADAPTER = [r for r in RECORDS if missing_adapter(r.name, "prefill")]


def test_only_mlakits_own_backends_have_prefill_kernels():
    assert {r.name for r in RECORDS if get_backend(r.name).prefill is not None} == {"triton", "triton_fp8", "reference"}
    assert {"flashinfer_mla", "trtllm_mla", "tokenspeed_mla"} <= {r.name for r in NO_PREFILL_ADAPTER}
    assert all("prefill" in r.phases for r in NO_PREFILL_ADAPTER)


@pytest.mark.parametrize("record", NO_PREFILL_ADAPTER, ids=ids(NO_PREFILL_ADAPTER))
@pytest.mark.parametrize("with_decode", [False, True])
def test_vendor_prefill_without_an_adapter_named_as_prefill_backend_is_refused(record, with_decode):
    """The record states prefill, but mlakit cannot run it: refused at start-up, not at the first request."""
    arch = home_arch(record)
    config = {"prefill_backend": record.name}
    if with_decode:
        config["decode_backend"] = record.name
    with pytest.raises(ConfigError, match="no adapter for its prefill kernel") as info:
        resolve(ServingConfig(**config), V3, dev(arch))
    message = str(info.value)
    assert (
        f"prefill_backend {record.name!r} cannot serve this configuration on {arch}:\n"
        "  - states prefill, but mlakit has no adapter for its prefill kernel yet\n"
    ) in message
    assert listed_alternatives(message, "prefill") == ["triton", "reference"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("record", RECORDS, ids=ids(RECORDS))
@pytest.mark.parametrize("page_size", [None, 16, 32, 64])
def test_explicit_choices_are_kept_exactly_and_fit(record, arch, page_size):
    """Whenever a plan comes back, it is the backend asked for, with settings both backends take."""
    phases = ["decode"] + (["prefill"] if "prefill" in record.phases else [])
    for phase in phases:
        try:
            plan = plan_for(arch, **{f"{phase}_backend": record.name}, page_size=page_size)
        except ConfigError as exc:
            assert repr(record.name) in str(exc)
            if phase == "prefill" and (why := missing_adapter(record.name, "prefill")):
                assert why in str(exc)
            continue
        assert getattr(plan, f"{phase}_backend") == record.name
        if page_size is not None:
            assert plan.page_size == page_size
        for chosen_phase in ("prefill", "decode"):
            chosen_record = BY_NAME[getattr(plan, f"{chosen_phase}_backend")]
            assert not chosen_record.hardware_problems(plan.device)
            assert chosen_record.page_sizes.accepts(plan.page_size)
            assert plan.kv_cache_dtype in chosen_record.kv_dtypes_for(chosen_phase)
        assert "prefill" in BY_NAME[plan.prefill_backend].phases
        assert "decode" in BY_NAME[plan.decode_backend].phases


# --- page sizes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, backend, page_size, allowed",
    [
        ("sm90", "flashmla", 32, "{64}"),
        ("sm100", "trtllm_mla", 16, "{32, 64}"),
        ("xpu", "intel_xpu", 8, "{16, 32, 64, 128}"),
        ("sm100", "cutedsl_mla", 16, "{32, 64}"),
        ("sm100", "tokenspeed_mla", 128, "{32, 64}"),
    ],
)
def test_explicit_page_size_the_backend_cannot_take_names_allowed_sizes(arch, backend, page_size, allowed):
    message = refusal(arch, attention_backend=backend, page_size=page_size)
    assert f"decode_backend {backend!r}" in message
    assert f"page_size {page_size} is not supported; allowed page sizes: {allowed}" in message


FIXED_PAGE_RECORDS = [r for r in RECORDS if r.page_sizes.sizes is not None]


@pytest.mark.parametrize("record", FIXED_PAGE_RECORDS, ids=ids(FIXED_PAGE_RECORDS))
def test_every_fixed_page_size_backend_refuses_other_sizes_and_keeps_its_own(record):
    arch = home_arch(record)
    bad = next(p for p in (8, 16, 32, 48, 96) if not record.page_sizes.accepts(p))
    message = refusal(arch, attention_backend=record.name, page_size=bad)
    assert f"page_size {bad} is not supported; allowed page sizes: {record.page_sizes.describe()}" in message
    for good in sorted(record.page_sizes.sizes):
        plan = plan_for(arch, attention_backend=record.name, page_size=good)
        assert plan.page_size == good
        assert not any(n.startswith("page_size:") for n in plan.notes)


@pytest.mark.parametrize("record", DECODE_RECORDS, ids=ids(DECODE_RECORDS))
def test_unset_page_size_fits_both_backends_and_is_noted(record):
    plan = plan_for(home_arch(record), attention_backend=record.name)
    assert plan.decode_backend == record.name
    for chosen in (plan.decode_backend, plan.prefill_backend):
        assert BY_NAME[chosen].page_sizes.accepts(plan.page_size), (chosen, plan.page_size)
    text = note(plan, "page_size:")
    assert text.startswith(f"page_size: {plan.page_size} (chosen")
    assert record.name in text and record.page_sizes.describe() in text


@pytest.fixture
def fake_xpu_pair(monkeypatch):
    """Two test-only XPU backends (removed after the test): decode-only {48, 96} preferring 96,
    prefill-only {16, 48} preferring 16, with a prefill kernel. The only size both take is 48."""
    decode = register_fake(monkeypatch, _fake_record("zz_decode96", {48, 96}, 96, {"decode"}))
    prefill = register_fake(monkeypatch, _fake_record("zz_prefill48", {16, 48}, 16, {"prefill"}))
    return decode, prefill


def test_unset_page_size_follows_the_decode_backends_preference(fake_xpu_pair):
    decode, prefill = fake_xpu_pair
    alone = plan_for("xpu", decode_backend=decode)
    assert (alone.prefill_backend, alone.page_size) == ("reference", 96)
    message = refusal("xpu", decode_backend=decode, prefill_backend=prefill, page_size=96)
    assert "prefill_backend 'zz_prefill48'" in message
    assert "page_size 96 is not supported; allowed page sizes: {16, 48}" in message


def test_unset_page_size_is_one_both_backends_take_even_outside_the_preference_list(fake_xpu_pair):
    decode, prefill = fake_xpu_pair
    paired = plan_for("xpu", decode_backend=decode, prefill_backend=prefill)
    assert paired.page_size == 48
    assert "page_size: 48 (chosen" in note(paired, "page_size:")


# --- decode-only backends get a prefill backend -----------------------------------------------------------


DECODE_ONLY = [r for r in RECORDS if "prefill" not in r.phases]


def test_the_documented_decode_only_backends_are_decode_only():
    assert {"flashmla", "cutedsl_mla", "intel_xpu"} <= {r.name for r in DECODE_ONLY}
    assert BY_NAME["cutedsl_mla"].prefill_fallback == "trtllm_mla"


@pytest.mark.parametrize("record", DECODE_ONLY, ids=ids(DECODE_ONLY))
def test_decode_only_backend_gets_an_automatic_prefill_backend_noted(record):
    plan = plan_for(home_arch(record), attention_backend=record.name)
    assert plan.decode_backend == record.name
    assert plan.prefill_backend != record.name
    assert "prefill" in BY_NAME[plan.prefill_backend].phases
    text = note(plan, "prefill backend:")
    assert text.startswith(f"prefill backend: {plan.prefill_backend} (")
    assert f"{record.name} is decode-only" in text
    assert missing_adapter(plan.prefill_backend, "prefill") is None
    if record.prefill_fallback is not None:
        why_not = missing_adapter(record.prefill_fallback, "prefill")
        if why_not is None:
            assert plan.prefill_backend == record.prefill_fallback
            assert "declared prefill fallback" in text
        else:
            assert plan.prefill_backend != record.prefill_fallback
            passed_over = f"{record.name}'s prefill fallback {record.prefill_fallback} does not fit ({why_not}); choosing automatically"
            assert passed_over in plan.notes


@pytest.mark.parametrize(
    "arch, backend, prefill",
    [("sm90", "flashmla", "triton"), ("sm100", "cutedsl_mla", "triton"), ("xpu", "intel_xpu", "reference")],
)
def test_decode_only_backend_prefill_choice_per_device(arch, backend, prefill):
    plan = plan_for(arch, attention_backend=backend)
    assert (plan.prefill_backend, plan.decode_backend) == (prefill, backend)


def test_cutedsl_fallback_without_a_prefill_adapter_is_passed_over_with_a_note():
    plan = plan_for("sm100", attention_backend="cutedsl_mla")
    assert (plan.prefill_backend, plan.decode_backend) == ("triton", "cutedsl_mla")
    assert (
        "cutedsl_mla's prefill fallback trtllm_mla does not fit "
        "(states prefill, but mlakit has no adapter for its prefill kernel yet); choosing automatically"
    ) in plan.notes
    text = note(plan, "prefill backend:")
    assert text.startswith("prefill backend: triton (automatic, cutedsl_mla is decode-only: highest-priority backend that fits sm100)")
    assert "this is its declared prefill fallback" not in text


@pytest.mark.parametrize("adapter", [True, False], ids=["fallback-with-adapter", "fallback-without-adapter"])
def test_declared_prefill_fallback_is_taken_only_when_mlakit_can_run_it(monkeypatch, adapter):
    fallback = register_fake(monkeypatch, _fake_record("zz_fallback", None, 64, {"prefill"}), prefill_adapter=adapter)
    decode = register_fake(monkeypatch, _fake_record("zz_decode_only", None, 64, {"decode"}, prefill_fallback=fallback))
    plan = plan_for("xpu", attention_backend=decode)
    text = note(plan, "prefill backend:")
    if adapter:
        assert (plan.prefill_backend, plan.decode_backend) == (fallback, decode)
        assert text == f"prefill backend: {fallback} ({decode} is decode-only; this is its declared prefill fallback)"
        assert not any("choosing automatically" in n for n in plan.notes)
    else:
        assert (plan.prefill_backend, plan.decode_backend) == ("reference", decode)
        assert text.startswith(f"prefill backend: reference (automatic, {decode} is decode-only: highest-priority backend")
        assert (
            f"{decode}'s prefill fallback {fallback} does not fit "
            "(states prefill, but mlakit has no adapter for its prefill kernel yet); choosing automatically"
        ) in plan.notes


@pytest.mark.parametrize("record", DECODE_ONLY, ids=ids(DECODE_ONLY))
@pytest.mark.parametrize("with_decode", [False, True])
def test_decode_only_backend_named_as_prefill_backend_is_an_error(record, with_decode):
    config = {"prefill_backend": record.name}
    if with_decode:
        config["decode_backend"] = record.name
    message = refusal(home_arch(record), **config)
    assert f"prefill_backend {record.name!r} cannot serve" in message
    assert "does not do prefill (it is decode only" in message
    if record.prefill_fallback:
        assert f"its declared prefill fallback is {record.prefill_fallback}" in message
        runnable = missing_adapter(record.prefill_fallback, "prefill") is None
        assert (record.prefill_fallback in listed_alternatives(message, "prefill")) == runnable


# --- speculative decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, backend, drafts, limit",
    [
        ("xpu", "intel_xpu", 1, "no speculative decoding (1 query token per sequence)"),
        ("sm100", "cutedsl_mla", 1, "no speculative decoding (1 query token per sequence)"),
        ("sm100", "tokenspeed_mla", 8, "at most 8 query tokens per sequence (7 draft tokens)"),
    ],
)
def test_speculative_decoding_the_decode_backend_cannot_do_is_refused(arch, backend, drafts, limit):
    message = refusal(arch, attention_backend=backend, speculative_num_draft_tokens=drafts)
    assert f"decode_backend {backend!r}" in message
    assert f"speculative_num_draft_tokens={drafts} ({drafts + 1} query tokens per sequence in decode)" in message
    assert limit in message
    alternatives = listed_alternatives(message, "decode")
    assert backend not in alternatives and "reference" in alternatives
    for name in alternatives:
        assert fits_alone(name, arch, speculative_num_draft_tokens=drafts)


def test_tokenspeed_takes_seven_draft_tokens():
    plan = plan_for("sm100", attention_backend="tokenspeed_mla", speculative_num_draft_tokens=7)
    assert (plan.decode_backend, plan.decode_q_len) == ("tokenspeed_mla", 8)


LIMITED_Q = [r for r in RECORDS if r.max_decode_q_len is not None]
UNLIMITED_Q = [r for r in DECODE_RECORDS if r.max_decode_q_len is None]


@pytest.mark.parametrize("record", LIMITED_Q, ids=ids(LIMITED_Q))
def test_q_len_limit_is_exact_for_every_limited_backend(record):
    arch, most = home_arch(record), record.max_decode_q_len
    assert plan_for(arch, decode_backend=record.name, speculative_num_draft_tokens=most - 1).decode_q_len == most
    message = refusal(arch, decode_backend=record.name, speculative_num_draft_tokens=most)
    assert f"({most + 1} query tokens per sequence in decode) is not supported" in message


@pytest.mark.parametrize("record", UNLIMITED_Q, ids=ids(UNLIMITED_Q))
def test_backends_without_q_len_limit_take_many_draft_tokens(record):
    plan = plan_for(home_arch(record), decode_backend=record.name, speculative_num_draft_tokens=15)
    assert (plan.decode_backend, plan.decode_q_len) == (record.name, 16)


def test_auto_skips_a_backend_that_cannot_do_speculative_decoding_and_notes_it():
    plan = plan_for("xpu", speculative_num_draft_tokens=1)
    assert plan.decode_backend == "reference"
    assert "skipped intel_xpu (speculative_num_draft_tokens=1" in note(plan, "decode backend:")


# --- speculative modes: tree drafts and uneven drafts -----------------------------------------------------


TREE = "speculative_eagle_topk=2 (tree drafts) is not supported; it verifies chains only (topk 1)"
UNEVEN = "speculative_uneven_drafts needs a latent-form extend kernel, which it lacks"
NONE_FITS = "no registered backend fits this decode configuration as it stands; change the settings above"


def test_no_backend_records_tree_drafts():
    assert not [r.name for r in RECORDS if r.tree_drafts]
    assert all(r.describe_capabilities()["tree_drafts"] is False for r in RECORDS)


def test_tree_drafts_with_explicit_triton_are_refused_and_nothing_fits():
    message = refusal("sm90", decode_backend="triton", speculative_num_draft_tokens=3, speculative_eagle_topk=2)
    assert message == f"decode_backend 'triton' cannot serve this configuration on sm90:\n  - {TREE}\n{NONE_FITS}"


@pytest.mark.parametrize("record", DECODE_RECORDS, ids=ids(DECODE_RECORDS))
def test_every_backend_refuses_tree_drafts_by_name(record):
    arch = home_arch(record)
    message = refusal(arch, attention_backend=record.name, speculative_num_draft_tokens=1, speculative_eagle_topk=2)
    assert f"decode_backend {record.name!r} cannot serve this configuration on {arch}" in message
    assert TREE in message
    assert NONE_FITS in message
    # with chain drafts (topk 1) the same configuration is refused only by backends without speculative decoding
    assert fits_alone(record.name, arch, speculative_num_draft_tokens=1) == (record.max_decode_q_len != 1)


@pytest.mark.parametrize("arch", ARCHS)
def test_auto_refuses_tree_drafts_naming_the_setting_for_every_backend(arch):
    message = refusal(arch, speculative_num_draft_tokens=2, speculative_eagle_topk=4)
    assert message.startswith(f"no registered backend can serve decode for this configuration on {arch}:")
    tree = "speculative_eagle_topk=4 (tree drafts) is not supported; it verifies chains only (topk 1)"
    assert message.count(tree) == len(RECORDS)
    for record in RECORDS:
        assert f"  {record.name}:\n" in message


def test_uneven_drafts_with_flashmla_are_refused_with_triton_among_the_alternatives():
    message = refusal("sm90", decode_backend="flashmla", speculative_num_draft_tokens=3, speculative_uneven_drafts=True)
    assert f"decode_backend 'flashmla' cannot serve this configuration on sm90:\n  - {UNEVEN}\nbackends that fit" in message
    alternatives = listed_alternatives(message, "decode")
    assert alternatives == ["triton", "reference", "triton_fp8"]
    for name in alternatives:
        assert BY_NAME[name].latent_extend
        assert fits_alone(name, "sm90", speculative_num_draft_tokens=3, speculative_uneven_drafts=True)


NO_EXTEND_SPECULATIVE = [r for r in DECODE_RECORDS if not r.latent_extend and r.max_decode_q_len != 1]


@pytest.mark.parametrize("record", NO_EXTEND_SPECULATIVE, ids=ids(NO_EXTEND_SPECULATIVE))
def test_uneven_drafts_are_refused_by_every_backend_without_a_latent_extend(record):
    arch = home_arch(record)
    assert fits_alone(record.name, arch, speculative_num_draft_tokens=1)
    message = refusal(arch, decode_backend=record.name, speculative_num_draft_tokens=1, speculative_uneven_drafts=True)
    assert f"decode_backend {record.name!r}" in message
    assert UNEVEN in message


@pytest.mark.parametrize("arch, backend", [("sm90", "triton"), ("sm100", "triton"), ("cpu", "reference"), ("sm90", "reference")])
def test_uneven_drafts_with_a_latent_extend_backend_are_accepted_and_noted(arch, backend):
    plan = plan_for(arch, decode_backend=backend, speculative_num_draft_tokens=3, speculative_uneven_drafts=True)
    assert (plan.decode_backend, plan.decode_q_len) == (backend, 4)
    assert note(plan, "speculative decoding:") == (
        f"speculative decoding: chain drafts (topk 1), target verify with 3 draft tokens (4 query tokens per sequence) "
        f"through {backend}'s decode kernel; draft decode steps: q_len 1; draft extend: {backend}'s latent extend; "
        f"uneven drafts: through {backend}'s latent extend"
    )


def test_auto_with_uneven_drafts_skips_backends_without_a_latent_extend_and_says_why():
    plan = plan_for("sm90", speculative_num_draft_tokens=2, speculative_uneven_drafts=True)
    assert plan.decode_backend == "triton"
    text = note(plan, "decode backend:")
    assert f"skipped flashmla ({UNEVEN}); flashinfer_mla ({UNEVEN})" in text


def test_speculative_note_for_a_decode_only_backend_names_its_prefill_for_draft_extend():
    plan = plan_for("sm90", decode_backend="flashmla", speculative_num_draft_tokens=1)
    assert (plan.prefill_backend, plan.decode_backend) == ("triton", "flashmla")
    assert note(plan, "speculative decoding:") == (
        "speculative decoding: chain drafts (topk 1), target verify with 1 draft token (2 query tokens per sequence) "
        "through flashmla's decode kernel; draft decode steps: q_len 1; draft extend: triton's prefill; uneven drafts: off"
    )


def test_no_speculative_note_without_draft_tokens():
    assert not any(n.startswith("speculative") for n in plan_for("sm90").notes)
    assert not any(n.startswith("speculative") for n in plan_for("cpu", speculative_eagle_topk=1).notes)


# --- KV cache dtype ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, backend, kv, allowed",
    [("sm100", "tokenspeed_mla", "bf16", "['fp8_e4m3']"), ("sm90", "flashmla", "fp8_e4m3", "['bf16', 'fp16']")],
)
def test_explicit_unsupported_kv_dtype_lists_allowed(arch, backend, kv, allowed):
    message = refusal(arch, attention_backend=backend, kv_cache_dtype=kv)
    assert f"decode_backend {backend!r}" in message
    assert f"kv_cache_dtype {kv!r} is not supported; allowed: {allowed}" in message


def test_triton_fp8_named_for_decode_takes_fp8_caches_and_leaves_the_prefill_to_auto():
    """Its e4m3 prefill (error ~5e-2) runs only where named: naming it for decode picks the prefill automatically."""
    plan = plan_for("sm90", decode_backend="triton_fp8")
    assert (plan.decode_backend, plan.prefill_backend, plan.kv_cache_dtype) == ("triton_fp8", "triton", "fp8_e4m3")
    assert "triton_fp8's attention computes in fp8_e4m3: its prefill runs only where prefill_backend names it" in note(
        plan, "prefill backend:")
    both = plan_for("sm90", attention_backend="triton_fp8")
    assert (both.decode_backend, both.prefill_backend) == ("triton_fp8", "triton_fp8")
    message = refusal("sm90", decode_backend="triton_fp8", prefill_backend="flashinfer_mla")
    assert "shares no KV dtype with triton_fp8 (['bf16', 'fp16'] vs ['fp8_e4m3'])" in message


@pytest.mark.parametrize("decode_kv_dtypes, phases", [(frozenset({"fp8_e4m3", "fp16"}), {"decode"}),
                                                      (frozenset(), {"decode"}),
                                                      (frozenset({"fp8_e4m3"}), {"prefill"})])
def test_decode_kv_dtypes_must_be_a_non_empty_subset_for_a_decoding_backend(decode_kv_dtypes, phases):
    with pytest.raises(ConfigError, match="decode_kv_dtypes must be a non-empty subset"):
        BackendRecord("x", "", frozenset(phases), frozenset({"cuda"}), PageSizeRule(), frozenset({"bf16", "fp8_e4m3"}),
                      0, 64, decode_kv_dtypes=decode_kv_dtypes)


PARTIAL_KV = [r for r in DECODE_RECORDS if set(r.kv_dtypes_for("decode")) != set(KV_DTYPES)]


@pytest.mark.parametrize("record", PARTIAL_KV, ids=ids(PARTIAL_KV))
def test_every_backend_refuses_kv_dtypes_it_lacks_and_keeps_those_it_has(record):
    arch = home_arch(record)
    allowed = [d for d in KV_DTYPES if d in record.kv_dtypes_for("decode")]
    for kv in KV_DTYPES:
        if kv in allowed:
            plan = plan_for(arch, decode_backend=record.name, kv_cache_dtype=kv)
            assert plan.kv_cache_dtype == kv
            assert not any(n.startswith("kv_cache_dtype:") for n in plan.notes)
        else:
            message = refusal(arch, decode_backend=record.name, kv_cache_dtype=kv)
            assert f"kv_cache_dtype {kv!r} is not supported" in message and f"allowed: {allowed}" in message


@pytest.mark.parametrize("record", DECODE_RECORDS, ids=ids(DECODE_RECORDS))
def test_auto_kv_dtype_is_first_both_backends_take_and_is_noted(record):
    plan = plan_for(home_arch(record), attention_backend=record.name)
    both = [d for d in KV_DTYPES if d in BY_NAME[plan.decode_backend].kv_dtypes_for("decode")
            and d in BY_NAME[plan.prefill_backend].kv_dtypes_for("prefill")]
    assert plan.kv_cache_dtype == both[0]
    assert note(plan, "kv_cache_dtype:").startswith(f"kv_cache_dtype: {both[0]} (auto")


def test_auto_kv_dtype_on_tokenspeed_is_fp8_with_a_note():
    plan = plan_for("sm100", attention_backend="tokenspeed_mla")
    assert (plan.prefill_backend, plan.decode_backend, plan.kv_cache_dtype) == ("triton", "tokenspeed_mla", "fp8_e4m3")
    text = note(plan, "kv_cache_dtype:")
    assert text == "kv_cache_dtype: fp8_e4m3 (auto: first of bf16, fp16, fp8_e4m3 that tokenspeed_mla and triton take)"


# --- "auto" priority --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, decode, prefill, not_for",
    [
        ("cpu", "reference", "reference", ["intel_xpu", "trtllm_mla", "flashmla", "cutedsl_mla", "tokenspeed_mla", "flashinfer_mla"]),
        ("sm80", "flashinfer_mla", "triton", ["intel_xpu", "trtllm_mla", "flashmla", "cutedsl_mla", "tokenspeed_mla"]),
        ("sm90", "flashmla", "triton", ["intel_xpu", "trtllm_mla"]),
        ("sm100", "trtllm_mla", "triton", ["intel_xpu"]),
        ("xpu", "intel_xpu", "reference", []),
    ],
)
def test_auto_picks_by_documented_priority(arch, decode, prefill, not_for):
    plan = plan_for(arch)
    assert (plan.decode_backend, plan.prefill_backend) == (decode, prefill)
    text = note(plan, "decode backend:")
    assert text.startswith(f"decode backend: {decode} (auto: highest-priority backend that fits {arch})")
    if not_for:
        assert f"not for {arch}: {', '.join(not_for)}" in text
    else:
        assert "not for" not in text


@pytest.mark.parametrize("arch", ARCHS)
def test_auto_decode_is_the_first_fitting_backend_in_auto_rank_order(arch):
    first = next(r.name for r in RECORDS if fits_alone(r.name, arch))
    assert plan_for(arch).decode_backend == first


def test_auto_with_page_size_16_on_sm90_skips_flashmla_and_says_why():
    plan = plan_for("sm90", page_size=16)
    assert (plan.decode_backend, plan.page_size) == ("flashinfer_mla", 16)
    assert "skipped flashmla (page_size 16 is not supported; allowed page sizes: {64})" in note(plan, "decode backend:")


def test_auto_prefill_on_sm90_notes_that_flashmla_is_decode_only():
    text = note(plan_for("sm90"), "prefill backend:")
    assert text.startswith("prefill backend: triton (automatic, flashmla is decode-only")
    assert "skipped flashmla (does not do prefill" in text
    assert "; flashinfer_mla (states prefill, but mlakit has no adapter for its prefill kernel yet)" in text


@pytest.mark.parametrize("record", NO_PREFILL_ADAPTER, ids=ids(NO_PREFILL_ADAPTER))
def test_vendor_backend_without_a_prefill_adapter_gets_an_automatic_prefill_noted(record):
    arch = home_arch(record)
    plan = plan_for(arch, attention_backend=record.name)
    assert (plan.prefill_backend, plan.decode_backend) == ("triton", record.name)
    text = note(plan, "prefill backend:")
    assert text.startswith(
        f"prefill backend: triton (automatic, mlakit has no adapter for {record.name}'s prefill kernel yet: "
        f"highest-priority backend that fits {arch})"
    )
    assert f"{record.name} (states prefill, but mlakit has no adapter for its prefill kernel yet)" in text


def test_auto_decode_with_explicit_prefill_shares_its_cache_format(adapted):
    prefill = adapted("tokenspeed_mla")  # fp8-only cache
    plan = plan_for("sm100", prefill_backend=prefill)
    assert plan.prefill_backend == prefill
    assert plan.decode_backend == "trtllm_mla"
    assert plan.kv_cache_dtype == "fp8_e4m3"


# --- tensor parallelism -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tp, per_rank", [(1, 128), (2, 64), (8, 16), (128, 1)])
def test_heads_per_rank_is_heads_over_tp(tp, per_rank):
    plan = plan_for("sm90", tp_size=tp)
    assert (plan.model_shape.num_heads, plan.rank_shape.num_heads, plan.tp_size) == (128, per_rank, tp)
    assert plan.rank_shape.kv_lora_rank == 512
    if tp > 1:
        assert f"heads per rank: {per_rank} (128 heads / tp_size {tp})" in plan.notes
    else:
        assert not any(n.startswith("heads per rank") for n in plan.notes)


@pytest.mark.parametrize(
    "shape_name, tp, valid",
    [("deepseek-v3", 3, "[1, 2, 4, 8, 16, 32, 64, 128]"), ("kimi-k2", 6, "[1, 2, 4, 8, 16, 32, 64]"), ("minicpm3", 16, "[1, 2, 4, 5, 8, 10, 20, 40]")],
)
def test_tp_size_that_does_not_divide_heads_names_valid_values(shape_name, tp, valid):
    shape = MLAShape.preset(shape_name)
    message = refusal("cpu", shape=shape, tp_size=tp)
    assert f"tp_size={tp} does not divide num_heads={shape.num_heads}" in message
    assert f"use one of {valid}" in message


MAX_HEADS = [r for r in RECORDS if r.max_heads is not None]
WIDE = MLAShape(256, 512, 128, 64, 128)


@pytest.mark.parametrize("record", MAX_HEADS, ids=ids(MAX_HEADS))
def test_heads_per_rank_over_max_heads_is_refused_until_tp_splits_them(record):
    arch = home_arch(record)
    message = refusal(arch, shape=WIDE, decode_backend=record.name)
    assert f"takes at most {record.max_heads} heads per rank, got 256; raise tp_size" in message
    tp = 256 // record.max_heads
    plan = plan_for(arch, shape=WIDE, decode_backend=record.name, tp_size=tp)
    assert (plan.decode_backend, plan.rank_shape.num_heads) == (record.name, record.max_heads)


def test_auto_skips_backends_whose_head_limit_is_exceeded():
    plan = plan_for("sm90", shape=WIDE)
    limit = BY_NAME[plan.decode_backend].max_heads
    assert limit is None or limit >= 256
    assert plan.decode_backend != "flashmla"
    assert "skipped flashmla (takes at most 128 heads per rank, got 256" in note(plan, "decode backend:")


# --- latent dimensions ------------------------------------------------------------------------------------


LATENT_LIMITED = [r for r in RECORDS if r.kv_lora_ranks is not None]
MINICPM3 = MLAShape.preset("minicpm3")


@pytest.mark.parametrize("record", LATENT_LIMITED, ids=ids(LATENT_LIMITED))
def test_minicpm3_latent_dims_are_refused_by_backends_fixed_to_512(record):
    assert MINICPM3.kv_lora_rank not in record.kv_lora_ranks
    message = refusal(home_arch(record), shape=MINICPM3, attention_backend=record.name)
    assert f"decode_backend {record.name!r}" in message
    assert f"kv_lora_rank 256 is not supported; allowed: {sorted(record.kv_lora_ranks)}" in message
    if record.rope_dims is not None:
        assert f"qk_rope_head_dim 32 is not supported; allowed: {sorted(record.rope_dims)}" in message


def test_the_documented_backends_refuse_minicpm3():
    assert {"flashmla", "flashinfer_mla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "intel_xpu"} <= {r.name for r in LATENT_LIMITED}


@pytest.mark.parametrize("arch", ARCHS)
def test_auto_serves_minicpm3_only_with_backends_that_take_its_latent_dims(arch):
    plan = plan_for(arch, shape=MINICPM3)
    for chosen in (plan.decode_backend, plan.prefill_backend):
        ranks = BY_NAME[chosen].kv_lora_ranks
        assert ranks is None or 256 in ranks, chosen
    assert plan.rank_shape.kv_lora_rank == 256
    if arch in ("cpu", "xpu"):
        assert (plan.decode_backend, plan.prefill_backend) == ("reference", "reference")
    if arch == "sm90":
        assert "skipped flashmla (kv_lora_rank 256 is not supported" in note(plan, "decode backend:")


# --- CUDA graphs ------------------------------------------------------------------------------------------


def test_cuda_graphs_on_cpu_is_an_error():
    message = refusal("cpu", cuda_graphs=True)
    assert "cuda_graphs=True needs a CUDA device; the device is cpu" in message


def test_cuda_graphs_with_intel_xpu_is_an_error():
    message = refusal("xpu", attention_backend="intel_xpu", cuda_graphs=True)
    assert "cuda_graphs=True needs a CUDA device; the device is xpu" in message


CUDA_RECORDS = [r for r in DECODE_RECORDS if "cuda" in r.device_kinds]


@pytest.mark.parametrize("record", CUDA_RECORDS, ids=ids(CUDA_RECORDS))
def test_forced_cuda_graphs_are_kept_only_for_capturable_decode_backends(record):
    arch = next(a for a in ("sm80", "sm90", "sm100") if not record.hardware_problems(dev(a)))
    if record.cuda_graphs:
        plan = plan_for(arch, decode_backend=record.name, cuda_graphs=True)
        assert plan.cuda_graphs is True
        assert not any(n.startswith("cuda_graphs:") for n in plan.notes)
    else:
        message = refusal(arch, decode_backend=record.name, cuda_graphs=True)
        assert f"decode_backend {record.name!r}" in message
        assert "cannot be captured in a CUDA graph" in message
    assert plan_for(arch, decode_backend=record.name, cuda_graphs=False).cuda_graphs is False


@pytest.mark.parametrize(
    "arch, backend, expected, why",
    [
        ("sm90", "flashmla", True, "cuda_graphs: on (auto: flashmla supports capture)"),
        ("sm100", "cutedsl_mla", True, "cuda_graphs: on (auto: cutedsl_mla supports capture)"),
        ("cpu", "auto", False, "cuda_graphs: off (auto: the device is cpu)"),
        ("xpu", "intel_xpu", False, "cuda_graphs: off (auto: the device is xpu)"),
        ("sm90", "reference", True, "cuda_graphs: on (auto: reference supports capture)"),
    ],
)
def test_unset_cuda_graphs_follow_device_and_backend_with_a_note(arch, backend, expected, why):
    plan = plan_for(arch, attention_backend=backend)
    assert plan.cuda_graphs is expected
    assert why in plan.notes


# --- workspaces -------------------------------------------------------------------------------------------


def test_trtllm_and_cutedsl_workspaces_are_separate_families(adapted):
    prefill = adapted("trtllm_mla")  # trtllm_mla's prefill as cutedsl_mla would pair with it, with an adapter
    plan = plan_for("sm100", decode_backend="cutedsl_mla", prefill_backend=prefill)
    assert (plan.prefill_backend, plan.decode_backend) == (prefill, "cutedsl_mla")
    by_family = {w.family: w for w in plan.workspaces}
    assert set(by_family) == {"trtllm_gen", "cutedsl"}
    assert by_family["trtllm_gen"].backends == (prefill,)
    assert by_family["trtllm_gen"].zero_filled is True
    assert by_family["cutedsl"].backends == ("cutedsl_mla",)
    assert by_family["cutedsl"].zero_filled is False
    assert by_family["trtllm_gen"].nbytes == by_family["cutedsl"].nbytes == 150 << 20


@pytest.mark.parametrize("prefill_mib", [50, 300])
def test_two_backends_of_one_family_share_one_workspace_of_the_larger_size(adapted, prefill_mib):
    spec = dataclasses.replace(BY_NAME["cutedsl_mla"].workspace, size_bytes=lambda inputs: prefill_mib << 20)
    prefill = adapted("trtllm_mla", workspace=spec)  # in cutedsl's family (150 MiB), smaller or larger
    plan = plan_for("sm100", decode_backend="cutedsl_mla", prefill_backend=prefill)
    merged = ("cutedsl", (prefill, "cutedsl_mla"), max(prefill_mib, 150) << 20)
    assert [(w.family, w.backends, w.nbytes) for w in plan.workspaces] == [merged]


def test_one_backend_for_both_phases_asks_for_one_workspace(adapted):
    both = adapted("trtllm_mla", phases=("decode", "prefill"))  # trtllm_mla as it will be with a prefill adapter
    plan = plan_for("sm100", attention_backend=both)
    assert (plan.prefill_backend, plan.decode_backend) == (both, both)
    assert [(w.family, w.backends) for w in plan.workspaces] == [("trtllm_gen", (both,))]
    # trtllm_mla itself: its decode with triton's prefill, which needs no workspace
    plan = plan_for("sm100", attention_backend="trtllm_mla")
    assert (plan.prefill_backend, plan.decode_backend) == ("triton", "trtllm_mla")
    assert [(w.family, w.backends) for w in plan.workspaces] == [("trtllm_gen", ("trtllm_mla",))]


def test_reference_needs_no_workspace():
    assert plan_for("cpu").workspaces == ()


WITH_WORKSPACE = [r for r in RECORDS if r.workspace is not None]


@pytest.mark.parametrize("record", WITH_WORKSPACE, ids=ids(WITH_WORKSPACE))
def test_each_workspace_request_follows_its_record(record):
    arch = home_arch(record)
    plan = plan_for(arch, attention_backend=record.name, tp_size=8, max_batch_size=32, max_context_len=4096)
    families = [w.family for w in plan.workspaces]
    assert len(families) == len(set(families))
    spec = record.workspace
    request = next(w for w in plan.workspaces if w.family == spec.family)
    inputs = WorkspaceInputs(plan.rank_shape, plan.device, plan.page_size, 32, 4096, plan.decode_q_len)
    assert record.name in request.backends
    assert request.nbytes == spec.size_bytes(inputs) > 0
    assert (request.zero_filled, request.formula) == (spec.zero_filled, spec.formula)


def test_tokenspeed_workspace_formula_uses_the_device_sm_count():
    plan = plan_for("sm100", attention_backend="tokenspeed_mla")
    assert plan.device.num_sms == 148
    (request,) = plan.workspaces
    assert request.family == "tokenspeed"
    assert request.nbytes == 148 * 128 * 8 * (512 + 1) * 4 == 310_984_704

    tp8 = plan_for("sm100", attention_backend="tokenspeed_mla", tp_size=8)
    assert tp8.workspaces[0].nbytes == 148 * 16 * 8 * 513 * 4

    small = dataclasses.replace(dev("sm100"), num_sms=100)
    other = resolve(ServingConfig(attention_backend="tokenspeed_mla"), V3, small)
    assert other.workspaces[0].nbytes == 100 * 128 * 8 * 513 * 4


def _xpu_workspace(**overrides) -> int:
    config = dict(attention_backend="intel_xpu", max_batch_size=8, max_context_len=2048, page_size=64) | overrides
    plan = plan_for("xpu", **config)
    (request,) = [w for w in plan.workspaces if w.family == "intel_xpu"]
    return request.nbytes


def test_intel_xpu_workspace_depends_on_batch_context_heads_and_page_size():
    base = _xpu_workspace()
    assert base == 8 * 128 * 32 * 513 * 4  # 2048 / 64 = 32 splits
    assert _xpu_workspace(max_batch_size=16) == 2 * base
    assert _xpu_workspace(max_context_len=4096) == 2 * base
    assert _xpu_workspace(tp_size=2) == base // 2  # fewer heads per rank
    assert _xpu_workspace(page_size=32) == 2 * base  # smaller pages, more splits
    assert _xpu_workspace(page_size=128) == base // 2
    # splits are capped at 64
    assert _xpu_workspace(max_context_len=1 << 20) == _xpu_workspace(max_context_len=64 * 64) == 8 * 128 * 64 * 513 * 4


# --- unknown names, local devices and config validation ---------------------------------------------------


@pytest.mark.parametrize("field", ["attention_backend", "decode_backend", "prefill_backend"])
def test_unknown_backend_name_lists_registered_backends(field):
    message = refusal("sm90", **{field: "flash_mla_v9"})
    assert "unknown backend 'flash_mla_v9'" in message
    assert f"registered backends: {backend_names()}" in message
    with pytest.raises(ConfigError, match="registered backends"):
        get_backend("flash_mla_v9")


PACKAGED = [r for r in RECORDS if r.packages]


@pytest.mark.parametrize("record", PACKAGED, ids=ids(PACKAGED))
def test_local_device_refuses_backend_whose_package_is_missing(record):
    missing = record.missing_packages()
    if not missing:
        pytest.skip(f"{record.packages} installed here")
    local = dataclasses.replace(dev(home_arch(record)), local=True)
    with pytest.raises(ConfigError) as info:
        resolve(ServingConfig(decode_backend=record.name), V3, local)
    message = str(info.value)
    assert f"decode_backend {record.name!r}" in message
    assert f"needs package {', '.join(missing)}, not installed here ({record.install_hint})" in message
    # the same configuration on the hypothetical device resolves, with the package as a note
    plan = resolve(ServingConfig(decode_backend=record.name), V3, dev(home_arch(record)))
    assert any(n.startswith(f"{record.name} needs {', '.join(missing)} on the target machine") for n in plan.notes)


def test_auto_on_a_local_device_skips_backends_that_are_not_installed():
    if not BY_NAME["flashmla"].missing_packages():
        pytest.skip("flash_mla is installed here")
    local = dataclasses.replace(dev("sm90"), local=True)
    plan = resolve(ServingConfig(), V3, local)
    assert plan.decode_backend != "flashmla"
    assert "flashmla (needs package flash_mla, not installed here" in note(plan, "decode backend:")
    assert not any("on the target machine" in n for n in plan.notes)


def test_local_cpu_resolves_to_reference_without_package_notes():
    plan = resolve(ServingConfig(), V3, DeviceInfo.detect("cpu"))
    assert plan.device.local is True
    assert (plan.decode_backend, plan.prefill_backend) == ("reference", "reference")
    assert not any("needs" in n for n in plan.notes)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"kv_cache_dtype": "fp8"}, r"kv_cache_dtype must be one of \['auto', 'bf16', 'fp16', 'fp8_e4m3'\], got 'fp8'"),
        ({"kv_cache_dtype": "float16"}, r"kv_cache_dtype must be one of .* got 'float16'"),
        ({"page_size": 0}, r"page_size must be a positive integer or None .* got 0"),
        ({"page_size": -16}, r"page_size must be a positive integer or None .* got -16"),
        ({"page_size": 16.0}, r"page_size must be a positive integer .* got 16.0"),
        ({"speculative_num_draft_tokens": -1}, r"speculative_num_draft_tokens must be an integer >= 0, got -1"),
        ({"speculative_eagle_topk": 0}, r"speculative_eagle_topk must be an integer >= 1, got 0"),
        ({"speculative_eagle_topk": 2.0}, r"speculative_eagle_topk must be an integer >= 1, got 2.0"),
        ({"speculative_eagle_topk": True}, r"speculative_eagle_topk must be an integer >= 1, got True"),
        ({"speculative_uneven_drafts": "yes"}, r"speculative_uneven_drafts must be True or False, got 'yes'"),
        ({"speculative_uneven_drafts": 1}, r"speculative_uneven_drafts must be True or False, got 1"),
        ({"speculative_eagle_topk": 4}, r"speculative_eagle_topk=4 \(tree drafts\) needs speculative decoding: set speculative_num_draft_tokens >= 1"),
        ({"speculative_uneven_drafts": True}, r"speculative_uneven_drafts needs speculative decoding: set speculative_num_draft_tokens >= 1"),
        ({"tp_size": 0}, r"tp_size must be an integer >= 1, got 0"),
        ({"max_batch_size": 0}, r"max_batch_size must be an integer >= 1, got 0"),
        ({"max_context_len": True}, r"max_context_len must be an integer >= 1, got True"),
        ({"decode_backend": ""}, r"decode_backend must be a backend name or 'auto', got ''"),
    ],
)
def test_serving_config_validation(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        ServingConfig(**kwargs)


def test_decode_q_len_is_draft_tokens_plus_one():
    assert ServingConfig(speculative_num_draft_tokens=3).decode_q_len == 4
    assert plan_for("sm100", speculative_num_draft_tokens=3).decode_q_len == 4


def test_serving_config_rejects_a_non_bool_cuda_graphs():
    with pytest.raises(ConfigError, match="cuda_graphs"):
        ServingConfig(cuda_graphs="no")


@pytest.mark.parametrize("arguments, pattern", [
    ((ServingConfig(), "deepseek-v3"), r"shape: expected a MLAShape, got str"),
    ((None, MLAShape.preset("deepseek-v3")), r"config: expected a ServingConfig, got NoneType"),
    ((ServingConfig(), MLAShape.preset("deepseek-v3"), "cpu"), r"device: expected a DeviceInfo .*got str"),
])
def test_resolve_names_an_argument_of_the_wrong_type(arguments, pattern):
    with pytest.raises(ConfigError, match=pattern):
        resolve(*arguments)
