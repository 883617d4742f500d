"""The Triton merge of ranks' partial attention results (`kernels.rank_merge.merge_partials`)
against `reference.merge_attention_states` folded over the ranks, under the interpreter on CPU."""

from __future__ import annotations

import pytest
import torch

from mlakit.errors import MLAInputError
from mlakit.kernels import rank_merge
from mlakit.kernels.rank_merge import merge_partials
from mlakit.reference import merge_attention_states

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _folded(parts: torch.Tensor, part_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = parts[0].float(), part_lse[0]
    for j in range(1, parts.shape[0]):
        out, lse = merge_attention_states(out, lse, parts[j].float(), part_lse[j])
    return out, lse


@pytest.mark.parametrize(("ranks", "rows", "dim", "dtype"), [
    (2, 13, 512, torch.bfloat16), (3, 5, 40, torch.float16), (8, 9, 136, torch.float32), (1, 3, 16, torch.bfloat16),
])
def test_merge_equals_the_folded_reference_with_empty_parts_holding_garbage(ranks: int, rows: int, dim: int,
                                                                           dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(ranks * 1000 + dim)
    parts = torch.randn(ranks, rows, dim, generator=gen).to(dtype)
    part_lse = torch.randn(ranks, rows, generator=gen) * 4
    part_lse[torch.rand(ranks, rows, generator=gen) < 0.3] = float("-inf")
    part_lse[:, 0] = float("-inf")  # a row no rank saw a key for
    want_out, want_lse = _folded(parts.masked_fill((part_lse == float("-inf"))[..., None], 0), part_lse)
    parts[part_lse == float("-inf")] = float("nan")  # what an empty part's row holds must not matter
    out, lse = merge_partials(parts.to(DEVICE), part_lse.to(DEVICE), dtype)
    assert out.dtype == dtype and out.shape == (rows, dim) and lse.shape == (rows,)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.cpu().float(), want_out.to(dtype).float(), atol=tol, rtol=tol)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[0].cpu().float(), torch.zeros(dim)) and lse[0].item() == float("-inf")


def test_merge_reads_strided_views_and_writes_another_dtype() -> None:
    gen = torch.Generator().manual_seed(3)
    buffer = torch.empty(2, 6, 4, 9)  # [ranks, tokens, heads, 8 float32 words (16 bf16 channels) + lse]
    buffer[..., :-1].view(torch.bfloat16).copy_(torch.randn(2, 6, 4, 16, generator=gen))
    buffer[..., -1] = torch.randn(2, 6, 4, generator=gen)
    parts = buffer[..., :-1].view(torch.bfloat16).flatten(1, 2)
    part_lse = buffer[..., -1].flatten(1)
    want_out, want_lse = _folded(parts, part_lse)
    out, lse = merge_partials(parts.to(DEVICE), part_lse.to(DEVICE), torch.float32)
    torch.testing.assert_close(out.cpu(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)


def test_merge_of_no_rows_is_empty() -> None:
    out, lse = merge_partials(torch.randn(2, 0, 8), torch.randn(2, 0), torch.float32)
    assert out.shape == (0, 8) and lse.shape == (0,)


@pytest.mark.parametrize(("parts", "part_lse", "message"), [
    (torch.randn(2, 3), torch.randn(2, 3), "parts: expected [ranks, rows, dim] with contiguous channels, got shape (2, 3)"),
    (torch.randn(2, 8, 3).transpose(1, 2), torch.randn(2, 3), "parts: expected [ranks, rows, dim] with contiguous channels"),
    (torch.randn(2, 3, 8), torch.randn(2, 4), "part_lse: expected float32 (2, 3) on cpu, got torch.float32 (2, 4) on cpu"),
    (torch.randn(2, 3, 8), torch.randn(2, 3).double(), "part_lse: expected float32 (2, 3) on cpu, got torch.float64 (2, 3)"),
])
def test_merge_refuses_bad_inputs(parts: torch.Tensor, part_lse: torch.Tensor, message: str) -> None:
    with pytest.raises(MLAInputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        merge_partials(parts, part_lse, torch.float32)


@pytest.mark.parametrize(("ranks", "dim"), [(3, 200), (1, 8)])
def test_merge_of_one_row(ranks: int, dim: int) -> None:
    gen = torch.Generator().manual_seed(ranks + dim)
    parts, part_lse = torch.randn(ranks, 1, dim, generator=gen), torch.randn(ranks, 1, generator=gen) * 2
    want_out, want_lse = _folded(parts, part_lse)
    out, lse = merge_partials(parts.to(DEVICE), part_lse.to(DEVICE), torch.float32)
    torch.testing.assert_close(out.cpu(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)


def test_merge_ignores_the_default_device_and_dtype() -> None:
    """out and lse on the parts' device, lse in float32, whatever torch's defaults (an engine may call
    `torch.set_default_device("cuda")` or set another default dtype)."""
    gen = torch.Generator().manual_seed(11)
    parts, part_lse = torch.randn(2, 5, 24, generator=gen).to(DEVICE), (torch.randn(2, 5, generator=gen) * 2).to(DEVICE)
    want_out, want_lse = _folded(parts.cpu(), part_lse.cpu())
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.device("meta"):
            out, lse = merge_partials(parts, part_lse, torch.bfloat16)
    finally:
        torch.set_default_dtype(default)
    assert out.device == lse.device == parts.device and out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(out.cpu().float(), want_out.bfloat16().float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)


def _views(store: torch.Tensor, lse_store: torch.Tensor, rows: int, *, offset: int = 0,
           lse_offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """parts [2, rows, 40] and part_lse [2, rows]: views of 32-row buffers (strides that do not depend on
    `rows`) at `offset` / `lse_offset` elements into `store` / `lse_store`."""
    parts = store[offset:offset + 2 * 32 * 40].view(2, 32, 40)[:, :rows]
    return parts, lse_store[lse_offset:lse_offset + 2 * 32].view(2, 32)[:, :rows]


def test_launch_key_holds_what_triton_specializes_on(monkeypatch) -> None:
    """On GPUs `CachedLaunch` reruns the kernel compiled for the first call with an equal key (the CPU
    interpreter compiles every call, so the key is checked here): calls Triton compiles apart (a row count
    of 1 or a multiple of 16, a pointer not 16-byte aligned, other dtypes) need other keys; calls it
    compiles alike share one, and every launch covers each (8-row, 128-channel) tile once."""
    launches, launch = [], rank_merge._MERGE

    def recorded(key: object, grid: tuple[int, int, int], *args: object) -> None:
        launches.append((key, grid))
        launch(key, grid, *args)

    monkeypatch.setattr(rank_merge, "_MERGE", recorded)

    def key(*args: torch.Tensor, dtype: torch.dtype = torch.float32) -> object:
        out, lse = merge_partials(*args, dtype)
        want_out, want_lse = _folded(*(t.cpu() for t in args))
        torch.testing.assert_close(out.cpu().float(), want_out.to(dtype).float(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)
        return launches[-1][0]

    gen = torch.Generator().manual_seed(8)
    store, lse_store = torch.randn(8 + 2 * 32 * 40, generator=gen).to(DEVICE), torch.randn(8 + 64, generator=gen).to(DEVICE)
    by_rows = {rows: key(*_views(store, lse_store, rows)) for rows in (1, 3, 18, 16, 32)}
    assert by_rows[1] != by_rows[3] == by_rows[18] != by_rows[16] == by_rows[32]
    # one buffer: pointers 0, 16 and 32 bytes in share the key; 4, 8 and 12 bytes in do not
    assert {key(*_views(store, lse_store, 18, offset=o, lse_offset=o)) for o in (0, 4, 8)} == {by_rows[18]}
    for o in (1, 2, 3):
        assert key(*_views(store, lse_store, 18, offset=o)) != by_rows[18]
        assert key(*_views(store, lse_store, 18, lse_offset=o)) != by_rows[18]
    assert key(*_views(store.bfloat16(), lse_store, 18)) != by_rows[18]
    assert key(*_views(store, lse_store, 18), dtype=torch.float16) != by_rows[18]

    launches.clear()
    gen = torch.Generator().manual_seed(9)
    for rows, dim in ((17, 300), (8, 128), (1, 129)):
        key(torch.randn(3, rows, dim, generator=gen).to(DEVICE), torch.randn(3, rows, generator=gen).to(DEVICE))
    assert [grid for _, grid in launches] == [(3, 3, 1), (1, 1, 1), (1, 2, 1)]


def test_merge_of_large_log_sum_exps_stays_finite() -> None:
    """Weights relative to each row's largest lse: rows whose lses lie near +-300 (exp overflows or
    underflows float32 there) merge as exactly as rows near 0."""
    gen = torch.Generator().manual_seed(21)
    parts = torch.randn(3, 6, 40, generator=gen)
    part_lse = torch.randn(3, 6, generator=gen) * 3 + torch.tensor([300.0, -300.0, 0.0, 150.0, -150.0, 90.0])
    part_lse[1, 1] = float("-inf")
    want_out, want_lse = _folded(parts, part_lse)
    assert torch.isfinite(want_out).all() and torch.isfinite(want_lse).all()
    out, lse = merge_partials(parts.to(DEVICE), part_lse.to(DEVICE), torch.float32)
    torch.testing.assert_close(out.cpu(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-4, rtol=1e-5)
