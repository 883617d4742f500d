"""Fuzz of the command line (`mlakit generate`, `mlakit check`) with malformed options: a bad value
exits non-zero with a one-line message naming it and no Python traceback; a valid one exits 0."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_outcomes import FUZZ, probe
from fuzz_strategies import TINY_DEEPSEEK, save_tiny_deepseek
from mlakit.cli import main
from mlakit.errors import ConfigError

BAD_GENERATE_OPTIONS = {
    "--prompt-ids": st.sampled_from(["", ",", "1,,x", "-1", str(TINY_DEEPSEEK["vocab_size"]), "1.5"]),
    "--max-new-tokens": st.sampled_from(["0", "-3", "x", "1e3"]),
    "--temperature": st.sampled_from(["-1", "nan", "inf", "x"]),
    "--top-p": st.sampled_from(["0", "1.5", "nan", "-0.1"]),
    "--seed": st.sampled_from(["-1", "x", "1.5"]),
    "--cache-mb": st.sampled_from(["0", "-1", "x"]),
    "--backend": st.sampled_from(["nope", "flashmla", ""]),
    "--device": st.sampled_from(["nope", "cuda:99", "xpu"]),
    "--model": st.sampled_from(["/nonexistent", "/dev/null", "/"]),
}
OPTION_FIELDS = {"--prompt-ids": "prompt_ids", "--max-new-tokens": "max_new_tokens", "--top-p": "top_p",
                 "--cache-mb": "budget", "--backend": "backend", "--device": "device", "--model": "config.json"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_tiny_deepseek(tmp_path_factory.mktemp("tiny")))


def _invoke(args: list[str]) -> Result:
    """Runs the CLI; a clean refusal becomes a ConfigError carrying its message, anything else is returned."""
    result = CliRunner().invoke(main, args)
    assert "Traceback" not in result.output, result.output
    if result.exit_code == 0:
        return result
    assert isinstance(result.exception, SystemExit), f"{args}: {result.exception!r}"
    lines = [line for line in result.output.splitlines() if line.lower().startswith("error")]
    assert len(lines) == 1, result.output
    raise ConfigError(lines[0] + " " + result.output.replace("\n", " "))


@settings(FUZZ, max_examples=30)
@given(option=st.sampled_from(sorted(BAD_GENERATE_OPTIONS)), data=st.data())
def test_fuzz_generate_refuses_bad_options_in_one_line(model_dir, option, data):
    value = data.draw(BAD_GENERATE_OPTIONS[option])
    args = {"--model": model_dir, "--prompt-ids": "1,2,3", "--max-new-tokens": "2", "--cache-mb": "1"} | {option: value}
    blamed = (option, option.lstrip("-"), OPTION_FIELDS.get(option, option.lstrip("-").replace("-", "_")), "decode_backend")
    probe("mlakit generate", blamed, lambda: _invoke(["generate", *[word for pair in args.items() for word in pair]]))


CHECK_INT_OPTIONS = ("--page-size", "--tp-size", "--max-batch-size", "--max-context-len", "--speculative-num-draft-tokens",
                     "--speculative-eagle-topk")


@settings(FUZZ, max_examples=40)
@given(option=st.sampled_from(CHECK_INT_OPTIONS), value=st.integers(-3, 300) | st.sampled_from([2**70, "x", "2.5", ""]))
def test_fuzz_check_int_options_print_a_plan_or_one_line_error(option, value):
    args = ["check", "--json", option, str(value)]
    field = option.lstrip("-").replace("-", "_")

    def is_a_plan(result: Result) -> None:
        assert json.loads(result.output)["decode_backend"]

    probe("mlakit check", (option, field), lambda: _invoke(args), is_a_plan)


def test_regression_generate_with_a_bad_device_or_nan_temperature_exits_cleanly(model_dir):
    """Before: torch's RuntimeError (device string) and multinomial's RuntimeError (NaN temperature) as tracebacks."""
    for option, value, message in (("--device", "nope", "error: device: expected"), ("--temperature", "nan", "temperature: expected a finite")):
        result = CliRunner().invoke(main, ["generate", "--model", model_dir, "--prompt-ids", "1,2", option, value])
        assert result.exit_code == 2 and message in result.output, result.output
