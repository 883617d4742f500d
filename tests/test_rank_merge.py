"""The Triton merge of ranks' partial attention results (`kernels.rank_merge.merge_partials`)
against `reference.merge_attention_states` folded over the ranks, under the interpreter on CPU."""

from __future__ import annotations

import pytest
import torch

from mlakit.errors import MLAInputError
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
