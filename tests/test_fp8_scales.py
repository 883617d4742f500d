"""fp8 cache scales and saturation: auto and calibrated per-tensor scales, exact saturation and
non-finite counts (torch write and the Triton write alike), NaN for non-finite inputs, the
Runner's FP8SaturationWarning, and argument checks."""

import importlib.util
import math
import warnings
from pathlib import Path

import pytest
import torch

from mlakit import ConfigError, FP8SaturationWarning, MLAInputError, PagedLatentCache
from mlakit.cache import FP8Counts, LatentStore
from mlakit.cache.kv_quant import AUTO_SCALE_HEADROOM, FP8_MAX, FP8_SATURATION, SCALE_GROUP, dequantize
from mlakit.serving.graphs import capture_graph
from mlakit.kernels.cache_write import write_rows
from mlakit.model.deepseek import DeepseekConfig, DeepseekForCausalLM
from mlakit.model.runner import Request, Runner
from host_sync import forbidding_host_syncs

DIM = 288  # two full 128-channel groups and a short one


def _rows(n, seed, dim=DIM, magnitude=3.0):
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)) * magnitude


def _plant(rows, count, values, seed):
    """`rows` with `count` distinct random positions set to random picks of `values`; the positions."""
    gen = torch.Generator().manual_seed(seed)
    flat = rows.clone().view(-1)
    positions = torch.randperm(flat.numel(), generator=gen)[:count]
    flat[positions] = torch.tensor(values)[torch.randint(len(values), (count,), generator=gen)]
    return flat.view(rows.shape), positions


def _bytes(store):
    return store.data.cpu().view(torch.uint8)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's 3e38 / 0.5
@pytest.mark.parametrize("path", ["torch", "kernel"])
def test_saturation_count_is_exact_and_in_range_values_are_not_counted(path, kernel_device):
    device = kernel_device if path == "kernel" else "cpu"
    store = LatentStore(4, 8, DIM, dtype="fp8_e4m3", fp8_scale=0.5, device=device)
    rows = _rows(12, seed=1)  # |value / 0.5| stays far below 448
    rows, _ = _plant(rows, 5, [0.5 * (FP8_MAX + 1), -0.5 * (FP8_SATURATION - 1)], seed=2)  # rounds to 448: not counted
    rows, saturating = _plant(rows, 37, [1e6, -1e6, 300.0, -2.0 * FP8_SATURATION, 3e38], seed=3)
    slots = torch.randperm(32, generator=torch.Generator().manual_seed(4))[:12]
    if path == "kernel":
        write_rows(store.data, store.scale, slots.to(device), rows.to(device), store.fp8_counts)
    else:
        store.write_slots(slots, rows)
    assert store.fp8_counts.tolist() == [37, 0]
    stored = store.dequantized().cpu().view(-1, DIM)[slots].view(-1)
    assert (stored[saturating].abs() == 0.5 * FP8_MAX).all()
    store.write_slots(slots.to(device), _rows(12, seed=5).to(device))
    assert store.fp8_counts.tolist() == [37, 0], "in-range values must not be counted"


@pytest.mark.parametrize("layout", ["tensor", "group"])
def test_non_finite_inputs_are_stored_as_nan_counted_and_leave_their_group_intact(layout):
    store = LatentStore(2, 8, DIM, dtype="fp8_e4m3", scale_layout=layout)
    rows, bad = _plant(_rows(10, seed=6), 9, [math.inf, -math.inf, math.nan], seed=7)
    store.write_slots(torch.arange(10), rows)
    assert store.fp8_counts.tolist() == [0, 9]
    stored = store.dequantized().view(-1, DIM)[:10]
    assert stored.view(-1)[bad].isnan().all() and stored.isnan().sum() == 9
    finite = rows.isfinite()
    if layout == "group":
        assert store.scale.isfinite().all()
        padded = torch.nn.functional.pad(torch.where(finite, rows, 0).abs(), (0, 3 * SCALE_GROUP - DIM))
        group_amax = padded.view(10, 3, SCALE_GROUP).amax(-1).repeat_interleave(SCALE_GROUP, -1)[:, :DIM]
        bound = group_amax * 2**-4  # e4m3 rounding relative to the group's largest finite value
    else:
        bound = rows.abs().clamp_min(2**-6) * 2**-4
    assert ((stored - rows).abs() <= bound)[finite].all()


@pytest.mark.parametrize("layout", ["tensor", "group"])
def test_kernel_write_is_byte_identical_to_torch_with_counts(layout, kernel_device):
    fp8_scale = 0.125 if layout == "tensor" else None
    expected = LatentStore(6, 4, DIM, dtype="fp8_e4m3", scale_layout=layout, fp8_scale=fp8_scale)
    got = LatentStore(6, 4, DIM, dtype="fp8_e4m3", scale_layout=layout, fp8_scale=fp8_scale, device=kernel_device)
    rows, _ = _plant(_rows(9, seed=8), 30, [1e4, -1e4, 1e30, math.inf, -math.inf, math.nan], seed=9)
    slots = torch.tensor([3, -1, 17, 0, 22, -1, 9, 10, 11])
    expected.write_slots(slots, rows)
    write_rows(got.data, got.scale, slots.to(kernel_device), rows.to(kernel_device), got.fp8_counts)
    assert torch.equal(_bytes(got), _bytes(expected))
    assert torch.equal(got.scale.cpu(), expected.scale)
    assert got.fp8_counts.tolist() == expected.fp8_counts.tolist()
    assert expected.fp8_counts[1] > 0 and (layout == "group") == (expected.fp8_counts[0] == 0)


def test_auto_scale_is_set_by_the_first_write_and_stays_fixed():
    cache = PagedLatentCache(8, 4, 256, 32, dtype="fp8_e4m3", fp8_scale="auto", num_layers=2)
    first = _rows(6, seed=10, dim=288)
    first[2, 7] = math.inf  # neither non-finite values nor padding rows set the scale
    slots = cache.reserve(0, 6)
    slots[4] = -1
    first[4] *= 1000
    cache.layer(1).write_slots(slots, first)
    amax = torch.where(first.isfinite(), first.abs(), 0)[[0, 1, 2, 3, 5]].amax()
    assert torch.equal(cache.layer(1).scale, (amax * AUTO_SCALE_HEADROOM / FP8_MAX).reshape(1))
    assert cache.layer(0).scale.item() == 1.0 and cache.layer(0).awaiting_auto_scale
    cache.layer(1).write_slots(cache.reserve(0, 3), _rows(3, seed=11, dim=288) * 1000)
    assert torch.equal(cache.layer(1).scale, (amax * AUTO_SCALE_HEADROOM / FP8_MAX).reshape(1)), "the scale must stay fixed"
    counts = cache.fp8_saturation_counts()
    assert counts[0] == FP8Counts(0, 0) and counts[1].non_finite == 1 and counts[1].saturated > 100


def test_auto_scale_keeps_one_when_the_first_write_has_no_finite_non_zero_value():
    store = LatentStore(1, 4, DIM, dtype="fp8_e4m3", fp8_scale="auto")
    store.write_slots(torch.tensor([0, -1]), torch.stack([torch.full((DIM,), math.nan), _rows(1, seed=12)[0]]))
    assert store.scale.item() == 1.0 and not store.awaiting_auto_scale


def test_auto_scale_is_not_decided_by_a_write_of_padding_rows_only():
    """A warm-up on padding (slots -1, e.g. a CUDA-graph bucket's dummy rows) must leave the scale
    undecided, whatever its rows hold; the next write's real rows then set it."""
    store = LatentStore(4, 4, DIM, dtype="fp8_e4m3", fp8_scale="auto")
    padding, _ = _plant(_rows(5, seed=13, magnitude=1e4), 7, [math.inf, -math.inf, math.nan], seed=14)
    store.write_slots(torch.full((5,), -1), padding)
    store.write_slots(torch.full((3,), -1, dtype=torch.int32), _rows(3, seed=15, magnitude=1e-3))
    assert store.awaiting_auto_scale and store.scale.item() == 1.0
    assert store.fp8_counts.tolist() == [0, 0] and store.data.view(torch.uint8).eq(0).all(), "padding rows are not written"
    real = _rows(6, seed=16, magnitude=0.25)
    slots = torch.randperm(16, generator=torch.Generator().manual_seed(17))[:6]
    store.write_slots(slots, real)
    expected = (real.abs().amax() * AUTO_SCALE_HEADROOM / FP8_MAX).reshape(1)
    assert not store.awaiting_auto_scale and torch.equal(store.scale, expected)
    assert torch.equal(store.dequantized().view(-1, DIM)[slots], dequantize(store.data.view(-1, DIM)[slots], expected))
    store.write_slots(slots[:2], _rows(2, seed=18, magnitude=50.0))
    assert torch.equal(store.scale, expected), "the scale must stay fixed once real rows set it"


def test_auto_scale_of_a_mixed_write_comes_from_its_real_rows_only():
    store = LatentStore(4, 4, DIM, dtype="fp8_e4m3", fp8_scale="auto")
    store.write_slots(torch.tensor([-1, -1]), _rows(2, seed=19, magnitude=1e3))  # padding only: undecided
    rows = _rows(7, seed=20, magnitude=0.5)
    padded = torch.tensor([1, 4, 6])
    rows[padded] = _plant(_rows(3, seed=21, magnitude=1e5), 4, [math.inf, math.nan], seed=22)[0]
    slots = torch.tensor([2, -1, 9, 5, -1, 14, -1])
    store.write_slots(slots, rows)
    real_rows = rows[[0, 2, 3, 5]]
    assert not store.awaiting_auto_scale
    assert torch.equal(store.scale, (real_rows.abs().amax() * AUTO_SCALE_HEADROOM / FP8_MAX).reshape(1))
    assert store.fp8_counts.tolist() == [0, 0], "padding rows' values are neither stored nor counted"


def test_calibrate_decides_an_auto_scale_that_padding_left_undecided():
    store = LatentStore(2, 4, DIM, dtype="fp8_e4m3", fp8_scale="auto")
    store.write_slots(torch.tensor([-1]), _rows(1, seed=23))
    samples = _rows(5, seed=24, magnitude=7.0)
    assert store.calibrate_fp8_scale(samples) == pytest.approx(samples.abs().max().item() * AUTO_SCALE_HEADROOM / FP8_MAX)
    calibrated = store.scale.clone()
    assert not store.awaiting_auto_scale
    store.write_slots(torch.tensor([0, 3]), _rows(2, seed=25, magnitude=100.0))
    assert torch.equal(store.scale, calibrated)


def test_calibration_sets_each_layers_scale_from_its_samples():
    cache = PagedLatentCache(4, 8, 256, 32, dtype="fp8_e4m3", fp8_scale="auto", num_layers=3)
    samples = [_rows(50, seed=20 + layer, dim=288, magnitude=10.0**layer) for layer in range(3)]
    scales = cache.calibrate_fp8_scale(samples)
    for layer, (store, rows) in enumerate(zip(cache.stores, samples)):
        assert scales[layer] == pytest.approx(rows.abs().max().item() * AUTO_SCALE_HEADROOM / FP8_MAX, rel=1e-6)
        assert store.scale.item() == scales[layer] and not store.awaiting_auto_scale
        store.write_slots(cache.reserve(layer, 8), rows[:8] / 4)  # smaller values must not reset the scale
        assert store.scale.item() == scales[layer]
    assert cache.fp8_saturation_counts() == [FP8Counts(0, 0)] * 3


def test_per_layer_static_scales_from_a_checkpoint():
    cache = PagedLatentCache(2, 4, 64, 16, dtype="fp8_e4m3", fp8_scale=[0.5, 2, 0.03125], num_layers=3)
    assert [store.scale.item() for store in cache.stores] == [0.5, 2.0, 0.03125]


def _tiny_model(layers=2):
    torch.manual_seed(0)
    config = DeepseekConfig.from_hf_config(dict(
        model_type="deepseek_v3", vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
        num_attention_heads=2, kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
        q_lora_rank=32, rope_theta=10000.0, max_position_embeddings=128,
    ))
    return DeepseekForCausalLM(config).eval()


def _generate(cache):
    runner = Runner(_tiny_model(), cache, decode_backend="reference")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.generate([Request([5, 17, 99, 3], 4), Request(list(range(10, 22)), 3)])
    return [w for w in caught if issubclass(w.category, FP8SaturationWarning)]


def test_runner_warns_once_per_layer_when_saturation_grows():
    cache = PagedLatentCache(16, 4, 64, 16, dtype="fp8_e4m3", fp8_scale=1e-3, num_layers=2)
    caught = _generate(cache)
    counts = cache.fp8_saturation_counts()
    assert all(c.saturated > 0 and c.non_finite == 0 for c in counts)
    steps = 1 + 3  # one prefill of both requests, then decodes until the longer one has 4 tokens
    assert len(caught) == 2 * steps
    first = [str(w.message) for w in caught[:2]]
    assert first[0].startswith("fp8 KV cache layer 0:") and first[1].startswith("fp8 KV cache layer 1:")
    assert "saturated at +-448" in first[0] and "fp8_scale='auto'" in first[0]


@pytest.mark.parametrize("layout, fp8_scale", [("group", None), ("tensor", "auto")])
def test_runner_does_not_warn_without_saturation(layout, fp8_scale):
    cache = PagedLatentCache(16, 4, 64, 16, dtype="fp8_e4m3", scale_layout=layout, fp8_scale=fp8_scale, num_layers=2)
    assert _generate(cache) == []
    assert cache.fp8_saturation_counts() == [FP8Counts(0, 0)] * 2


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0, -1.0, True, "1.0", "AUTO", [1.0]])
def test_fp8_scale_must_be_a_finite_positive_number_or_auto(bad):
    with pytest.raises(ConfigError, match="fp8_scale must be a finite number > 0 or 'auto'"):
        LatentStore(1, 4, 8, dtype="fp8_e4m3", fp8_scale=bad)


@pytest.mark.parametrize("dtype, layout", [("bf16", "tensor"), ("fp32", "tensor"), ("fp8_e4m3", "group")])
def test_fp8_scale_is_refused_where_it_means_nothing(dtype, layout):
    for fp8_scale in (0.5, "auto"):
        with pytest.raises(ConfigError, match="fp8_scale applies to dtype='fp8_e4m3' with scale_layout='tensor'"):
            PagedLatentCache(1, 4, 8, 8, dtype=dtype, scale_layout=layout, fp8_scale=fp8_scale)
    cache = PagedLatentCache(1, 4, 8, 8, dtype=dtype, scale_layout=layout)
    with pytest.raises(ConfigError, match="calibrate_fp8_scale needs dtype='fp8_e4m3' with scale_layout='tensor'"):
        cache.calibrate_fp8_scale([_rows(2, seed=30, dim=16)])
    if dtype != "fp8_e4m3":
        with pytest.raises(ConfigError, match="fp8_saturation_counts needs an fp8_e4m3 cache"):
            cache.fp8_saturation_counts()


def test_calibration_and_per_layer_scale_arguments_are_checked():
    with pytest.raises(ConfigError, match=r"fp8_scale: expected one scale per layer \(2\), got 3"):
        PagedLatentCache(1, 4, 8, 8, dtype="fp8_e4m3", fp8_scale=[1.0, 1.0, 1.0], num_layers=2)
    cache = PagedLatentCache(1, 4, 8, 8, dtype="fp8_e4m3", num_layers=2)
    with pytest.raises(MLAInputError, match=r"samples: expected one tensor per layer \(2\), got 1"):
        cache.calibrate_fp8_scale([_rows(2, seed=31, dim=16)])
    store = cache.layer(0)
    for headroom in (0.5, math.nan, math.inf, True):
        with pytest.raises(ConfigError, match="headroom must be a finite number >= 1"):
            store.calibrate_fp8_scale(_rows(2, seed=32, dim=16), headroom)
    for samples in (_rows(2, seed=33, dim=15), _rows(2, seed=34, dim=16)[0], _rows(0, seed=35, dim=16), [[1.0] * 16]):
        with pytest.raises(MLAInputError, match=r"samples: expected a tensor \[rows, 16\]"):
            store.calibrate_fp8_scale(samples)
    with pytest.raises(MLAInputError, match="samples: expected at least one finite non-zero value"):
        store.calibrate_fp8_scale(torch.tensor([[0.0] * 15 + [math.inf]]))
    assert store.scale.item() == 1.0


def test_fp8_kernel_write_needs_a_counter(kernel_device):
    store = LatentStore(1, 4, 8, dtype="fp8_e4m3", device=kernel_device)
    slots, rows = torch.arange(2, device=kernel_device), torch.randn(2, 8, device=kernel_device)
    for counts in (None, torch.zeros(2, dtype=torch.int32, device=kernel_device)):
        with pytest.raises(ValueError, match=r"counts: expected an int64 \[2\] tensor"):
            write_rows(store.data, store.scale, slots, rows, counts)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tensor", "group"])
def test_cuda_write_counts_and_replays_from_a_graph_with_the_counter(layout):
    fp8_scale = 0.5 if layout == "tensor" else None
    store = LatentStore(8, 16, 576, dtype="fp8_e4m3", scale_layout=layout, fp8_scale=fp8_scale, device="cuda")
    expected = LatentStore(8, 16, 576, dtype="fp8_e4m3", scale_layout=layout, fp8_scale=fp8_scale)
    slots = torch.full((4,), -1, dtype=torch.int64, device="cuda")
    rows = torch.zeros(4, 576, device="cuda")
    graph, _ = capture_graph(lambda: store.write_slots(slots, rows, check_values=False), warmup=1, forbid_host_sync=True)
    for replay in range(3):
        new_slots = torch.tensor([replay * 4, -1, 100 + replay, 50 - replay])
        new_rows, _ = _plant(_rows(4, seed=40 + replay, dim=576), 20, [1e6, -3e3, math.inf, math.nan], seed=50 + replay)
        slots.copy_(new_slots)
        rows.copy_(new_rows)
        graph.replay()
        expected.write_slots(new_slots, new_rows)
    assert torch.equal(_bytes(store), _bytes(expected)) and torch.equal(store.scale.cpu(), expected.scale)
    assert store.fp8_counts.tolist() == expected.fp8_counts.tolist() and expected.fp8_counts[1] > 0


@pytest.mark.gpu
def test_cuda_auto_scale_write_does_not_sync_and_refuses_capture_before_it_is_set():
    store = LatentStore(8, 16, 576, dtype="fp8_e4m3", fp8_scale="auto", device="cuda")
    rows = _rows(4, seed=60, dim=576).cuda()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(MLAInputError, match="CUDA graph is being captured"):
        with torch.cuda.graph(graph):
            store.write_slots(torch.arange(4, device="cuda"), rows, check_values=False)
    store = LatentStore(8, 16, 576, dtype="fp8_e4m3", fp8_scale="auto", device="cuda")
    slots = torch.tensor([0, -1, 2, 3], device="cuda")
    with forbidding_host_syncs():
        store.write_slots(slots, rows, check_values=False)
    amax = rows[[0, 2, 3]].abs().amax()
    assert torch.equal(store.scale, (amax * AUTO_SCALE_HEADROOM / FP8_MAX).reshape(1))


@pytest.mark.gpu
def test_cuda_auto_scale_padding_warm_up_leaves_it_unset_and_capture_waits_for_real_rows():
    store = LatentStore(8, 16, 576, dtype="fp8_e4m3", fp8_scale="auto", device="cuda")
    slots = torch.full((4,), -1, dtype=torch.int64, device="cuda")
    padding = _rows(4, seed=61, dim=576, magnitude=1e3).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        store.write_slots(slots, padding, check_values=False)  # a graph bucket's warm-up on padding rows: decides nothing, no sync
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert store.awaiting_auto_scale and store.scale.item() == 1.0
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(MLAInputError, match="CUDA graph is being captured"):
        with torch.cuda.graph(graph):
            store.write_slots(slots, padding, check_values=False)
    real = _rows(4, seed=62, dim=576).cuda()
    store.write_slots(torch.tensor([3, -1, 17, 40], device="cuda"), real)
    torch.cuda.synchronize()  # the pinned copy of the flag has landed: the next write sees the decision
    store.write_slots(slots, padding)
    assert store._auto_undecided is None
    expected = (real[[0, 2, 3]].abs().amax() * AUTO_SCALE_HEADROOM / FP8_MAX).reshape(1)
    assert torch.equal(store.scale, expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store.write_slots(slots, padding, check_values=False)
    graph.replay()
    assert torch.equal(store.scale, expected)


def _latent_error_experiment():
    path = Path(__file__).parents[1] / "benchmarks" / "experiments" / "fp8_latent_error.py"
    spec = importlib.util.spec_from_file_location("fp8_latent_error", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("magnitude", [1, 8])
def test_error_bounds_on_deepseek_like_latents_hold_as_the_readme_states(magnitude):
    stats = _latent_error_experiment().measure(tokens=512, seed=magnitude, magnitude=magnitude)
    for (name, part), s in stats.items():
        assert s["max_rel_normal"] <= 2**-4 / (1 + 2**-4) + 1e-6, (name, part)  # half a step of 3 mantissa bits
        if name.startswith("per token"):
            assert s["max_over_row_amax"] <= 16 / FP8_MAX + 1e-6 and s["saturated_pct"] == 0
        if name.startswith("tensor, auto") or name.startswith("tensor, calibrated"):
            assert s["frobenius"] < 0.03 and s["saturated_pct"] == 0
    static = stats[("tensor, static 1.0", "row")]
    assert (static["saturated_pct"] > 0.1 and static["frobenius"] > 0.3) if magnitude == 8 else static["frobenius"] < 0.03


def test_auto_and_calibrated_scales_stay_finite_where_amax_times_headroom_overflows():
    """Rows near float32's largest value: `amax * headroom` overflows, and an infinite scale would dequantize every
    row of the cache to NaN; the scale stops at float32's largest value instead."""
    cache = PagedLatentCache(4, 4, 8, 4, dtype="fp8_e4m3", fp8_scale="auto")
    cache.append(0, torch.full((2, 8), 3e38), torch.randn(2, 4, generator=torch.Generator().manual_seed(8)))
    assert bool(torch.isfinite(cache.scale).all()) and bool(torch.isfinite(cache.dequantized()[0, :2, :8]).all())
    assert math.isfinite(PagedLatentCache(4, 4, 8, 4, dtype="fp8_e4m3").calibrate_fp8_scale([torch.full((2, 12), 3e38)])[0])


def test_calibration_names_samples_given_as_one_tensor():
    cache = PagedLatentCache(2, 16, 8, 8, dtype="fp8_e4m3", num_layers=2)
    with pytest.raises(MLAInputError, match=r"samples: expected a list of one tensor per layer \(2\), got Tensor"):
        cache.calibrate_fp8_scale(torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(9)))
