"""Reward functions that read the data set's own columns: the reference answer beside each question.

A user's reward function may take, besides the prompts and the answers, columns of the rows the prompts come from:

    def score(prompts, answers, solution): ...             # ours, with the column `solution`
    def accuracy(completions, solution, **kwargs): ...      # TRL's GRPOTrainer form
    def accuracy(prompts, completions, **kwargs): ...       # every column, in kwargs

Each column comes as a list with one value per answer: the value in the row whose prompt the answer answers. A
function with a parameter named `completions` (TRL's form) is called by keyword (`prompts=`, `completions=` and the
columns), and where a row's prompt is a list of messages (TRL's conversational form) it gets that list and the
answer as `[{"role": "assistant", "content": answer}]`, as TRL gives them; ours gets the prompts and answers as
text, by position, and the columns by keyword. `**kwargs` receives every
column but the prompt and `completion` (as TRL passes them). Prompts are found by their text, whitespace not
significant, among the train and eval rows of every `--data_path`; the first row of a prompt given twice wins.

A named column the data does not have, or a prompt that is no row of the data, is an error naming both (a function
that takes `**kwargs` alone gets no column for such a prompt; one whose named columns all have defaults that the
data lacks is called as the plain form).
"""
from __future__ import annotations

import inspect

from utils.runtime.errors import ConfigError, DataError, one_line

TRL = ("prompts", "completions")
"""TRL's form's two lists, by keyword: a function with a parameter `completions` is in TRL's form (ours takes
`prompts, answers` by position)."""
NOT_PASSED = ("prompt", "completion", *TRL, "answers")
"""Columns `**kwargs` does not receive: the prompt is `prompts`, TRL leaves out `completion` too, and a column may
not take the name of one of the lists."""
EVERY_COLUMN = "**"
"""`ColumnCall.columns` holding this: every column of the data (a `**kwargs` parameter)."""


class ColumnCall:
    """How to call a reward function: `trl` (by keyword, TRL's form) or ours (by position), with `columns`, the
    column names its other parameters ask for (those without a default are `required`), plus EVERY_COLUMN for a
    `**kwargs`. `columns` empty: the plain `fn(prompts, answers)`."""

    def __init__(self, function, label):
        """`label` names the function in errors (`--reward_fn file.py:score`)."""
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):  # a builtin without a signature: the plain form, its first call says
            self.trl, self.takes_prompts, self.columns, self.required = False, True, [], []
            return
        parameters = signature.parameters
        kinds = {p.kind for p in parameters.values()}
        self.trl = "completions" in parameters
        self.takes_prompts = "prompts" in parameters or inspect.Parameter.VAR_KEYWORD in kinds
        named = [name for name, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not self.trl:  # ours: the first two positional parameters take the lists
            positional = [name for name, p in parameters.items()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            if len(positional) < 2 and inspect.Parameter.VAR_POSITIONAL not in kinds:
                raise ConfigError(f"{label} must take (prompts, answers), two lists of strings, or TRL's "
                                  f"(completions, **kwargs), not {signature}")
            named = [name for name in named if name not in positional[:2]]
        self.columns = [name for name in named if name not in TRL]
        self.required = [name for name in self.columns if parameters[name].default is inspect.Parameter.empty]
        if inspect.Parameter.VAR_KEYWORD in kinds:
            self.columns.append(EVERY_COLUMN)

    @property
    def plain(self):
        return not self.trl and not self.columns

    def reads(self, names):
        """Whether a call passes it any column of data whose columns are `names` (TRL's form is called by keyword
        whether or not)."""
        return self.trl or EVERY_COLUMN in self.columns or any(name in names for name in self.columns)


class DataRows:
    """The rows of `data_paths` by their prompt's text (train and eval splits), read once on first use."""

    def __init__(self, data_paths, seed=1234, columns=None):
        self.data_paths, self.seed, self.renames = list(data_paths or []), seed, dict(columns or {})
        self._rows, self.names = None, []

    def read(self):
        if self._rows is None:
            from utils.data.data_utils import get_raw_dataset  # the data layer reads the files
            from utils.data.raw_datasets import row_columns

            rows, names = {}, {}
            for path in self.data_paths:
                raw = get_raw_dataset(path, self.seed, self.renames)
                for split in (raw.get_train_data(), raw.get_eval_data()):
                    for row in split:
                        prompt = raw.get_prompt(row)
                        columns = row_columns(row)
                        if prompt is not None:
                            rows.setdefault(one_line(prompt), columns)
                        names.update(dict.fromkeys(columns))
            self._rows, self.names = rows, list(names)
        return self._rows

    def row(self, prompt, label, needed=True):
        """The columns of the row whose prompt is `prompt`: a DataError naming `label` if there is none and the
        function `needed` one of its columns (a function that takes `**kwargs` alone gets no column then)."""
        found = self.read().get(one_line(prompt))
        if found is None and not needed:
            return {}
        if found is None:
            raise DataError(f"{label} reads the data's columns, but the prompt {one_line(prompt)[:80]!r} is no row of "
                            f"--data_path {' '.join(self.data_paths)}")
        return found


def check_columns(call, rows, label):
    """ConfigError naming `label` and the column if the function asks for a column (without a default) that no row
    of the data has."""
    rows.read()
    missing = [name for name in call.required if name not in rows.names]
    if missing:
        raise ConfigError(f"{label} takes the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which "
                          f"--data_path {' '.join(rows.data_paths)} does not have (its columns: "
                          f"{', '.join(rows.names) or 'none'})")


def with_columns(function, call, rows, label):
    """`function` as a plain reward_fn(prompts, answers): each call finds the prompts' rows in `rows` and passes the
    columns `call` asks for."""
    def reward_fn(prompts, answers):
        found = [rows.row(prompt, label, needed=bool(call.required)) for prompt in prompts]
        names = [name for name in call.columns if name != EVERY_COLUMN and name in rows.names]
        if EVERY_COLUMN in call.columns:
            names += [name for name in rows.names if name not in names and name not in NOT_PASSED]
        columns = {name: [row.get(name) for row in found] for name in names}
        if call.trl:  # a prompt of messages comes as written, its answer as one assistant message (TRL's form)
            chats = [isinstance(row.get("prompt"), list) for row in found]
            prompts = [row["prompt"] if chat else prompt for row, chat, prompt in zip(found, chats, prompts)]
            answers = [[{"role": "assistant", "content": answer}] if chat else answer
                       for chat, answer in zip(chats, answers)]
            return function(**({"prompts": prompts} if call.takes_prompts else {}), completions=answers, **columns)
        return function(prompts, answers, **columns)

    reward_fn.__name__ = getattr(function, "__name__", "reward_fn")
    return reward_fn
