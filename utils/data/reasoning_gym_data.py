"""reasoning-gym tasks as a data source (steps 1, 2 and 3, held-out prompts) and as a verifier (a reward).

reasoning-gym (Apache-2.0, `pip install -e ".[gym]"`) generates questions of ~100 procedural tasks (arithmetic,
puzzles, logic...) with a reference answer and scores any answer with the task's own `score_answer` in [0, 1].

A data path names the tasks and their settings:

    reasoning_gym:<task>[?key=value&key=value...][,<task>[?...]...]
    e.g. reasoning_gym:chain_sum?min_terms=2&max_terms=2,basic_arithmetic?size=500

Keys are the fields of the task's config dataclass (reasoning_gym.factory.DATASETS[task][1]), plus
- `size`: questions generated for the task, all parts together (default 2000): 10% held out, 10% eval, the rest
  train (each part at least one);
- `seed`: the generation seed (default 1234, whatever the run's --seed, so every step and the evaluation see the
  same questions);
- `tool_traces=python`: step 1's answers compute the answer with the Python tool before giving it,
  ` <tool>print(EXPR)</tool><output>ANSWER</output> ANSWER` (utils/runtime/tool_format.py), EXPR the question's
  expression (tasks whose items carry one: basic_arithmetic, chain_sum, products), ANSWER its reference answer:
  step 1 then teaches the tool calls that step 3's --tools runs;
- `tool_trace_share=F` (with tool_traces; 0 < F <= 1, default 1): only that share of the questions (by a stable
  hash of their text) gets a traced answer, the others the plain one: a step 1 that shows the tool on some
  questions, as a cold start from which RL with --tools can learn when to call it.
Values are converted to the field's type: int, float, str, bool (true/false, 1/0, yes/no), None (`none`) where
the field is Optional, a Literal's or Enum's value, an ISO date or time, and sequences (list[...], tuple[...])
as `|`-separated elements, e.g. `operators=+|-`. Percent escapes are decoded (`%2C` is a comma, `%26` a `&`).
An unknown task or key, a bad value or a configuration the task refuses is a one-line ConfigError.
Quote the spec in a shell (`&` and `?`).

Parts: questions are generated in order (item 0, 1, ...) and deduplicated on their text, and each question goes
to a part by a stable hash of its task and text (zlib.crc32 with a fixed salt), never by the seed or position:
a question is in the same part in every run, whatever the seed or size, so train, eval and held-out never
overlap. Generation goes on until each part has its share (or the task runs out of new questions).

Generation is deterministic for a seed within a process; a few tasks iterate over Python sets and so depend on
PYTHONHASHSEED as well (in reasoning-gym 0.1.25: isomorphic_strings, knight_swap, list_functions,
polynomial_multiplication, ransom_note, word_ladder): set PYTHONHASHSEED=0 for the same questions in every
process. The parts still never overlap, since a question's part depends on its text only.

Prompts are DeepSpeed-Chat's text form with the question as the user turn, followed by `INSTRUCTION` (a model
with a chat template gets it through its template: utils.data.prompting.model_prompt). The chosen answer is the
task's reference answer; the rejected one another question's reference answer, or a perturbed reference answer
(see `_rejected_answer`); a pair is left out when the verifier scores no candidate lower (reasoning-gym 0.1.25's
game_of_life_halting scores any non-empty answer 1). Tasks without a reference answer (their `answer` is None:
any valid solution scores) give prompts for step 3 and the evaluation, but no SFT targets or pairs.

The verifier (`Verifier.score`) finds each prompt's question and scores the answer with the task's `score_answer`;
its RL reward (`Verifier.reward`, `reasoning_gym_reward_fn`) is that score, but full marks or nothing for the tasks
that keep reasoning-gym's default scorer, whose partial credit goes to any answer holding the reference ("24" for
"2"): a policy earns it by hedging, not by the skill.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import difflib
import enum
import io
import itertools
import re
import types
import typing
import zlib
from collections.abc import Sequence
from urllib.parse import unquote

import datasets

from utils.data.prompting import text_prompt
from utils.data.prompting import parse_dialogue
from utils.data.raw_datasets import RawDataset
from utils.runtime.dist import print_rank_0
from utils.runtime.errors import ConfigError, DataError, one_line
from utils.runtime.time_limit import Overtime, time_limit
from utils.runtime.tool_format import ToolFormat

PREFIX = "reasoning_gym:"
EXTRA = 'pip install -e ".[gym]"'
DEFAULT_SIZE = 2000
DEFAULT_SEED = 1234
PARTS = ("train", "eval", "heldout")
HELDOUT_FRACTION = EVAL_FRACTION = 0.1
PART_SALT = "chatrlhf-reasoning-gym-parts-v1"
"""The fixed salt of the part hash. Never change it: questions would move between train and held-out."""
INSTRUCTION = "Reply with only the final answer."
"""Appended to every question (reasoning-gym's own prompts ask for `<answer>` tags in a system prompt; a short
final answer is what steps 1 and 2 train on). Many questions already say how to write the answer."""
UNSUPPORTED_TASKS = {"composite": "list tasks separated by commas instead"}
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
REJECTED_TRIES = 20
TRACED_TOOLS = ("python",)
"""The tools `tool_traces=` can write step 1's answers for (the code: `print(<the item's expression>)`)."""


def _library():
    """reasoning_gym's task registry {name: (dataset class, config class)}; a ConfigError naming the extra when
    the package is missing."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as err:
        raise ConfigError(f"reasoning_gym data needs the reasoning-gym package, which cannot be imported ({err}); "
                          f"install it with: {EXTRA}") from None
    return DATASETS


def task_names() -> list[str]:
    """Every registered reasoning-gym task a spec can name."""
    return sorted(name for name in _library() if name not in UNSUPPORTED_TASKS)


# --------------------------------------------------------------------------- the spec


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task of a spec: its name, config dataclass instance (seed and size not set), size and seed."""
    task: str
    config: typing.Any
    size: int = DEFAULT_SIZE
    seed: int = DEFAULT_SEED
    tool_traces: str | None = None  # the tool step 1's answers call (TRACED_TOOLS), None: plain answers
    tool_trace_share: float = 1.0  # the share of questions whose answer is traced (the others plain)

    def __str__(self):
        """Canonical text, e.g. `chain_sum?max_terms=2&min_terms=2&seed=1234&size=2000`; settings left at their
        defaults are left out."""
        defaults = type(self.config)()
        keys = [f.name for f in dataclasses.fields(self.config) if f.name not in ("seed", "size")
                and getattr(self.config, f.name) != getattr(defaults, f.name)]
        settings = [f"{key}={getattr(self.config, key)!r}" for key in sorted(keys)]
        traces = [f"tool_traces={self.tool_traces}"] if self.tool_traces else []
        traces += [f"tool_trace_share={self.tool_trace_share:g}"] if self.tool_trace_share != 1 else []
        return f"{self.task}?" + "&".join(settings + [f"seed={self.seed}", f"size={self.size}"] + traces)


def parse_spec(spec: str) -> list[TaskSpec]:
    """`reasoning_gym:<task>[?key=value&...][,<task>...]` -> one TaskSpec per task (see the module docstring)."""
    if not spec.startswith(PREFIX):
        raise ConfigError(f"{spec!r} is not a reasoning-gym data path; write {PREFIX}<task>[?key=value&...]"
                          f"[,<task>...], e.g. {PREFIX}chain_sum")
    pieces = spec[len(PREFIX):].split(",")
    if not any(piece.strip() for piece in pieces):
        raise ConfigError(f"{spec!r} names no task; write {PREFIX}<task>[?key=value&...], e.g. {PREFIX}chain_sum")
    specs = [_parse_task(piece.strip(), spec) for piece in pieces]
    seen = set()
    for task_spec in specs:
        if task_spec.task in seen:
            raise ConfigError(f"{spec}: task {task_spec.task} appears twice; name each task once")
        seen.add(task_spec.task)
    return specs


def _parse_task(piece: str, spec: str) -> TaskSpec:
    registry = _library()
    task, _, query = piece.partition("?")
    task = task.strip()
    if not task:
        raise ConfigError(f"{spec}: an empty task name (two commas in a row, or a trailing comma?)")
    if task in UNSUPPORTED_TASKS:
        raise ConfigError(f"{PREFIX}{task} is not supported: {UNSUPPORTED_TASKS[task]}")
    if task not in registry:
        close = difflib.get_close_matches(task, task_names(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "reasoning_gym.factory.DATASETS lists them"
        raise ConfigError(f"{PREFIX}{task}: unknown reasoning-gym task ({hint}); {len(task_names())} tasks exist")
    config_cls = registry[task][1]
    fields = {f.name: f for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")}
    hints = _type_hints(config_cls)
    values, size, seed, keys, traces, share = {}, DEFAULT_SIZE, DEFAULT_SEED, set(), None, 1.0
    for setting in filter(None, query.split("&")):
        key, equals, text = setting.partition("=")
        key, text = key.strip(), unquote(text.strip())
        where = f"{PREFIX}{task}: {key}"
        if not equals:
            raise ConfigError(f"{PREFIX}{task}: setting {setting!r} has no '='; write key=value")
        if key in keys:
            raise ConfigError(f"{where} is set twice")
        keys.add(key)
        if key == "size":
            size = _convert_int_at_least(text, 3, where, MAX_SIZE)
        elif key == "seed":
            seed = _convert_int_at_least(text, 0, where)
        elif key == "tool_traces":
            if text not in TRACED_TOOLS:
                raise ConfigError(f"{where}={text} must be one of {', '.join(TRACED_TOOLS)}")
            traces = text
        elif key == "tool_trace_share":
            share = convert_value(text, float, None, where)
            if not 0 < share <= 1:
                raise ConfigError(f"{where}={text} must be above 0 and at most 1")
        elif key in fields:
            values[key] = convert_value(text, hints.get(key, fields[key].type), _default(fields[key]), where)
        else:
            valid = sorted(fields) + ["seed", "size", "tool_trace_share", "tool_traces"]
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"{PREFIX}{task}: unknown key '{key}' ({hint}valid keys: {', '.join(valid)})")
    try:
        config = config_cls(**values)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, ValueError, TypeError) as err:
        raise ConfigError(f"{PREFIX}{piece}: reasoning-gym refuses this configuration "
                          f"({type(err).__name__}: {err or 'invalid'})") from None
    if share != 1 and traces is None:
        raise ConfigError(f"{PREFIX}{task}: tool_trace_share needs tool_traces (the tool the traced answers call)")
    return TaskSpec(task, config, size, seed, traces, share)


def _type_hints(config_cls) -> dict:
    try:
        return typing.get_type_hints(config_cls)
    except Exception:  # an annotation that does not resolve: fall back to the raw field types
        return {}


def _default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


MAX_SIZE = 1_000_000
"""The most questions a spec's `size` makes: generated one by one in this process (seconds per thousand), a
larger size would run for hours before step 1 says a word."""


def _convert_int_at_least(text: str, minimum: int, where: str, maximum: int | None = None) -> int:
    value = convert_value(text, int, None, where)
    if value < minimum:
        raise ConfigError(f"{where}={text} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{where}={text} must be at most {maximum:,}")
    return value


def convert_value(text: str, annotation, default, where: str):
    """The value of a spec setting `text` as the field's type `annotation` (see the module docstring);
    `default` (the field's default) gives the element type of an unparameterised tuple or list."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() in ("none", "null"):
            return None
        options = [arg for arg in args if arg is not type(None)]
        if len(options) == 1:
            return convert_value(text, options[0], default, where)
    elif origin is typing.Literal:
        for choice in args:
            if str(choice) == text:
                return choice
        raise ConfigError(f"{where}={text} must be one of {', '.join(map(str, args))}")
    elif annotation is bool:
        if text.lower() in TRUE + FALSE:
            return text.lower() in TRUE
        raise ConfigError(f"{where}={text} is not a boolean (true or false)")
    elif annotation in (int, float, str):
        try:
            return annotation(text)
        except ValueError:
            raise ConfigError(f"{where}={text} is not {'an int' if annotation is int else 'a float'}") from None
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        for member in annotation:
            if text in (member.name, str(member.value)):
                return member
        raise ConfigError(f"{where}={text} must be one of {', '.join(str(m.value) for m in annotation)}")
    elif annotation in (datetime.date, datetime.time):
        try:
            return annotation.fromisoformat(text)
        except ValueError:
            raise ConfigError(f"{where}={text} is not an ISO {annotation.__name__} (e.g. "
                              f"{'2024-12-31' if annotation is datetime.date else '23:59:59'})") from None
    elif annotation in (list, tuple) or origin in (list, tuple, Sequence):
        element = _element_type(annotation, origin, args, default)
        if element is not None:
            container = list if list in (annotation, origin) else tuple
            return container(convert_value(part, element, None, where) for part in (text.split("|") if text else []))
    raise ConfigError(f"{where}: a field of type {_type_name(annotation)} cannot be set from a data path")


def _element_type(annotation, origin, args, default):
    """The element type of a sequence field, or None when it is not a flat sequence of scalars."""
    if args:
        if len(args) == 2 and args[1] is Ellipsis or len(args) == 1:  # tuple[X, ...], list[X], tuple[X]
            element = args[0]
            return None if typing.get_origin(element) in (list, tuple, Sequence) else element
        return None
    elements = default if isinstance(default, (list, tuple)) else ()
    kinds = {type(element) for element in elements}
    return kinds.pop() if len(kinds) == 1 and kinds <= {int, float, str, bool} else str


def _type_name(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


# --------------------------------------------------------------------------- generation


@dataclasses.dataclass
class Item:
    """One generated question: its task, the reasoning-gym entry and the data set that scores it."""
    task: str
    entry: dict
    dataset: typing.Any

    @property
    def question(self) -> str:
        return self.entry["question"]

    @property
    def answer(self) -> str | None:
        answer = self.entry.get("answer")
        return None if answer is None else str(answer)

    @property
    def user_text(self) -> str:
        """The user turn: the question and `INSTRUCTION`."""
        return f"{self.question.strip()}\n{INSTRUCTION}"

    @property
    def prompt(self) -> str:
        return text_prompt(self.user_text)

    def score(self, answer: str) -> float:
        """The task's `score_answer` of a model's answer, clamped to [0, 1].

        The answer is stripped; when it holds `<answer>...</answer>` tags, the last tagged text is scored
        (reasoning-gym's own answer format). A scorer that raises on the answer scores it 0."""
        from reasoning_gym.utils import extract_answer

        answer = answer.strip()
        answer = extract_answer(answer) if "<answer>" in answer else answer
        try:
            score = float(self.dataset.score_answer(answer, self.entry))
        except Exception:  # the scorer's own failure on a malformed answer: that answer earns nothing
            return 0.0
        return min(1.0, max(0.0, score))

    @property
    def credits_containment(self) -> bool:
        """Whether the task keeps reasoning-gym's default `score_answer`, whose only partial credit is for holding
        the reference answer anywhere in the answer: "24" earns half of "2"'s marks, and of "4"'s."""
        from reasoning_gym.dataset import ProceduralDataset

        return type(self.dataset).score_answer is ProceduralDataset.score_answer

    def reward(self, answer: str) -> float:
        """The score as an RL reward: the task's own, but full marks or nothing where its partial credit is the
        default's containment, which RL learns to earn by hedging (on gcd it came to answer "24" or "13" to every
        question: half marks wherever the answer is 1, 2, 3 or 4)."""
        score = self.score(answer)
        return score if score >= 1.0 or not self.credits_containment else 0.0


def part_of(task: str, question: str) -> str:
    """The part of a question, by a stable hash of its task and text: 10% held out, 10% eval, 80% train."""
    bucket = zlib.crc32(f"{PART_SALT}:{task}:{question}".encode("utf-8")) % 100
    if bucket < HELDOUT_FRACTION * 100:
        return "heldout"
    return "eval" if bucket < (HELDOUT_FRACTION + EVAL_FRACTION) * 100 else "train"


def part_sizes(size: int) -> dict[str, int]:
    """Questions wanted in each part: round(size / 10) held out and eval (at least one each), the rest train."""
    heldout = max(1, round(size * HELDOUT_FRACTION))
    evaluation = max(1, round(size * EVAL_FRACTION))
    return {"train": size - heldout - evaluation, "eval": evaluation, "heldout": heldout}


ITEM_SECONDS = 120
"""The longest reasoning-gym may take to generate one question (they take milliseconds): at some settings a task
never returns (basic_arithmetic with terms of 8-10 digits tries every divisor of a 30-digit number), and a run would
hang before its first step, saying nothing."""


SHORT_SHARE = 0.9
"""A task whose distinct questions fill less than this share of its size= is said to (a WARNING line)."""


def generate_task(task_spec: TaskSpec, seen: set | None = None) -> dict[str, list[Item]]:
    """{part: [Item]} of one task: items 0, 1, ... of the task's data set (seeded with task_spec.seed), each new
    question (not in `seen`, which is updated) put in its part until the part is full; at most
    size + max(size // 2, 50) items are generated (the task's config size), fewer when the task runs out.
    A part left empty is a DataError naming the task."""
    seen = set() if seen is None else seen
    wanted = part_sizes(task_spec.size)
    limit = task_spec.size + max(task_spec.size // 2, 50)
    where = f"{PREFIX}{task_spec.task}"
    try:  # create_dataset's steps, with the config already made (asdict would flatten nested dataclasses)
        config = dataclasses.replace(task_spec.config, seed=task_spec.seed, size=limit)
        if hasattr(config, "validate"):
            config.validate()
        dataset = _library()[task_spec.task][0](config=config)
    except Exception as err:  # reasoning-gym's own failure to build the task
        raise DataError(f"{where}: reasoning-gym cannot build this task ({type(err).__name__}: {err})") from None
    parts, distinct, generated = {part: [] for part in PARTS}, set(), 0
    for index in range(limit):
        if all(len(parts[part]) >= wanted[part] for part in PARTS):
            break
        try:
            with time_limit(ITEM_SECONDS), contextlib.redirect_stdout(io.StringIO()):  # what a task prints (codeio:
                entry = dataset[index]  # "WARNING: Friendship already exists") would read as our data warnings
        except Overtime:
            raise DataError(f"{where}: reasoning-gym took over {ITEM_SECONDS} s to generate question {index} (its "
                            "questions take milliseconds): these settings are beyond what the task can make; try "
                            "smaller ones") from None
        except Exception as err:
            if isinstance(err, IndexError) and index:  # the task ran out of questions (word_ladder's words run out)
                break
            raise DataError(f"{where}: reasoning-gym failed to generate item {index} "
                            f"({type(err).__name__}: {err})") from None
        question, generated = entry["question"], index + 1
        part = part_of(task_spec.task, question)
        distinct.add(question)
        if question in seen or len(parts[part]) >= wanted[part]:
            continue
        seen.add(question)
        parts[part].append(Item(task_spec.task, entry, dataset))
    empty = [part for part in PARTS if not parts[part]]
    found = f"{generated} generated hold {len(distinct)} distinct questions"
    if empty:
        raise DataError(f"{where}: no {' or '.join(empty)} question: {found}; raise size=, or loosen the task's "
                        "settings")
    kept = [len(parts[part]) for part in PARTS]
    if sum(kept) < SHORT_SHARE * task_spec.size:
        print_rank_0(f"WARNING: {where}: {sum(kept)} questions of the {task_spec.size} asked (size=), "
                     f"{' / '.join(map(str, kept))} for {' / '.join(PARTS)}: {found}; loosen the task's settings "
                     "for more")
    return parts


def _interleave(lists: list[list]) -> list:
    """Round-robin over the lists (tasks in turn), so any first N items mix the tasks evenly."""
    out = []
    for i in range(max(map(len, lists), default=0)):
        out += [items[i] for items in lists if i < len(items)]
    return out


class GymData:
    """The generated parts of a spec, their pairs and the verifier's index of prompts."""

    def __init__(self, spec: str):
        self.spec = spec
        self.task_specs = parse_spec(spec)
        seen = set()
        by_task = [generate_task(task_spec, seen) for task_spec in self.task_specs]
        self.parts = {part: _interleave([parts[part] for parts in by_task]) for part in PARTS}
        self.verifier = Verifier([item for part in PARTS for item in self.parts[part]])
        self._rows: dict[str, list[dict]] = {}

    @property
    def tasks(self) -> list[str]:
        return [task_spec.task for task_spec in self.task_specs]

    def has_answers(self) -> bool:
        return any(item.answer is not None for part in PARTS for item in self.parts[part])

    def rows(self, part: str) -> list[dict]:
        """{"prompt", "chosen", "rejected", "task"} of each question of a part; chosen and rejected are None for
        a question without a reference answer, rejected is None when no wrong answer was found."""
        if part not in self._rows:
            items = self.parts[part]
            shares = {task_spec.task: task_spec.tool_trace_share for task_spec in self.task_specs
                      if task_spec.tool_traces}
            self._rows[part] = []
            for index, item in enumerate(items):
                answer = item.answer
                rejected = None if answer is None else _rejected_answer(items, index)
                traced = item.task in shares and _trace_bucket(item) < shares[item.task]
                chosen = None if answer is None else tool_trace(item) if traced else " " + answer
                self._rows[part].append({"prompt": item.prompt, "chosen": chosen,
                                         "rejected": None if rejected is None else " " + rejected,
                                         "task": item.task})
        return self._rows[part]


def _trace_bucket(item: Item) -> float:
    """A number in [0, 1) fixed by the item's task and text: `tool_trace_share=F` traces the items below F."""
    return zlib.crc32(f"{PART_SALT}:trace:{item.task}:{item.prompt}".encode("utf-8")) % 10_000 / 10_000


def tool_trace(item: Item) -> str:
    """Step 1's answer to an item that computes its expression with the Python tool, then answers (the module
    docstring's `tool_traces`); a DataError for an item without an expression."""
    expression = item.entry.get("metadata", {}).get("expression")
    if not isinstance(expression, str) or not expression.strip():
        raise DataError(f"{PREFIX}{item.task}: tool_traces needs questions that carry an expression to compute "
                        f"(basic_arithmetic, chain_sum, products do); this task's do not")
    return ToolFormat().trace(f"print({expression.strip()})", item.answer, item.answer)


def _rejected_answer(items: list[Item], index: int) -> str | None:
    """A wrong answer to items[index], kept only if it differs from the reference answer and the task's verifier
    scores it strictly lower: the first of

    1. the reference answers of the next REJECTED_TRIES questions of the same task and part (cyclically);
    2. generic perturbations of the reference answer (`_perturbations`).

    Another question's answer comes first because it works the same for every task: it has the task's own
    answer format and length, so a reward model must read the question to rank the pair, whereas a perturbation
    needs per-task knowledge to look plausible and can land on another valid solution. The same part is used so
    that no held-out answer leaks into training. Perturbations cover what is left: a part of one question, a
    task of few distinct answers (True/False), or a verifier that accepts any valid solution (puzzle24 scores
    every expression equal to 24, so another question's solution scores 1). None if nothing scores lower.
    """
    item = items[index]
    reference = item.answer
    chosen_score = item.score(reference)
    following = (items[(index + step) % len(items)] for step in range(1, len(items)))
    others = itertools.islice((other.answer for other in following if other.task == item.task), REJECTED_TRIES)
    for candidate in itertools.chain((answer for answer in others if answer is not None), _perturbations(reference)):
        if candidate.strip() != reference.strip() and item.score(candidate) < chosen_score:
            return candidate
    return None


_OPPOSITES = {"true": "false", "false": "true", "yes": "no", "no": "yes"}


def _perturbations(answer: str) -> list[str]:
    """Near misses of an answer for any task: the opposite of a true/false or yes/no answer (in its case), the
    answer with its last digit d changed to (d + 1) mod 10, and the answer without its last character."""
    answer = answer.strip()
    out = []
    opposite = _OPPOSITES.get(answer.lower())
    if opposite:
        out.append(opposite.upper() if answer.isupper() else opposite.capitalize() if answer[0].isupper()
                   else opposite)
    digit = re.search(r"\d(?=\D*$)", answer)
    if digit:
        out.append(answer[:digit.start()] + str((int(digit.group()) + 1) % 10) + answer[digit.end():])
    if len(answer) > 1:
        out.append(answer[:-1])
    return out


_GENERATED: dict[str, GymData] = {}


def gym_data(spec: str) -> GymData:
    """The generated data of a spec, made once per process (steps ask for it per split, the verifier again)."""
    key = PREFIX + ",".join(str(task_spec) for task_spec in parse_spec(spec))
    if key not in _GENERATED:
        _GENERATED[key] = GymData(spec)
    return _GENERATED[key]


# --------------------------------------------------------------------------- the verifier


class Verifier:
    """Scores answers to the questions of a spec with each task's own `score_answer`."""

    def __init__(self, items: list[Item]):
        self.index = {one_line(item.user_text): item for item in items}
        self._by_length = sorted(self.index, key=len, reverse=True)

    def item(self, prompt: str) -> Item:
        """The question a prompt asks: a data-set prompt (" Human: ... Assistant:"), the bare user text, or a
        prompt in a model's chat format (found as the longest known user text it contains). Whitespace is not
        significant. A prompt of no known question is a DataError."""
        text = one_line(prompt)
        found = self.index.get(text) or self.index.get(one_line(parse_dialogue(prompt)[-1][0]))
        if found is None:
            found = next((self.index[key] for key in self._by_length if key in text), None)
        if found is None:
            raise DataError(f"reasoning_gym verifier: prompt {text[:80]!r}... is none of the data's questions")
        return found

    def score(self, prompts: list[str], answers: list[str]) -> list[float]:
        """Each answer's score in [0, 1] by the task of its prompt (see Item.score)."""
        return self._by_item(prompts, answers, Item.score)

    __call__ = score

    def reward(self, prompts: list[str], answers: list[str]) -> list[float]:
        """Each answer's RL reward by the task of its prompt (see Item.reward)."""
        return self._by_item(prompts, answers, Item.reward)

    def _by_item(self, prompts: list[str], answers: list[str], judge) -> list[float]:
        """judge(item, answer) for each answer, item the question its prompt asks."""
        if len(prompts) != len(answers):
            raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
        return [judge(self.item(prompt), answer) for prompt, answer in zip(prompts, answers)]

    def summarize(self, prompts: list[str], answers: list[str]) -> dict[str, float]:
        """Mean score overall ("all") and per task, tasks in order of first appearance, and "solved": the share
        of answers scored 1. Many verifiers give partial credit (word_sorting: at least 0.2 for the right words
        in any order), which a policy can earn without solving anything; "solved" shows it."""
        scores = self.score(prompts, answers)
        if not scores:
            raise ValueError("no prompts to score")
        by_task: dict[str, list[float]] = {}
        for prompt, score in zip(prompts, scores):
            by_task.setdefault(self.item(prompt).task, []).append(score)
        return {"all": sum(scores) / len(scores), **{task: sum(s) / len(s) for task, s in by_task.items()},
                "solved": sum(score == 1.0 for score in scores) / len(scores)}


def reasoning_gym_reward_fn(spec: str):
    """A reward function `(prompts, answers) -> list of floats in [0, 1]` for the questions of `spec` (every
    part), e.g. step 3's rewards on its prompts: each task's score, no containment credit (Item.reward)."""
    return gym_data(spec).verifier.reward


# --------------------------------------------------------------------------- the raw data set


class ReasoningGym(RawDataset):
    """A spec as a raw data set: the train part and the eval part, rows {"prompt", "chosen", "rejected", "task"}.

    Its `seed` (the run's) does not change the questions: the spec's seed does."""

    def __init__(self, spec: str, seed: int):
        super().__init__(seed)
        self.data = gym_data(spec)
        self.name = spec
        canonical = ",".join(str(task_spec) for task_spec in self.data.task_specs)
        self.clean_name = f"reasoning_gym_{zlib.crc32(canonical.encode()):08x}"
        self._splits = {part: datasets.Dataset.from_list(self.data.rows(part)) for part in ("train", "eval")}

    def get_train_data(self):
        return self._splits["train"]

    def get_eval_data(self):
        return self._splits["eval"]

    def get_prompt(self, sample):
        return self._text(sample, "prompt")

    def _answer(self, sample, field):
        if not self.data.has_answers():
            raise DataError(f"{self.name}: no task here has reference answers (their questions accept any valid "
                            f"solution), so there is nothing to fine-tune on or rank; use it in step 3")
        return sample[field]

    def get_chosen(self, sample):
        return self._answer(sample, "chosen")

    def get_rejected(self, sample):
        return self._answer(sample, "rejected")
