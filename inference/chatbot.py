"""Chat with a trained actor: `python chat.py --path output/actor` (DeepSpeed-Chat's `chat.py`).

Three ways to run it:
- interactive (stdin is a terminal, no --prompt): type a line, read `Assistant: ...`; the conversation is kept
  as history, `clear` starts a new one, `quit` (or end of input) exits; empty lines are skipped.
- `--prompt TEXT`: answer TEXT once, print the answer and exit.
- piped stdin (no --prompt): each line is the next turn of ONE conversation (history kept, `clear` and `quit`
  honoured, empty lines skipped); each answer is printed on a line of its own.
With --tools python the answers may call the sandboxed Python tool, as step 3's rollouts do
(inference/tool_rollout.py): the answer shows each call and its output.
"""
import itertools
import sys

import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
from inference.generation import generate, load_causal_lm, max_prompt_tokens, tokenize_prompts
from utils.data.prompting import format_turns
from utils.data.text_files import check_text, decoded_lines
from utils.model.model_utils import resolve_model_path
from utils.model.save import trained_answer_length
from utils.runtime.args import ArgumentParser, add_generation_args, add_tool_args, check_flag_ranges
from utils.runtime.dist import quiet_transformers
from utils.runtime.ds_utils import choose_dtype
from utils.runtime.errors import ChatRLHFError, cli_entry, one_line
from utils.runtime.tool_format import tool_use

CLEAR, QUIT = "clear", "quit"
DEFAULT_MAX_NEW_TOKENS = 64  # for a model without saved training settings
DS_CHAT_TURN_START = "Human:"


class Conversation:
    """The turns of one conversation so far: (user, assistant) pairs."""

    def __init__(self):
        self.turns = []

    def add(self, user, assistant):
        self.turns.append((user, assistant))

    def clear(self):
        self.turns = []


class ChatBot:
    """Answers user turns with `generate`, keeping the conversation as history.

    When the whole conversation no longer fits the model's context, the oldest turns are left out of the
    prompt (they stay in `conversation`); a single turn too long on its own is a ChatRLHFError.
    """

    def __init__(self, model, tokenizer, max_new_tokens=64, temperature=0.7, top_p=0.9, greedy=False, seed=None,
                 tools=None):
        """tools: a utils.runtime.tool_format.ToolUse (--tools): the answers call it as step 3's rollouts do, and
        show the calls and their outputs."""
        self.model, self.tokenizer, self.tools = model, tokenizer, tools
        self.decoding = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, greedy=greedy)
        self.seed = seed
        self.conversation = Conversation()
        self.last_prompt = None
        self.last_hit_limit = False  # whether the last answer stopped at max_new_tokens before its EOS

    def build_prompt(self, user):
        """The prompt for `user`'s turn after the history: as many recent turns as fit the context."""
        limit = max_prompt_tokens(self.model, self.decoding["max_new_tokens"])
        history = self.conversation.turns
        for first in range(len(history) + 1):
            prompt = format_turns(self.tokenizer, history[first:] + [(user, None)])
            if limit is None or len(tokenize_prompts(self.tokenizer, [prompt])[0]) <= limit:
                return prompt
        return prompt  # the turn alone is too long: generate names the problem

    def reply(self, user):
        """The answer to `user` (recorded in the history)."""
        if not user.strip():
            raise ChatRLHFError("the prompt is empty")
        self.last_prompt = self.build_prompt(user)
        seed = None if self.seed is None else self.seed + len(self.conversation.turns)
        answers, ended = generate(self.model, self.tokenizer, [self.last_prompt], seed=seed, return_ended=True,
                                  tools=self.tools, **self.decoding)
        self.last_hit_limit = not ended[0]
        answer = self.clean_answer(answers[0])
        self.conversation.add(user, answer)
        return answer

    def clean_answer(self, answer):
        """The answer stripped; in DeepSpeed-Chat's format, cut where the model starts the next human turn
        (as DeepSpeed-Chat's chatbot does), so the history holds only what the assistant said."""
        if not getattr(self.tokenizer, "chat_template", None):
            answer = answer.split(DS_CHAT_TURN_START, 1)[0]
        return answer.strip()

    def clear(self):
        self.conversation.clear()


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=str, required=True,
                        help="A saved actor folder (step 1 or step 3), a base model folder or hub name, or a "
                             "built-in name (tiny, smollm2-135m).")
    parser.add_argument("--prompt", type=str, default=None, help="Answer this one prompt and exit.")
    parser.add_argument("--show_prompt", action="store_true",
                        help="Debug: print each full prompt given to the model (with history) on stderr.")
    add_generation_args(parser, fallback_length=DEFAULT_MAX_NEW_TOKENS, greedy=True, batch_size=False,
                        covers="the sampled answers (None: different ones each run)")
    add_tool_args(parser)
    parser.set_defaults(temperature=0.7, top_p=0.9, seed=None)
    args = parser.parse_args(argv)
    check_flag_ranges(args)
    args.tool_use = tool_use(args)
    return args


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    if args.prompt is not None:
        check_text(args.prompt, "--prompt")  # bytes of the command line that were not UTF-8
    if args.prompt is None and sys.stdin is None:
        raise ChatRLHFError("no --prompt and standard input is closed: pass --prompt TEXT, or the turns on "
                            "standard input")

    path = resolve_model_path(args.path)  # a mistyped path fails at once, before torch is imported

    args.dtype, why = choose_dtype(args.dtype)
    print(f"dtype: {args.dtype} ({why})", file=sys.stderr, flush=True)
    quiet_transformers()
    model, tokenizer = load_causal_lm(path, args.dtype, args.trust_remote_code)
    if args.max_new_tokens is None:

        args.max_new_tokens = trained_answer_length(path) or DEFAULT_MAX_NEW_TOKENS
    bot = ChatBot(model, tokenizer, args.max_new_tokens, args.temperature, args.top_p, args.greedy, args.seed,
                  args.tool_use)
    if args.prompt is not None:
        print(one_line(answer_turn(bot, args.prompt, args.show_prompt)), flush=True)
    elif sys.stdin.isatty():
        interactive(bot, args.show_prompt)
    else:
        for line in stdin_lines():
            user = line.rstrip("\r\n")
            command = user.strip().lower()
            if command == QUIT:
                break
            if command == CLEAR:
                bot.clear()
            elif user.strip():
                print(one_line(answer_turn(bot, user, args.show_prompt)), flush=True)


def stdin_lines():
    """The lines of standard input as they come; bytes that are not UTF-8 text (UTF-16 is named by its byte-order
    mark) or a line over MAX_LINE_BYTES end the chat in one error line. Read as bytes, a line at a time
    (utils.data.text_files): as text, Python would read a 1 GB line whole, and under a C locale take bytes that are
    not UTF-8 as lone surrogates that no tokenizer takes."""
    if getattr(sys.stdin, "buffer", None) is not None:
        for _, line in decoded_lines(sys.stdin.buffer, "standard input"):
            yield line
        return
    lines = iter(sys.stdin)
    for number in itertools.count(1):
        try:
            line = next(lines)
            line.encode("utf-8")
        except StopIteration:
            return
        except (UnicodeDecodeError, UnicodeEncodeError):
            raise ChatRLHFError(f"standard input is not UTF-8 text (line {number})") from None
        yield line


def interactive(bot, show_prompt):
    print(f"Chatting with {bot.model.name_or_path}. Type '{CLEAR}' to start a new conversation, '{QUIT}' to "
          "exit.", flush=True)
    while True:
        try:
            user = input("Human: ")
        except (EOFError, KeyboardInterrupt):
            print()
            return
        command = user.strip().lower()
        if command == QUIT:
            return
        if command == CLEAR:
            bot.clear()
            print("(history cleared)", flush=True)
        elif user.strip():
            print(f"Assistant: {answer_turn(bot, user, show_prompt)}", flush=True)


def answer_turn(bot, user, show_prompt):
    """The answer to `user`; on stderr, the prompt with --show_prompt, and a note when the answer was cut at
    --max_new_tokens (standard output keeps one answer per line)."""
    answer = bot.reply(user)
    if show_prompt:
        print(f"prompt: {bot.last_prompt!r}", file=sys.stderr, flush=True)
    if bot.last_hit_limit:
        print(f"(answer cut at --max_new_tokens {bot.decoding['max_new_tokens']} before its end; give a larger "
              "--max_new_tokens for longer answers)", file=sys.stderr, flush=True)
    return answer
