"""`mlakit bench decode --backends`: which backends run, and which cases each refuses (CPU-checkable parts)."""

import pytest

from mlakit.bench.decode import DecodeCase
from mlakit.bench.peers import case_problems, parse_backends, usable_decode_backends
from mlakit.device import DeviceInfo
from mlakit.errors import ConfigError

SM90 = DeviceInfo.from_arch("sm90")


def test_named_backends_keep_their_order_and_missing_packages_are_noted():
    usable, notes = parse_backends("triton, flashmla,flashinfer_mla", SM90)
    installed = {"flashmla": "flash_mla", "flashinfer_mla": "flashinfer"}
    assert usable[0] == "triton"
    for name, package in installed.items():
        assert (name in usable) != any(note == f"{name}: package {package} is not installed" for note in notes)


@pytest.mark.parametrize("spec, pattern", [("", "--backends: expected a comma-separated list"), ("triton,nope", "nope")])
def test_bad_backend_lists_are_refused(spec, pattern):
    with pytest.raises(ConfigError, match=pattern):
        parse_backends(spec, SM90)


def test_reference_and_prefill_only_backends_are_never_timed():
    assert "reference" not in usable_decode_backends(SM90)
    assert usable_decode_backends(DeviceInfo.from_arch("cpu")) == []


@pytest.mark.parametrize(
    "backend, case, refused",
    [
        ("flashmla", DecodeCase(128, 4, 1024, kv_dtype="fp8_e4m3"), "fp8_e4m3"),
        ("flashmla", DecodeCase(16, 4, 1024, page_size=1), "page_size 1"),
        ("flashinfer_mla", DecodeCase(128, 4, 1024, kv_dtype="fp8_e4m3"), "fp8_e4m3"),
    ],
)
def test_cases_a_backend_refuses_are_named(backend, case, refused):
    assert any(refused in problem for problem in case_problems(backend, case, SM90))


def test_triton_runs_every_grid_case():
    for case in (DecodeCase(128, 4, 1024, 4, "fp8_e4m3", 1), DecodeCase(5, 1, None, 8, "fp16", 16)):
        assert case_problems("triton", case, SM90) == []


def test_our_backends_metadata_is_told_the_cases_cached_tokens_and_page_size(monkeypatch):
    """As a serving step builds it: `mla_decode_metadata` gets the batch's cached tokens (the sum of its lengths,
    known on the host) and the page size; the call then matches the reference's attention."""
    import torch

    from mlakit.bench import peers
    from mlakit.bench.decode import make_inputs
    from mlakit.reference import reference_decode

    seen = []
    original = peers.mla_decode_metadata
    monkeypatch.setattr(peers, "mla_decode_metadata", lambda *args, **kwargs: seen.append(kwargs) or original(
        *args, **kwargs))
    case = DecodeCase(4, 3, 100, 2, page_size=16)
    inputs = make_inputs(case, torch.device("cpu"))
    out = peers._registry_call("reference")(inputs)()[0]
    assert [(kwargs["kv_tokens_hint"], kwargs["page_size"]) for kwargs in seen] == [(3 * 100, 16)]
    expected, _ = reference_decode(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                   kv_lora_rank=512, softmax_scale=inputs.softmax_scale, kv_scale=inputs.kv_scale)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
