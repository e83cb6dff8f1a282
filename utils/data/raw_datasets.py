"""Raw preference data sets: where the text comes from, before any tokenizing.

A raw data set gives a train split and an eval split (each a `datasets.Dataset`) and,
for every sample, three strings:

    get_prompt(sample)    e.g. " Human: What is 7 + 12? Assistant:"
    get_chosen(sample)    e.g. " 19"
    get_rejected(sample)  e.g. " 21"

They are exactly the text to concatenate: `prompt + chosen` is the full SFT text and
`prompt + rejected` the rejected conversation. Nothing (no space, no EOS) is inserted
between or after them here; the tokenizing code appends the end-of-text token.

Names understood by `get_raw_dataset(name, seed, columns)`:

* hub data sets, loaded with `datasets.load_dataset(name)`, with DeepSpeed-Chat's field
  mapping and prompt formatting: Dahoas/rm-static, Dahoas/full-hh-rlhf,
  Dahoas/synthetic-instruct-gptj-pairwise, yitingxie/rlhf-reward-datasets,
  openai/webgpt_comparisons, stanfordnlp/SHP. These need the network the first time
  (afterwards the `datasets` cache); offline they fail with a one-line `DataError`.
* `builtin`: the built-in arithmetic task, generated once into
  `cache_dir()/builtin-data/v<TASK_VERSION>-seed1234` and read like a local directory.
* `local/jsonfile`: the directory `./data` under the current working directory, holding
  train.json and eval.json (DeepSpeed-Chat's name for the same idea).
* `reasoning_gym:<task>[?key=value&...][,<task>...]`: questions of reasoning-gym tasks, generated in
  memory (the `gym` extra; see utils/data/reasoning_gym_data.py for the spec, the parts and the pairs).
* any existing local path: a directory holding train.json (or .jsonl, .parquet, or a hub snapshot's shards
  data/train-00000-of-00002.parquet ..., or a folder train/ of them) and eval.json (or test, validation:
  EVAL_SPLITS; without one the train split is split 9:1), or a single .json/.jsonl/.parquet/.csv/.tsv file that is split 9:1 into train/eval (a
  text file's name may end in .gz: HH-RLHF's train.jsonl.gz);
  or a folder `datasets` wrote with save_to_disk (LoadedDataset, read with `datasets.load_from_disk`).
* any other name `datasets.load_dataset(name)` reads (LoadedDataset): a hub data set by its name, from
  the Hugging Face cache when offline (HF_DATASETS_OFFLINE=1). Its `train` split is the train split,
  its `eval`, `test` or `validation` split (EVAL_SPLITS) the eval split, else the train split is split 9:1.
A folder or loaded data set whose splits have other names chooses them in its name (`split_choice`):
`HuggingFaceH4/ultrafeedback_binarized?train=train_prefs&eval=test_prefs`.

Local file format: JSON lines (one object per line; blank lines ignored), one JSON array
of objects, a Parquet file (as hub data sets store theirs), or a CSV (.tsv: tab-separated) file whose first line
names its columns, each row (as each row of a
LoadedDataset) in one of the shapes utils/data/pair_formats.py reads, its columns first renamed
by the --<field>_key flags (`columns`: {field: column}): DeepSpeed-Chat's string fields `prompt`, `chosen` and
`rejected` (other fields are ignored), HH-RLHF's whole dialogues in `chosen` and `rejected`,
lists of chat messages (TRL, UltraFeedback, OpenRLHF), or prompts alone or with one answer.
Strings in the text form are used VERBATIM, unlike DeepSpeed-Chat's local/jsonfile which
inserts spaces: write them already formatted, e.g.
    {"prompt": " Human: What is 7 + 12? Assistant:", "chosen": " 19", "rejected": " 21"}
Empty strings are refused; an HH dialogue whose final answer is empty has no answer on that side
(a step that needs it skips the row and counts it).

Data sets with only a train split (synthetic-instruct-gptj-pairwise, webgpt_comparisons,
a single local file) are split 9:1 into train/eval by a seeded permutation (numpy
RandomState(seed), as DeepSpeed-Chat): the same seed gives the same split. The eval part
has round(n / 10) rows (DeepSpeed-Chat's rule), but at least one.

Every problem with the data is raised as `DataError` (a ValueError) with a one-line message
naming the data set or file, and where it applies the line, row and field.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import datasets
import numpy as np

from utils.data import builtin_task as task
from utils.data.pair_formats import UNUSABLE, rated_pairs, read_pair, relabelled
from utils.data.prompting import text_prompt
from utils.data.text_files import (GZIP_SUFFIX, MAX_LINE_BYTES, check_text, data_suffix, json_records, read_text,
                                   regular_file)
from utils.runtime.args import column_flag
from utils.runtime.paths import cache_dir

__all__ = [
    "DataError",
    "RawDataset",
    "HubDataset",
    "DahoasRmStatic",
    "DahoasFullHHRLHF",
    "DahoasSyntheticInstructGPTJPairwise",
    "YitingxieRLHFRewardDatasets",
    "OpenAIWebGPTComparisons",
    "StanfordNLPSHP",
    "LocalJsonFile",
    "Builtin",
    "HUB_DATASETS",
    "BUILTIN_SEED",
    "builtin_data_dir",
    "read_local_split",
    "split_train_eval",
]

LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".tsv")
BUILTIN_SEED = 1234
BUILTIN_FILES = ("train.json", "eval.json", "heldout.json", "unsup.txt")


from utils.runtime.errors import ConfigError, DataError, one_line  # noqa: E402  (re-exported: callers catch it from here)


# --------------------------------------------------------------------------- helpers


def split_train_eval(n: int, seed: int, what: str) -> tuple[list[int], list[int]]:
    """Deterministic 9:1 split of range(n): (train indices, eval indices).

    A numpy RandomState(seed) permutation, as DeepSpeed-Chat; eval gets round(n/10) rows
    but at least one, train the rest. Needs n >= 2 (`what` names the data for the error).
    """
    if n < 2:
        raise DataError(f"{what}: has {n} usable row(s); at least 2 are needed to split it 9:1 into train and eval")
    n_eval = max(1, int(round(n / 10)))
    perm = np.random.RandomState(seed).permutation(n).tolist()
    return perm[: n - n_eval], perm[n - n_eval:]


def _check_strings(value: Any, where: str) -> None:
    """Refuse a row whose fields hold a lone surrogate (a JSON `\\ud800` escape): naming the row's field."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_strings_in(item, f"{where}: field '{key}'")


def _check_strings_in(value: Any, where: str) -> None:
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, dict):
        for item in value.values():
            _check_strings_in(item, where)
    elif isinstance(value, list):
        for item in value:
            _check_strings_in(item, where)


def _parquet_rows(path: Path, what: str) -> list[tuple[Any, str]]:
    """(row as a dict, where) for each row of a Parquet file (lists of messages come back as lists of dicts)."""
    import pyarrow.parquet as pq  # installed with `datasets`

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own ArrowInvalid / OSError kinds for a damaged file
        raise DataError(f"{what}: not a readable Parquet file ({one_line(exc, 200)})") from None
    return [(value, f"row {i}") for i, value in enumerate(table.to_pylist())]


def _csv_rows(path: Path, what: str) -> list[tuple[Any, str]]:
    """(row as a dict of strings, where) for each row of a CSV file (.tsv: tab-separated) whose first line names
    its columns; a row's empty trailing fields are missing columns."""
    text = read_text(path, what)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if data_suffix(path) == ".tsv" else ",",
                            strict=True)  # a stray quote is an error, not two rows read as one
    records = []
    previous = csv.field_size_limit(MAX_LINE_BYTES)  # a field as long as a JSON line may be (csv's own: 128 KiB)
    try:
        twice = sorted({name for name in reader.fieldnames or () if reader.fieldnames.count(name) > 1})
        if twice:
            raise DataError(f"{what}: line 1 names the column {twice[0]!r} twice; name each column once")
        for row in reader:
            if None in row:
                raise DataError(f"{what}: line {reader.line_num}: more fields than the header line names "
                                f"({len(reader.fieldnames)})")
            records.append(({key: value for key, value in row.items() if value is not None},
                            f"row {len(records)} (line {reader.line_num})"))
    except csv.Error as err:
        # line_num counts the lines of the rows read whole: the row that failed starts on the next
        raise DataError(f"{what}: malformed CSV on line {reader.line_num + 1}: {err}") from None
    finally:
        csv.field_size_limit(previous)
    return records


def local_records(path: Path, what: str | None = None) -> list[tuple[Any, str]]:
    """(record, where) for each record of the local data file `path` by its suffix: Parquet, CSV / TSV with a
    header line, else a JSON array or JSON lines; DataError naming `what` (default the path) for what cannot be
    read."""
    what = what or str(path)
    if path.suffix.lower() == ".parquet":
        return _parquet_rows(path, what)
    if data_suffix(path) in (".csv", ".tsv"):
        return _csv_rows(path, what)
    try:
        return json_records(path, what)
    except OSError as exc:
        raise DataError(f"{what}: cannot be read ({exc.strerror or exc})") from None


def read_local_split(path: str | os.PathLike, columns: dict[str, str] | None = None) -> datasets.Dataset:
    """Read and validate one local split file (JSON lines, a JSON array, Parquet, or CSV / TSV with a header line).

    Each record must be an object holding a preference pair in one of the shapes of
    utils.data.pair_formats (text form, whole dialogues, or lists of messages), its columns first renamed by
    `columns` ({field: the file's column}, from the --<field>_key flags). Rows are numbered from 0 in the
    messages, lines from 1. Returns a `datasets.Dataset` with the columns prompt, chosen and rejected, in the text
    form, and ROW_COLUMNS where a row has other columns (read_rows).
    """
    path = regular_file(path)
    records = local_records(path)
    for value, where in records:
        if not isinstance(value, dict):
            raise DataError(f"{path}: {where}: expected a JSON object, got {type(value).__name__}")
    present = set().union(*(value.keys() for value, _ in records))
    return read_rows(records, str(path), present, columns)


ROW_COLUMNS = "_chatrlhf_row_columns"
"""The column in which read_rows keeps, as JSON, a row's columns other than its text-form fields."""


def read_rows(records: list[tuple[dict, str]], what: str, present: set[str],
              columns: dict[str, str] | None = None) -> datasets.Dataset:
    """The rows (value, where) of a file or data set `what` whose columns are `present`, in the text form
    (read_pair), their columns first renamed by `columns` ({field: column}): a column that `present` lacks is a
    DataError naming its flag."""
    if not records:
        raise DataError(f"{what}: no rows (the split is empty)")
    columns = columns or {}
    for field, column in columns.items():
        if column not in present:
            raise DataError(f"{what}: no column '{column}' (named by {column_flag(field)}); its columns: "
                            f"{', '.join(sorted(present))}")
    rows, fields = [], {"prompt", "chosen", "rejected", UNUSABLE, ROW_COLUMNS, *columns.values()}
    for value, where in records if columns else rated_pairs(records):  # renamed columns say how to read them
        _check_strings(value, f"{what}: {where}")
        row = _read_renamed(value, f"{what}: {where}", columns)
        other = {key: item for key, item in value.items() if key not in fields}
        prompt = value.get(columns.get("prompt", "prompt"))
        if isinstance(prompt, list):  # a prompt of messages (TRL's conversational form), as written
            other["prompt"] = prompt
        if other:
            row[ROW_COLUMNS] = json.dumps(other, default=str)
        rows.append(row)
    return _dataset(rows)


def _dataset(rows: list[dict]) -> datasets.Dataset:
    """The rows as a data set, the optional columns (UNUSABLE, ROW_COLUMNS) in every row if in one: from_list takes
    the first row's keys."""
    for column in (UNUSABLE, ROW_COLUMNS):
        if any(column in row for row in rows):
            rows = [{**row, column: row.get(column)} for row in rows]
    return datasets.Dataset.from_list(rows)


def row_columns(row: dict) -> dict:
    """A row's columns as its file or data set wrote them: its text-form fields and the other columns read_rows
    kept (a reference answer beside a question, for reward functions that read it; a prompt of messages)."""
    kept = row.get(ROW_COLUMNS)
    return {**{key: item for key, item in row.items() if key not in (ROW_COLUMNS, UNUSABLE)},
            **(json.loads(kept) if kept else {})}


def _read_renamed(value: dict, where: str, columns: dict[str, str]) -> dict:
    """read_pair of the row with its columns renamed to the fields ({field: column}: a field's own column, if
    the row has one, gives way); its errors name the row's column and flag instead of the field."""
    if not columns:
        return read_pair(value, where)
    renamed = {key: item for key, item in value.items() if key not in columns and key not in columns.values()}
    renamed.update({field: value[column] for field, column in columns.items() if column in value})
    try:
        return read_pair(renamed, where)
    except DataError as err:
        raise relabelled(err, lambda field: f"field '{columns[field]}' ({column_flag(field)})"
                         if field in columns else None) from None


def _files_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(str(p.resolve()).encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:10]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "data"


# --------------------------------------------------------------------------- base


class RawDataset:
    """A data set's train/eval splits and per-sample prompt/chosen/rejected text."""

    name: str = ""        # registry name, e.g. "Dahoas/rm-static"
    clean_name: str = ""  # filesystem-safe, for cache file names

    def __init__(self, seed: int = BUILTIN_SEED):
        self.seed = seed

    def get_train_data(self) -> datasets.Dataset | None:
        return None

    def get_eval_data(self) -> datasets.Dataset | None:
        return None

    def get_prompt(self, sample) -> str | None:
        return None

    def get_chosen(self, sample) -> str | None:
        return None

    def get_rejected(self, sample) -> str | None:
        return None

    def skip_reason(self, sample) -> str | None:
        """Why a row with no prompt is skipped, where the data set says (None: "no prompt")."""
        return None

    def get_prompt_and_chosen(self, sample) -> str | None:
        prompt, chosen = self.get_prompt(sample), self.get_chosen(sample)
        return None if prompt is None or chosen is None else prompt + chosen

    def get_prompt_and_rejected(self, sample) -> str | None:
        prompt, rejected = self.get_prompt(sample), self.get_rejected(sample)
        return None if prompt is None or rejected is None else prompt + rejected

    def _text(self, sample, field: str) -> str:
        """sample[field] as a string, or a DataError naming the data set and field."""
        try:
            value = sample[field]
        except (KeyError, IndexError, TypeError):
            raise DataError(f"{self.name}: sample has no field '{field}'") from None
        if not isinstance(value, str):
            raise DataError(f"{self.name}: field '{field}' must be a string, got {type(value).__name__}")
        return value

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, seed={self.seed})"


# --------------------------------------------------------------------------- hub


def load_hub(name: str) -> datasets.DatasetDict:
    """`datasets.load_dataset(name)`: from the hub, or offline (HF_DATASETS_OFFLINE=1) from the Hugging Face cache;
    a failure is one DataError line."""
    try:
        return datasets.load_dataset(name)
    except Exception as exc:  # offline / not found / any hub failure: one line for the user
        raise DataError(
            f"data set '{name}' could not be downloaded from the Hugging Face hub nor read from its cache "
            f"({type(exc).__name__}: {one_line(exc, 160)}); offline, a data set in the Hugging Face cache, a "
            f"save_to_disk folder, a local path (a directory with train.json and eval.json, or a .json/.jsonl "
            f"file) or 'builtin' works"
        ) from exc


class HubDataset(RawDataset):
    """A data set from the Hugging Face hub, or the same schema passed in as `raw=`."""

    train_split: str = "train"
    eval_split: str | None = "test"  # None: only train exists; it is split 9:1

    def __init__(self, seed: int = BUILTIN_SEED, raw: datasets.DatasetDict | None = None):
        super().__init__(seed)
        self.raw = raw if raw is not None else self._load()
        needed = [self.train_split] + ([self.eval_split] if self.eval_split else [])
        for split in needed:
            if split not in self.raw:
                have = ", ".join(self.raw.keys()) or "none"
                raise DataError(f"{self.name}: no '{split}' split (it has: {have})")
            if len(self.raw[split]) == 0:
                raise DataError(f"{self.name}: the '{split}' split is empty")
        self._split: tuple[list[int], list[int]] | None = None

    def _load(self) -> datasets.DatasetDict:
        return load_hub(self.name)

    def _usable_train_indices(self) -> list[int]:
        """Rows of the train split that can be used (all, unless a subclass filters)."""
        return list(range(len(self.raw[self.train_split])))

    def _train_eval_indices(self) -> tuple[list[int], list[int]]:
        if self._split is None:
            usable = self._usable_train_indices()
            train, evl = split_train_eval(len(usable), self.seed, f"{self.name} train split")
            self._split = ([usable[i] for i in train], [usable[i] for i in evl])
        return self._split

    def get_train_data(self) -> datasets.Dataset:
        ds = self.raw[self.train_split]
        if self.eval_split is not None:
            return ds
        return ds.select(self._train_eval_indices()[0], keep_in_memory=True)

    def get_eval_data(self) -> datasets.Dataset:
        if self.eval_split is not None:
            return self.raw[self.eval_split]
        return self.raw[self.train_split].select(self._train_eval_indices()[1], keep_in_memory=True)


class FieldsAsWritten:
    """A data set whose rows hold the `prompt`, `chosen` and `rejected` texts already formatted."""

    def get_prompt(self, sample):
        return self._text(sample, "prompt")

    def get_chosen(self, sample):
        return self._text(sample, "chosen")

    def get_rejected(self, sample):
        return self._text(sample, "rejected")


class DahoasRmStatic(FieldsAsWritten, HubDataset):
    """prompt/response/chosen/rejected, already formatted ("\\n\\nHuman: ... Assistant:", " answer")."""

    name = "Dahoas/rm-static"
    clean_name = "Dahoas_rm_static"


class DahoasFullHHRLHF(DahoasRmStatic):
    name = "Dahoas/full-hh-rlhf"
    clean_name = "Dahoas_full_hh_rlhf"


class DahoasSyntheticInstructGPTJPairwise(HubDataset):
    """Bare prompt/chosen/rejected; train only. Wrapped as " Human: <p> Assistant:" + " <answer>"."""

    name = "Dahoas/synthetic-instruct-gptj-pairwise"
    clean_name = "Dahoas_synthetic_instruct_gptj_pairwise"
    eval_split = None

    def get_prompt(self, sample):
        return text_prompt(self._text(sample, "prompt"))

    def get_chosen(self, sample):
        return " " + self._text(sample, "chosen")

    def get_rejected(self, sample):
        return " " + self._text(sample, "rejected")


class YitingxieRLHFRewardDatasets(HubDataset):
    """prompt is the conversation up to the last assistant turn; chosen/rejected start with "Assistant:".

    As DeepSpeed-Chat: prompt + "Assistant:", and the answers are the text after their last
    "Assistant:", so prompt + chosen is the original prompt + chosen. "Assistant:" is not
    appended twice when the prompt already ends with it.
    """

    name = "yitingxie/rlhf-reward-datasets"
    clean_name = "yitingxie_rlhf_reward_datasets"

    def get_prompt(self, sample):
        prompt = self._text(sample, "prompt")
        return prompt if prompt.rstrip().endswith("Assistant:") else prompt + "Assistant:"

    def get_chosen(self, sample):
        return self._text(sample, "chosen").split("Assistant:")[-1]

    def get_rejected(self, sample):
        return self._text(sample, "rejected").split("Assistant:")[-1]


class OpenAIWebGPTComparisons(HubDataset):
    """question.full_text, answer_0/1, score_0/1; train only.

    chosen is the answer with the higher score, rejected the other; ties (no preference)
    are left out of both splits, and get_chosen/get_rejected return None for them.
    Citations like "[1]" or "(2)" are removed with DeepSpeed-Chat's two regexes.
    """

    name = "openai/webgpt_comparisons"
    clean_name = "openai_webgpt_comparisons"
    eval_split = None

    def _usable_train_indices(self):
        ds = self.raw[self.train_split]
        for field in ("score_0", "score_1"):
            if field not in ds.column_names:
                raise DataError(f"{self.name}: no field '{field}'")
        usable = []
        for i, (a, b) in enumerate(zip(list(ds["score_0"]), list(ds["score_1"]))):
            try:
                a, b = float(a), float(b)
            except (TypeError, ValueError):
                raise DataError(f"{self.name}: train row {i}: 'score_0'/'score_1' must be numbers") from None
            if a != b:
                usable.append(i)
        return usable

    def _scores(self, sample) -> tuple[float, float]:
        out = []
        for field in ("score_0", "score_1"):
            try:
                out.append(float(sample[field]))
            except (KeyError, TypeError, ValueError):
                raise DataError(f"{self.name}: field '{field}' is missing or not a number") from None
        return out[0], out[1]

    @staticmethod
    def _strip_citations(text: str) -> str:
        text = re.sub(r" [\(\[].*?[\)\]]", "", text)
        return re.sub(r"[\(\[].*?[\)\]]", "", text)

    def _answer(self, sample, better: bool) -> str | None:
        s0, s1 = self._scores(sample)
        if s0 == s1:
            return None
        field = "answer_0" if (s0 > s1) == better else "answer_1"
        return " " + self._strip_citations(self._text(sample, field))

    def get_prompt(self, sample):
        question = sample.get("question") if isinstance(sample, dict) else None
        if not isinstance(question, dict):
            raise DataError(f"{self.name}: field 'question' is missing or not an object")
        text = question.get("full_text")
        if not isinstance(text, str):
            raise DataError(f"{self.name}: field 'question.full_text' is missing or not a string")
        return text_prompt(text)

    def get_chosen(self, sample):
        return self._answer(sample, better=True)

    def get_rejected(self, sample):
        return self._answer(sample, better=False)


class StanfordNLPSHP(HubDataset):
    """history, human_ref_A/B, labels (1: A preferred, 0: B preferred); train/validation."""

    name = "stanfordnlp/SHP"
    clean_name = "stanfordnlp_SHP"
    eval_split = "validation"

    def _label(self, sample) -> int:
        try:
            label = int(sample["labels"])
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{self.name}: field 'labels' is missing or not an integer") from None
        if label not in (0, 1):
            raise DataError(f"{self.name}: field 'labels' must be 0 or 1, got {label}")
        return label

    def get_prompt(self, sample):
        return text_prompt(self._text(sample, "history"))

    def get_chosen(self, sample):
        return " " + self._text(sample, "human_ref_A" if self._label(sample) == 1 else "human_ref_B")

    def get_rejected(self, sample):
        return " " + self._text(sample, "human_ref_B" if self._label(sample) == 1 else "human_ref_A")


HUB_DATASETS: dict[str, type[HubDataset]] = {
    cls.name: cls
    for cls in (DahoasRmStatic, DahoasFullHHRLHF, DahoasSyntheticInstructGPTJPairwise,
                YitingxieRLHFRewardDatasets, OpenAIWebGPTComparisons, StanfordNLPSHP)
}


# --------------------------------------------------------------------------- local


EVAL_SPLITS = ("eval", "test", "validation")
"""The splits (a local folder's files) a data set's eval split is taken from, the first it has, unless `?eval=`
chooses one (else its train split is split 9:1)."""
SPLIT_KEYS = ("train", "eval")
"""The splits a data path may choose: `name?train=SPLIT&eval=SPLIT`."""


def split_choice(name: str) -> tuple[str, dict[str, str]]:
    """A data path's name and the splits it chooses (`HuggingFaceH4/ultrafeedback_binarized?train=train_prefs&
    eval=test_prefs`: {"train": "train_prefs", "eval": "test_prefs"}); a name without `?` chooses none."""
    base, mark, query = name.partition("?")
    if not mark:
        return name, {}
    chosen = {}
    for item in query.split("&"):
        key, equals, split = item.partition("=")
        if key not in SPLIT_KEYS or not equals or not split or key in chosen:
            raise ConfigError(f"data path '{name}': '?{query}' must choose splits as ?train=SPLIT&eval=SPLIT (either "
                              "or both, once each)")
        chosen[key] = unquote(split)
    return base, chosen


def _split_files(directory: Path, split: str) -> list[Path]:
    """A local folder's files of split `split`: `<split>.json` (or .jsonl, .parquet), or the shards a hub data
    set's snapshot holds (`<split>-00000-of-00002.parquet`, with or without a content hash after it:
    `<split>-00000-of-00001-a09b74b3ef9c3b56.parquet`), in the folder or its `data/` folder, or the data files of
    a folder named after the split (the hub's parquet conversion: `<config>/<split>/0000.parquet`); [] if none."""
    shard = re.compile(rf"{re.escape(split)}(-\d+-of-\d+(?:-[0-9a-f]+)?)?({'|'.join(map(re.escape, LOCAL_SUFFIXES))})"
                       rf"({re.escape(GZIP_SUFFIX)})?", re.IGNORECASE)
    for folder in (path for path in (directory, directory / "data") if path.is_dir()):
        found = sorted(p for p in folder.iterdir() if shard.fullmatch(p.name))
        if not found and (folder / split).is_dir() and not is_saved_dataset(folder / split):
            found = sorted(p for p in (folder / split).iterdir() if data_suffix(p) in LOCAL_SUFFIXES)
            if found:
                return [regular_file(path) for path in found]
        for path in found:
            regular_file(path)  # a folder, pipe or broken link under a split's name: said as such, not "no such file"
        whole = [p for p in found if not shard.fullmatch(p.name).group(1)]
        if len(whole) > 1:
            raise DataError(f"{folder}: both {whole[0].name} and {whole[1].name} exist; keep one")
        if found:
            return whole or found
    return []


def _no_split_file(directory: Path, split: str) -> str:
    return f"{directory}: no {split}.json (nor {', '.join(LOCAL_SUFFIXES[1:])}) in it or its data/ folder"


def _data_files(directory: Path) -> list[str]:
    """The names of the data files in a folder and its `data/` folder, for a message."""
    return sorted(str(p.relative_to(directory)) for folder in (directory, directory / "data") if folder.is_dir()
                  for p in folder.iterdir() if data_suffix(p) in LOCAL_SUFFIXES)


def _read_files(paths: list[Path], columns: dict[str, str] | None) -> datasets.Dataset:
    """A split of one file or several shards, read as read_local_split reads one."""
    if len(paths) == 1:
        return read_local_split(paths[0], columns)
    return _dataset([row for path in paths for row in read_local_split(path, columns).to_list()])


class ShapedRows(FieldsAsWritten):
    """Rows read into the text form by read_rows (`_train`, `_eval`): a row without an answer has None there."""

    def get_train_data(self):
        return self._train

    def get_eval_data(self):
        return self._eval

    def get_prompt(self, sample):
        return None if sample["prompt"] is None else super().get_prompt(sample)  # a row read as unusable

    def skip_reason(self, sample):
        return sample.get(UNUSABLE)

    def get_chosen(self, sample):
        return None if sample["chosen"] is None else super().get_chosen(sample)  # a prompt-only row

    def get_rejected(self, sample):
        return None if sample["rejected"] is None else super().get_rejected(sample)


class LocalJsonFile(ShapedRows, RawDataset):
    """Local prompt/chosen/rejected rows, used verbatim (see the module docstring for the format).

    `path` is a directory holding train.json and eval.json (either may be .jsonl instead),
    or a single .json/.jsonl file which is split 9:1 with `seed`. `name` is the registry
    name (default: the path as given). `clean_name` carries a digest of the resolved paths
    and the file contents, so caches keyed on it go stale when the data is edited.
    Files are read and validated when the object is made.
    """

    def __init__(self, path: str | os.PathLike, seed: int = BUILTIN_SEED, name: str | None = None,
                 columns: dict[str, str] | None = None, splits: dict[str, str] | None = None):
        super().__init__(seed)
        self.path = Path(os.path.expanduser(str(path)))
        self.name = name if name is not None else str(path)
        if self.path.is_dir():
            names = {"train": "train", **(splits or {})}
            train_files = _split_files(self.path, names["train"])
            if not train_files:
                present = _data_files(self.path)
                inner = sorted(sub.name for sub in self.path.iterdir() if sub.is_dir() and _split_files(sub, "train"))
                raise DataError(f"{_no_split_file(self.path, names['train'])}; " + (
                    f"it has {', '.join(present[:6])}: choose the splits as '{self.name}?train=NAME&eval=NAME'"
                    if present else f"its folders {', '.join(inner[:6])} have one: give them as --data_path (one or "
                    "more)" if inner else "a data folder needs train.json and eval.json"))
            eval_names = [names["eval"]] if "eval" in names else list(EVAL_SPLITS)
            eval_files = next((found for found in map(lambda n: _split_files(self.path, n), eval_names) if found), [])
            if "eval" in names and not eval_files:
                raise DataError(f"{_no_split_file(self.path, names['eval'])} (chosen by ?eval=)")
            self.train_file, self.eval_file = train_files[0], (eval_files[0] if eval_files else None)
            self._train = _read_files(train_files, columns)
            if eval_files:
                self._eval = _read_files(eval_files, columns)
            else:  # no eval file: the train split is split 9:1, as a single file
                train, evl = split_train_eval(len(self._train), seed, f"{self.path} train split")
                self._train, self._eval = (self._train.select(rows, keep_in_memory=True) for rows in (train, evl))
            files = (*train_files, *eval_files)
        elif self.path.is_file():
            if splits:
                raise ConfigError(f"{self.name}?...: a single file has no splits to choose (it is split 9:1); "
                                  "choose splits of a folder or a loaded data set")
            if data_suffix(self.path) not in LOCAL_SUFFIXES or self.path.name.lower().endswith(".parquet.gz"):
                raise DataError(f"{self.path}: unsupported file type '{self.path.suffix}'; "
                                f"expected a {', '.join(LOCAL_SUFFIXES)} file, or a directory with train.json and "
                                f"eval.json")
            self.train_file, self.eval_file = self.path, None
            rows = read_local_split(self.path, columns)
            train, evl = split_train_eval(len(rows), seed, str(self.path))
            self._train = rows.select(train, keep_in_memory=True)
            self._eval = rows.select(evl, keep_in_memory=True)
            files = (self.path,)
        elif self.path.exists():
            regular_file(self.path)  # a named pipe, a device: refused by name
        else:
            raise DataError(f"{self.path}: no such file or directory")
        label = self.path.stem if self.path.is_file() else self.path.resolve().name
        self.clean_name = f"local_{_safe(label)}_{_files_digest(*files)}"


def is_saved_dataset(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder `datasets` wrote with save_to_disk (a DatasetDict's or a Dataset's)."""
    path = Path(path)
    return (path / "dataset_dict.json").is_file() or ((path / "state.json").is_file()
                                                     and (path / "dataset_info.json").is_file())


class LoadedDataset(ShapedRows, RawDataset):
    """A data set `datasets` loads: a hub name (`load_dataset`, offline from the Hugging Face cache) or a
    save_to_disk folder (`load_from_disk`), read row by row as local files are (the shapes of
    utils/data/pair_formats.py, columns renamed by `columns`: {field: column}).

    The train split is `train` (or the only split there is); the eval split the first of EVAL_SPLITS it has,
    else the train split is split 9:1 with `seed`."""

    def __init__(self, name: str, loaded: datasets.DatasetDict | datasets.Dataset, seed: int = BUILTIN_SEED,
                 columns: dict[str, str] | None = None, chosen_splits: dict[str, str] | None = None):
        super().__init__(seed)
        self.name = name
        splits = {"train": loaded} if isinstance(loaded, datasets.Dataset) else dict(loaded)
        chosen = chosen_splits or {}
        for key, split in chosen.items():
            if split not in splits:
                raise DataError(f"{name}: no split '{split}' (chosen by ?{key}=; it has: {', '.join(splits)})")
        train = chosen.get("train") or ("train" if "train" in splits else next(iter(splits)) if len(splits) == 1
                                        else None)
        if train is None:
            some = [split for split in splits if split.startswith("train")] or list(splits)
            evals = [split for split in splits if split.startswith(("test", "valid", "eval"))] or list(splits)
            raise DataError(f"{name}: no 'train' split (it has: {', '.join(splits) or 'none'}); choose the splits as "
                            f"'{name}?train={some[0]}&eval={evals[0]}'")
        evaluation = chosen.get("eval") or next((split for split in EVAL_SPLITS if split in splits and split != train),
                                                None)
        self._train = self._read(splits[train], train, columns)
        if evaluation is None:
            train_rows, eval_rows = split_train_eval(len(self._train), seed, f"{name} {train} split")
            self._train, self._eval = (self._train.select(rows, keep_in_memory=True)
                                       for rows in (train_rows, eval_rows))
        else:
            self._eval = self._read(splits[evaluation], evaluation, columns)
        fingerprints = [getattr(splits[split], "_fingerprint", "") for split in (train, evaluation) if split]
        digest = hashlib.sha256(json.dumps([name, fingerprints]).encode()).hexdigest()[:10]
        self.clean_name = f"loaded_{_safe(name)}_{digest}"

    def _read(self, split: datasets.Dataset, split_name: str, columns: dict[str, str] | None) -> datasets.Dataset:
        return read_rows([(row, f"row {i}") for i, row in enumerate(split)], f"{self.name}: {split_name} split",
                         set(split.column_names), columns)

    @classmethod
    def from_disk(cls, path: str, seed: int = BUILTIN_SEED, columns: dict[str, str] | None = None,
                  chosen_splits: dict[str, str] | None = None):
        """A save_to_disk folder (`is_saved_dataset`)."""
        try:
            loaded = datasets.load_from_disk(os.path.expanduser(path))
        except Exception as exc:  # a damaged folder: its JSON or Arrow files
            raise DataError(f"{path}: not a readable save_to_disk folder ({type(exc).__name__}: "
                            f"{one_line(exc, 160)})") from None
        return cls(path, loaded, seed, columns, chosen_splits)


# --------------------------------------------------------------------------- builtin


def builtin_data_dir() -> Path:
    """The built-in task's data directory, generated on first use.

    `cache_dir()/builtin-data/v<utils.data.builtin_task.TASK_VERSION>-seed1234`, holding train.json,
    eval.json, heldout.json (for the evaluation scripts), unsup.txt (step 3's unsupervised
    text) and meta.json. `utils.data.builtin_task.write_builtin_data` writes it atomically (a temporary
    directory renamed into place), so concurrent ranks and interrupted runs are safe.
    """
    final = cache_dir() / "builtin-data" / f"v{task.TASK_VERSION}-seed{BUILTIN_SEED}"
    if not final.is_dir():
        task.write_builtin_data(final, seed=BUILTIN_SEED)
    missing = [f for f in BUILTIN_FILES if not (final / f).is_file()]
    if missing:
        raise DataError(f"{final}: built-in data is incomplete (no {', '.join(missing)}); "
                        f"delete the directory to regenerate it")
    return final


class Builtin(LocalJsonFile):
    """The built-in task (`builtin`): generated once with utils.data.builtin_task, then read like a local directory."""

    def __init__(self, seed: int = BUILTIN_SEED):
        data_dir = builtin_data_dir()
        super().__init__(data_dir, seed=seed, name="builtin")
        self.data_dir = data_dir
        self.clean_name = f"builtin_{data_dir.name.replace('-', '_')}"

    @property
    def heldout_path(self) -> Path:
        return self.data_dir / "heldout.json"

    @property
    def unsup_path(self) -> Path:
        return self.data_dir / "unsup.txt"
