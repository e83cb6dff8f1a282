"""How a tool call and its output are written inside an answer: tagged blocks of plain text, which any chat
template (SmolLM2's ChatML) and the built-in tiny model's plain text carry as they are:

    <tool>print(559 - -32 * 616)</tool><output>20271</output> 20271

The actor writes the call; generation stops at the call's closing tag, the tool runs the code, and its output,
in the output tags, is appended to the answer as context (inference/tool_rollout.py), never trained on. The
final answer, what a reward function or checker scores, is the text after the last output block.
"""
from __future__ import annotations

from dataclasses import dataclass

from utils.runtime.errors import ConfigError

DEFAULT_TAGS = ("<tool>", "</tool>", "<output>", "</output>")


@dataclass(frozen=True)
class ToolFormat:
    """The four tags of a call and its output."""
    call_open: str = DEFAULT_TAGS[0]
    call_close: str = DEFAULT_TAGS[1]
    output_open: str = DEFAULT_TAGS[2]
    output_close: str = DEFAULT_TAGS[3]

    @classmethod
    def from_tags(cls, tags, flag="--tool_tags"):
        """A format from four tags (call open, call close, output open, output close): non-empty, all different,
        none inside another (a ConfigError naming `flag` otherwise)."""
        tags = tuple(tags)
        if len(tags) != 4 or not all(isinstance(tag, str) and tag.strip() for tag in tags):
            raise ConfigError(f"{flag} needs four non-empty tags (call open, call close, output open, output close), "
                              f"not {list(tags)}")
        for i, tag in enumerate(tags):
            for j, other in enumerate(tags):
                if i != j and tag in other:
                    raise ConfigError(f"{flag}: the tag {tag!r} is inside the tag {other!r}: a model's text could "
                                      f"not tell them apart")
        return cls(*tags)

    def call(self, code: str) -> str:
        return f"{self.call_open}{code}{self.call_close}"

    def output(self, text: str) -> str:
        """The output block of a tool's output: stripped, with any closing tag inside it removed (a tool cannot
        close its own block and write text as the model's)."""
        return f"{self.output_open}{text.replace(self.output_close, '').strip()}{self.output_close}"

    def trace(self, code: str, output: str, answer: str) -> str:
        """An answer that calls the tool with `code`, reads `output` and answers: step 1's target on tool traces."""
        return f" {self.call(code)}{self.output(output)} {answer.strip()}"

    def parse_call(self, text: str) -> str | None:
        """The code of the last call in `text` (between its last opening tag and the closing tag after it; to the
        end when unclosed); None when there is no opening tag."""
        start = text.rfind(self.call_open)
        if start < 0:
            return None
        code = text[start + len(self.call_open):]
        end = code.find(self.call_close)
        return code if end < 0 else code[:end]

    def overshoot(self, text: str) -> str:
        """The text after the first closing tag of a call: a token that ends the tag may carry more (SmolLM2
        writes `></` as one token), which the output block then continues rather than repeats."""
        end = text.find(self.call_close)
        return "" if end < 0 else text[end + len(self.call_close):]

    def final_answer(self, text: str) -> str:
        """What the answer says in the end: the text after the last output block (all of it without one)."""
        end = text.rfind(self.output_close)
        return text if end < 0 else text[end + len(self.output_close):]


@dataclass(frozen=True)
class ToolUse:
    """The tool settings of a run (--tools and its group, utils/runtime/args.py add_tool_args)."""
    run: object  # run(code, timeout) -> utils.runtime.sandbox.ToolResult
    format: ToolFormat
    max_calls: int
    timeout: float


def tool_use(args):
    """The ToolUse of parsed flags, or None without --tools (a ConfigError for bad --tool_tags)."""
    from utils.runtime.sandbox import TOOLS

    if not getattr(args, "tools", None):
        return None
    return ToolUse(TOOLS[args.tools].run, ToolFormat.from_tags(args.tool_tags), args.max_tool_calls,
                   args.tool_timeout)
