"""The `mlakit` command line: `backends` and `check`, run through click's CliRunner."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from mlakit.cli import EXIT_CONFIG_ERROR, main
from mlakit import ConfigError, DeviceInfo, MLAShape, ServingConfig, resolve
from mlakit.registry import all_records, backend_names, get_backend

# These tests describe `mlakit` run on a CPU-only machine (CI); on a GPU machine the local device differs.
cpu_machine_only = pytest.mark.skipif(torch.cuda.is_available(), reason="describes a CPU-only machine")

WIDE = {"COLUMNS": "160"}  # rich tables are laid out for this width, whatever the test terminal is


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=WIDE if env is None else env)


def stderr_of(result) -> str:
    """stderr where click keeps it apart (8.2+), else the mixed output."""
    try:
        return result.stderr
    except ValueError:  # click < 8.2 without mix_stderr=False
        return result.output


def stdout_of(result) -> str:
    return getattr(result, "stdout", result.output)


def check_json(*args: str) -> dict:
    result = invoke("check", "--json", *args)
    assert result.exit_code == 0, stderr_of(result) + repr(result.exception)
    return json.loads(stdout_of(result))


def check_error(*args: str) -> str:
    result = invoke("check", *args)
    assert result.exit_code == EXIT_CONFIG_ERROR == 2, (result.exit_code, result.output, repr(result.exception))
    assert isinstance(result.exception, SystemExit)
    message = stderr_of(result)
    assert message.startswith("error: ") and message.count("\n") == 1, message
    assert "Traceback" not in result.output
    return message


MLA_CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "num_attention_heads": 16,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "q_lora_rank": None,
    "rope_scaling": {"type": "yarn", "factor": 40, "mscale_all_dim": 0.707},
}


@pytest.fixture
def mla_config(tmp_path):
    path = tmp_path / "small-mla" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(MLA_CONFIG))
    return path


# --- backends ---------------------------------------------------------------------------------------------


@cpu_machine_only
def test_backends_json_lists_every_registered_backend():
    result = invoke("backends", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(stdout_of(result))
    assert data["device"] == "cpu"
    rows = {row["name"]: row for row in data["backends"]}
    assert [row["name"] for row in data["backends"]] == backend_names()
    for record in all_records():
        row = rows[record.name]
        assert row == record.describe_capabilities() | {
            "mlakit_phases": row["mlakit_phases"], "usable_here": row["usable_here"], "why_not": row["why_not"]
        }
        assert row["usable_here"] == (not row["why_not"])


@cpu_machine_only
def test_backends_json_reference_usable_here_vendors_not():
    rows = {row["name"]: row for row in json.loads(stdout_of(invoke("backends", "--json")))["backends"]}
    assert rows["reference"]["usable_here"] is True
    assert rows["reference"]["why_not"] == []
    assert rows["reference"]["kv_dtypes"] == ["bf16", "fp16", "fp8_e4m3"]
    vendors = [name for name in rows if name != "reference"]
    assert vendors
    for name in vendors:
        assert rows[name]["usable_here"] is False
        assert rows[name]["why_not"], name
    assert rows["flashmla"]["why_not"][0] == "runs on cuda, not on cpu"
    assert rows["intel_xpu"]["why_not"][0] == "runs on xpu, not on cpu"
    assert rows["flashmla"]["page_sizes"] == "{64}"
    assert rows["cutedsl_mla"]["prefill_fallback"] == "trtllm_mla"
    assert rows["trtllm_mla"]["workspace"] == {
        "family": "trtllm_gen",
        "formula": "150 MiB, zero-filled once (holds the kernels' semaphores)",
        "zero_filled": True,
    }
    assert rows["tokenspeed_mla"]["max_decode_q_len"] == 8
    assert [name for name, row in rows.items() if row["tree_drafts"]] == []


def test_backends_mark_phases_mlakit_has_no_adapter_for():
    rows = {row["name"]: row for row in json.loads(stdout_of(invoke("backends", "--json")))["backends"]}
    assert rows["triton"]["mlakit_phases"] == rows["reference"]["mlakit_phases"] == ["decode", "prefill"]
    for name in ("trtllm_mla", "flashinfer_mla", "tokenspeed_mla"):
        assert rows[name]["phases"] == ["decode", "prefill"] and rows[name]["mlakit_phases"] == ["decode"], name
    out = stdout_of(invoke("backends"))
    assert "*: the kernel can do it, but mlakit has no adapter for it yet" in out


@cpu_machine_only
def test_backends_table_shows_every_backend_and_why_vendors_are_not_usable():
    result = invoke("backends")
    assert result.exit_code == 0, result.output
    out = stdout_of(result)
    assert "mlakit backends (this machine: cpu, cpu)" in out
    for name in backend_names():
        assert name in out
    reference_row = next(line for line in out.splitlines() if "│ reference " in line)
    assert reference_row.rstrip(" │").endswith("yes")
    assert "flashmla: not usable here: runs on cuda, not on cpu" in out
    assert "reference: not usable here" not in out


def test_backends_table_keeps_backend_names_at_80_columns():
    out = stdout_of(invoke("backends", env={"COLUMNS": "80"}))
    rows = [line for line in out.splitlines() if line.startswith("│")]
    for name in backend_names():
        assert any(line.startswith(f"│ {name} ") for line in rows), name


# --- check: plans -----------------------------------------------------------------------------------------


@cpu_machine_only
def test_check_prints_the_plan_for_this_cpu():
    result = invoke("check")
    assert result.exit_code == 0, stderr_of(result)
    out = stdout_of(result)
    assert "mlakit plan" in out
    for key, value in [("decode_backend", "reference"), ("prefill_backend", "reference"), ("page_size", "64"),
                       ("kv_cache_dtype", "bf16"), ("model_heads", "128"), ("heads_per_rank", "128")]:
        assert any(key in line and f" {value} " in line for line in out.splitlines()), (key, value)
    assert "note: decode backend: reference (auto: highest-priority backend that fits cpu)" in out
    assert "note: cuda_graphs: off (auto: the device is cpu)" in out


def test_check_table_shows_workspaces_and_hypothetical_device():
    out = stdout_of(invoke("check", "--device-arch", "sm100", "--decode-backend", "cutedsl_mla"))
    assert "workspace cutedsl" in out and "150.0 MiB for cutedsl_mla" in out
    assert "hypothetical sm100 (sm100, hypothetical)" in out
    # trtllm_mla's prefill has no mlakit adapter yet, so cutedsl's declared fallback is passed over, saying why
    assert "prefill fallback trtllm_mla does not fit (states prefill, but mlakit has no adapter" in out
    assert any("prefill_backend" in line and " triton " in line for line in out.splitlines())
    out = stdout_of(invoke("check", "--device-arch", "sm100", "--decode-backend", "trtllm_mla"))
    assert "workspace trtllm_gen" in out and "150.0 MiB for trtllm_mla" in out


@cpu_machine_only
def test_check_json_has_the_expected_fields():
    plan = check_json()
    assert {
        "device", "model_heads", "tp_size", "heads_per_rank", "kv_lora_rank", "qk_rope_head_dim", "softmax_scale",
        "prefill_backend", "decode_backend", "page_size", "kv_cache_dtype", "decode_q_len", "cuda_graphs",
        "max_batch_size", "max_context_len", "workspaces", "notes",
    } <= set(plan)
    assert plan["device"] == {"kind": "cpu", "arch": "cpu", "name": "cpu", "local": True}
    assert (plan["decode_backend"], plan["prefill_backend"], plan["page_size"], plan["kv_cache_dtype"]) == ("reference", "reference", 64, "bf16")
    assert (plan["model_heads"], plan["heads_per_rank"], plan["kv_lora_rank"], plan["qk_rope_head_dim"]) == (128, 128, 512, 64)
    assert plan["softmax_scale"] == pytest.approx(192**-0.5 * 1.3689**2, rel=1e-3)
    assert (plan["decode_q_len"], plan["cuda_graphs"], plan["max_batch_size"], plan["max_context_len"]) == (1, False, 256, 32768)
    assert plan["workspaces"] == []
    assert any(n.startswith("page_size: 64 (chosen") for n in plan["notes"])


def test_check_json_cutedsl_on_sm100_gets_triton_prefill_and_its_workspace():
    plan = check_json("--device-arch", "sm100", "--decode-backend", "cutedsl_mla")
    assert plan["device"]["arch"] == "sm100" and plan["device"]["local"] is False
    assert (plan["prefill_backend"], plan["decode_backend"]) == ("triton", "cutedsl_mla")
    assert plan["cuda_graphs"] is True
    families = {w["family"]: w for w in plan["workspaces"]}
    assert set(families) == {"cutedsl"}
    assert families["cutedsl"]["backends"] == ["cutedsl_mla"] and families["cutedsl"]["zero_filled"] is False
    assert any(n.startswith("cutedsl_mla's prefill fallback trtllm_mla does not fit (states prefill, but mlakit has no adapter")
               for n in plan["notes"])


def test_check_json_passes_every_option_through():
    plan = check_json(
        "--model", "kimi-k2", "--device-arch", "sm100", "--attention-backend", "tokenspeed_mla", "--page-size", "32",
        "--tp-size", "4", "--speculative-num-draft-tokens", "3", "--max-batch-size", "8", "--max-context-len", "1024",
        "--no-cuda-graphs",
    )
    assert (plan["model_heads"], plan["tp_size"], plan["heads_per_rank"]) == (64, 4, 16)
    assert (plan["prefill_backend"], plan["decode_backend"]) == ("triton", "tokenspeed_mla")
    assert "prefill backend: triton (automatic, mlakit has no adapter for tokenspeed_mla's prefill kernel yet" in " ".join(plan["notes"])
    assert (plan["page_size"], plan["kv_cache_dtype"], plan["decode_q_len"]) == (32, "fp8_e4m3", 4)
    assert (plan["max_batch_size"], plan["max_context_len"], plan["cuda_graphs"]) == (8, 1024, False)
    assert plan["workspaces"][0]["nbytes"] == 148 * 16 * 8 * 513 * 4


def test_check_json_passes_the_speculative_modes_through():
    plan = check_json("--device-arch", "sm90", "--decode-backend", "triton", "--speculative-num-draft-tokens", "2",
                      "--speculative-eagle-topk", "1", "--speculative-uneven-drafts")
    assert (plan["decode_backend"], plan["decode_q_len"]) == ("triton", 3)
    assert (
        "speculative decoding: chain drafts (topk 1), target verify with 2 draft tokens (3 query tokens per sequence) "
        "through triton's decode kernel; draft decode steps: q_len 1; draft extend: triton's latent extend; "
        "uneven drafts: through triton's latent extend"
    ) in plan["notes"]
    plan = check_json("--device-arch", "sm90", "--speculative-num-draft-tokens", "2", "--no-speculative-uneven-drafts")
    assert plan["decode_backend"] == "flashmla"
    assert any(n.startswith("speculative decoding:") and n.endswith("uneven drafts: off") for n in plan["notes"])


def test_check_uneven_drafts_on_sm90_auto_skip_flashmla():
    plan = check_json("--device-arch", "sm90", "--speculative-num-draft-tokens", "1", "--speculative-uneven-drafts")
    assert plan["decode_backend"] == "triton"
    assert any("skipped flashmla (speculative_uneven_drafts needs a latent-form extend kernel" in n for n in plan["notes"])


def test_check_tree_drafts_are_refused_naming_the_backend_and_the_setting():
    message = check_error("--device-arch", "sm90", "--decode-backend", "triton", "--speculative-num-draft-tokens", "3",
                          "--speculative-eagle-topk", "2")
    assert "decode_backend 'triton' cannot serve this configuration on sm90" in message
    assert "speculative_eagle_topk=2 (tree drafts) is not supported; it verifies chains only (topk 1)" in message
    assert "no registered backend fits this decode configuration as it stands" in message
    message = check_error("--device-arch", "sm90", "--speculative-num-draft-tokens", "3", "--speculative-eagle-topk", "2")
    assert "no registered backend can serve decode for this configuration on sm90" in message
    assert message.count("speculative_eagle_topk=2 (tree drafts) is not supported") == len(backend_names())


def test_check_auto_on_sm90_picks_flashmla_and_page_16_skips_it():
    assert check_json("--device-arch", "sm90")["decode_backend"] == "flashmla"
    plan = check_json("--device-arch", "sm90", "--page-size", "16")
    assert (plan["decode_backend"], plan["page_size"]) == ("flashinfer_mla", 16)
    assert any("skipped flashmla (page_size 16 is not supported" in n for n in plan["notes"])


@pytest.mark.parametrize("as_dir", [False, True])
def test_check_reads_a_hugging_face_config(mla_config, as_dir):
    path = mla_config.parent if as_dir else mla_config
    plan = check_json("--config", str(path), "--device-arch", "sm90", "--tp-size", "2")
    assert (plan["model_heads"], plan["heads_per_rank"], plan["kv_lora_rank"]) == (16, 8, 512)
    assert plan["decode_backend"] == "flashmla"
    assert plan["softmax_scale"] == pytest.approx(192**-0.5 * (0.1 * 0.707 * 3.6888794541 + 1) ** 2, rel=1e-6)


# --- check: errors exit 2 with the message on stderr ------------------------------------------------------


def test_check_flashmla_page_32_on_sm90_fails_naming_allowed_sizes():
    message = check_error("--device-arch", "sm90", "--attention-backend", "flashmla", "--page-size", "32")
    assert "decode_backend 'flashmla' cannot serve this configuration on sm90" in message
    assert "page_size 32 is not supported; allowed page sizes: {64}" in message
    listed = message.split("backends that fit this decode configuration: ")[1].strip().split(", ")
    assert listed == [name for name in backend_names() if _fits_sm90_page_32(name)]
    assert listed[0] == "flashinfer_mla" and listed[-2:] == ["reference", "triton_fp8"] and "flashmla" not in listed


def _fits_sm90_page_32(name: str) -> bool:
    try:
        resolve(ServingConfig(decode_backend=name, page_size=32), MLAShape.preset("deepseek-v3"), DeviceInfo.from_arch("sm90"))
    except ConfigError:
        return False
    return True


def test_check_error_output_has_no_plan():
    result = invoke("check", "--device-arch", "sm90", "--attention-backend", "flashmla", "--page-size", "32", "--json")
    assert result.exit_code == 2
    assert "mlakit plan" not in stdout_of(result)
    with pytest.raises(json.JSONDecodeError):
        json.loads(stdout_of(result))


def test_check_tp_size_that_does_not_divide_heads():
    message = check_error("--tp-size", "3")
    assert "tp_size=3 does not divide num_heads=128; use one of [1, 2, 4, 8, 16, 32, 64, 128]" in message


def test_check_model_and_config_together():
    assert "--model and --config: expected one of them, got both" in check_error("--model", "deepseek-v3", "--config", "x")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--attention-backend", "nope"], "unknown backend 'nope'; registered backends: "),
        (["--device-arch", "sm100", "--attention-backend", "intel_xpu"], "runs on xpu, not on cuda"),
        (["--device-arch", "xpu", "--attention-backend", "intel_xpu", "--speculative-num-draft-tokens", "1"],
         "speculative_num_draft_tokens=1 (2 query tokens per sequence in decode) is not supported"),
        (["--device-arch", "sm100", "--attention-backend", "tokenspeed_mla", "--kv-cache-dtype", "bf16"],
         "kv_cache_dtype 'bf16' is not supported; allowed: ['fp8_e4m3']"),
        (["--device-arch", "sm90", "--attention-backend", "flashmla", "--model", "minicpm3"],
         "kv_lora_rank 256 is not supported; allowed: [512]"),
        (["--device-arch", "sm90", "--prefill-backend", "flashmla"], "does not do prefill (it is decode only)"),
        (["--cuda-graphs", "--device-arch", "cpu"], "cuda_graphs=True needs a CUDA device; the device is cpu"),
        (["--page-size", "0"], "page_size must be a positive integer or None"),
        (["--speculative-num-draft-tokens", "-1"], "speculative_num_draft_tokens must be an integer >= 0, got -1"),
        (["--speculative-eagle-topk", "0"], "speculative_eagle_topk must be an integer >= 1, got 0"),
        (["--speculative-eagle-topk", "2"], "speculative_eagle_topk=2 (tree drafts) needs speculative decoding"),
        (["--speculative-uneven-drafts"], "speculative_uneven_drafts needs speculative decoding"),
        (["--device-arch", "sm90", "--decode-backend", "flashmla", "--speculative-num-draft-tokens", "1", "--speculative-uneven-drafts"],
         "decode_backend 'flashmla' cannot serve this configuration on sm90: "
         "speculative_uneven_drafts needs a latent-form extend kernel, which it lacks; "
         "backends that fit this decode configuration: triton, reference"),
        (["--device-arch", "sm9"], "device arch 'sm9' is not one of cpu, xpu, sm70, sm72, sm75, sm80"),
        (["--device-arch", "sm900"], "device arch 'sm900' is not one of cpu, xpu, sm70"),
        (["--device-arch", "sm60"], "device arch 'sm60' is not one of cpu, xpu, sm70"),
        (["--config", "/nonexistent/mlakit/config.json"], "does not exist; pass a config.json or its directory"),
    ],
)
def test_check_config_errors(args, expected):
    assert expected in check_error(*args)


def test_check_unknown_backend_lists_every_registered_name():
    message = check_error("--attention-backend", "nope")
    assert str(backend_names()) in message


@cpu_machine_only
def test_check_vendor_backend_on_this_cpu_names_the_missing_package():
    if not get_backend("flashmla").record.missing_packages():
        pytest.skip("flash_mla is installed here")
    message = check_error("--attention-backend", "flashmla")
    assert "decode_backend 'flashmla' cannot serve this configuration on cpu" in message
    assert "runs on cuda, not on cpu" in message
    assert "needs package flash_mla, not installed here" in message


def test_check_non_mla_config_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}))
    message = check_error("--config", str(path))
    assert "config.json: not an MLA (DeepSeek-style) config: missing ['kv_lora_rank'" in message


def test_check_invalid_json_config_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert "config.json: not valid JSON" in check_error("--config", str(path))


def test_check_minicpm3_config_on_sm90_skips_backends_fixed_to_512(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_attention_heads": 40, "kv_lora_rank": 256, "qk_nope_head_dim": 64,
                                "qk_rope_head_dim": 32, "v_head_dim": 64, "q_lora_rank": 768}))
    plan = check_json("--config", str(path), "--device-arch", "sm90")
    assert (plan["model_heads"], plan["kv_lora_rank"], plan["qk_rope_head_dim"]) == (40, 256, 32)
    for phase in ("decode", "prefill"):
        ranks = get_backend(plan[f"{phase}_backend"]).record.kv_lora_ranks
        assert ranks is None or 256 in ranks, plan[f"{phase}_backend"]
    assert any("skipped flashmla (kv_lora_rank 256 is not supported" in n for n in plan["notes"])


@pytest.mark.parametrize(
    "content, expected",
    [
        ("[]", "JSON object"),
        (json.dumps(MLA_CONFIG | {"num_attention_heads": "x"}), "config.json: num_attention_heads: expected an integer >= 1, got 'x'"),
        (json.dumps(MLA_CONFIG | {"num_attention_heads": 16.5}), "config.json: num_attention_heads: expected an integer >= 1, got 16.5"),
        (json.dumps(MLA_CONFIG | {"rope_scaling": "yarn"}), "rope_scaling"),
    ],
    ids=["json-array", "non-integer-heads", "fractional-heads", "string-rope-scaling"],
)
def test_check_malformed_config_is_a_config_error(tmp_path, content, expected):
    path = tmp_path / "config.json"
    path.write_text(content)
    message = check_error("--config", str(path))
    assert expected in message


def test_python_dash_m_mlakit_runs_the_command_line():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mlakit", "backends", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {row["name"] for row in json.loads(result.stdout)["backends"]} == set(backend_names())
