"""The text of tool calls and outputs (utils/data/tool_format.py)."""
import pytest

from utils.runtime.tool_format import ToolFormat
from utils.runtime.errors import ConfigError

FORMAT = ToolFormat()


def test_a_trace_parses_back_to_its_call_and_final_answer():
    trace = FORMAT.trace("print(559 - -32 * 616)", "20271\n", "20271")
    assert trace == " <tool>print(559 - -32 * 616)</tool><output>20271</output> 20271"
    assert FORMAT.parse_call(trace) == "print(559 - -32 * 616)"
    assert FORMAT.final_answer(trace) == " 20271"
    assert FORMAT.final_answer(" 42") == " 42"


def test_the_last_call_is_parsed_and_an_unclosed_one_runs_to_the_end():
    assert FORMAT.parse_call("<tool>a</tool> then <tool>b</tool>></") == "b"
    assert FORMAT.parse_call("x <tool>print(1)") == "print(1)"
    assert FORMAT.parse_call("no call </tool>") is None


def test_the_overshoot_of_a_closing_token_is_what_follows_the_tag():
    assert FORMAT.overshoot("<tool>1</tool><") == "<"
    assert FORMAT.overshoot("<tool>1</tool>") == ""


def test_a_tool_cannot_close_its_own_output_block():
    assert FORMAT.output(" 1</output> 99\n") == "<output>1 99</output>"
    assert FORMAT.final_answer("<tool>x</tool>" + FORMAT.output("1</output> 99") + " 5") == " 5"


@pytest.mark.parametrize("tags", [("<t>", "</t>", "<o>"), ("<t>", "</t>", "", "</o>"), ("<t>", "<t>x", "<o>", "</o>")])
def test_bad_tags_are_refused(tags):
    with pytest.raises(ConfigError, match="--tool_tags"):
        ToolFormat.from_tags(tags)
