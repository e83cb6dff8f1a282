"""The shapes preference rows come in, read into one: DeepSpeed-Chat's text form (prompt, chosen, rejected).

Local data files, hub data sets and save_to_disk folders may hold any of these, row by row (the row's `chosen`
decides which), their columns first renamed to these fields by the --<field>_key flags (--prompt_key ...):

1. **Text form** (DeepSpeed-Chat, Dahoas/rm-static): `prompt`, `chosen` and `rejected` strings, used verbatim:
   `{"prompt": " Human: What is 7 + 12? Assistant:", "chosen": " 19", "rejected": " 21"}`.
2. **Whole dialogues** (Anthropic HH-RLHF): `chosen` and `rejected` strings each holding the whole conversation
   and no `prompt`: the prompt is what both share, up to and including the last `Assistant:` in it, and the
   answers are the rest of each: `{"chosen": "\\n\\nHuman: Hi\\n\\nAssistant: Hello!", "rejected": "\\n\\nHuman:
   Hi\\n\\nAssistant: Go away."}`. An answer left empty (HH-RLHF has a few) is None, as in shape 4.
3. **Messages** (TRL's conversational form, UltraFeedback binarized, OpenRLHF): `chosen` and `rejected` lists of
   `{"role": "user" | "assistant" | "system", "content": "..."}`, either the answer alone (with the prompt in
   `prompt` as a list of messages or as one user string) or the whole conversation (with or without a `prompt`
   field: the messages both share are the prompt). The answer is the one assistant message after the prompt.
   The conversation is written in the text form, `" Human: u1 Assistant: a1 Human: u2 Assistant:"`, which a
   model with a chat template gets back as messages (utils.data.prompting); a system message is the text before
   its first turn, which such a model gets back as its system message.

4. **Prompts alone, or prompts with one answer**: a row with `prompt` and no `chosen` / `rejected` (RL prompts:
   step 3, the evaluation), or with `chosen` (or TRL's `completion`, or a whole chat in `messages`, its last
   message the answer, or a prompt where the user's turn ends it) and no `rejected` (step 1 as well); the missing
   answers are None, and a step that needs them skips the row (counted in its log).

5. **Unpaired feedback** (KTO; TRL's unpaired preference form): `prompt`, one answer in `completion` (a string, or
   messages as in shape 3) and `label`, true for a desirable answer and false for an undesirable one:
   `{"prompt": " Human: What is 7 + 12? Assistant:", "completion": " 21", "label": false}`. A desirable answer is
   read as the row's `chosen` (step 1 imitates it), an undesirable one as its `rejected` with no `chosen`; KTO
   (training/step2_kto_finetuning/) takes both, and every pair of the shapes above as one of each.

6. **Two responses and a judgement of which is the better** (`RANKED_SHAPES`, one row per layout): PKU-SafeRLHF
   (`prompt`, `response_0`, `response_1`, `better_response_id`), Stanford SHP (`history`, `human_ref_A`,
   `human_ref_B`, `labels`, 1 where A is preferred), HelpSteer2's preferences (`prompt`, `response_1`, `response_2`,
   `preference_strength`, negative where the first is better) and HelpSteer3's (`context` as messages, `response1`,
   `response2`, `overall_preference`), WebGPT comparisons (`question.full_text`, `answer_0`, `answer_1`, `score_0`,
   `score_1`), Chatbot Arena (`conversation_a`, `conversation_b` whole conversations, `winner`; LMSYS's
   arena-human-preference data's JSON lists of turns `prompt`, `response_a`, `response_b` and one-hot
   `winner_model_a`, `winner_model_b`, `winner_tie` read as such): the prompt is one
   user turn (or its messages) and the responses its answers, as in shape 3. A tie is unusable.
7. **Instruction data and ShareGPT chats**: Alpaca's `instruction` (and `input`, on the next line), `output` (or
   `chosen` and `rejected`), `history` ([[instruction, answer], ...] before it); a `question` (Orca) or an `input`
   (OpenRLHF's default; `problem`, `query`) without a `prompt`; an answer in `output` or `response` without a
   `chosen`; Dolly's `context` after its instruction like Alpaca's input; ShareGPT's `conversations` of
   `{"from": "human" | "gpt" | "system", "value"}` (a whole chat, or, with `chosen` and `rejected` messages, the
   prompt of a pair: LLaMA-Factory's form), and Capybara's `conversation` of `{"input", "output"}` exchanges, read
   as ShareGPT's. Each is a user's turn, read as shape 3 or 4. A
   `system` (or `system_prompt`) string column is the prompt's first message wherever the row has none.

8. **A list of ranked or scored answers** (`LISTED_SHAPES`): Nectar's `answers` (`{"answer", "rank"}`, 1 the
   best), UltraFeedback's `completions` (`{"response", "overall_score"}`): the best answer is the chosen one, the
   worst the rejected one; all ranked alike is a tie.
9. **Pairs under other names** (`NAMED_PAIRS`): argilla's `chosen_response` and `rejected_response`, the
   StackExchange pairs' `response_j` (the better) and `response_k`, OpenAI's fine-tuning form for DPO
   (`preferred_output` and `non_preferred_output` messages, the prompt's in `input.messages`): read as chosen and
   rejected, the prompt as in shapes 3 and 7.
10. **Rated answers** (HelpSteer's and HelpSteer2's main files; `RATED_ANSWERS`): rows of a `prompt`, one
   `response` and its rating (`helpfulness`, else `score` or `rating`); the rows answering one prompt are one pair
   of shape 6 (the best-rated answer chosen, the worst rejected; rated alike, a tie), a prompt answered once a
   user's turn with one answer (shape 4). The one shape read across rows (`rated_pairs`), before the rest, and
   only where no --<field>_key flag renames the columns.

A prompt string in NeMo's chat markup (HelpSteer2's multi-turn prompts: `<extra_id_1>Assistant` and
`<extra_id_1>User` lines between the turns) is read as its turns, in any shape.

Messages may be OpenAI's: content as a list of text parts, the `developer` role as `system`. A KTO `label` may be
1 or 0, or a CSV file's text of a bool.

A row that the text form cannot hold faithfully is read as unusable, with the reason (`UNUSABLE`), and each step
skips and counts it: HH dialogues or conversations that differ before their last turn (the answers would carry the
later turns), messages whose text holds a speaker mark (`Human:`, `Assistant:`),
which would read back as turns of their own, conversations with tool calls or results or a part that is not text,
and ShareGPT dumps' empty chats and chats that start with the assistant (the tail of a split chat). Two responses
judged equal (or scored alike, or the chosen below the rejected, by the row's own score columns: `SCORED_PAIRS`)
are no pair and no answer to imitate, but their prompt is kept (`NoPair`): step 3 and the evaluation take it.
An empty answer message is no answer, as an empty HH answer. Anything else is a `DataError` naming the row and
field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable
from typing import Any

from utils.data.prompting import dialogue_system, dialogue_text, has_speaker_mark, parse_dialogue, with_system
from utils.data.text_files import json_value
from utils.runtime.errors import DataError

PAIR_FIELDS = ("prompt", "chosen", "rejected")
ROLES = ("system", "user", "assistant")
TOOL_ROLES = ("tool", "function", "ipython")
"""Roles of tool results (OpenAI, Llama 3): a conversation holding one is unusable (the text form has no tool turn)."""
LABELS = {True: True, False: False, "true": True, "false": False, "1": True, "0": False}
"""A KTO `label` as data sets write it: a bool, 1 or 0, or a CSV file's text of one (`True`, `false`, `1`, `0`)."""
TEXT_PARTS = ("text", "input_text", "output_text")
"""The `type`s of OpenAI's content parts that are text."""
ASSISTANT_MARK = "Assistant:"
UNUSABLE = "_chatrlhf_unusable"
"""The field of a row the text form cannot hold (its prompt and answers None): why, for the step's skip count."""
TIE = "the responses are judged equal (a tie)"
NEMO_TURN = re.compile(r"\n?<extra_id_[01]>(System|User|Assistant)\n")
"""A turn's mark in NeMo's chat markup, which HelpSteer2's multi-turn prompts keep: `<extra_id_1>User\n`."""


class Unusable(Exception):
    """A row the text form cannot hold faithfully; read_pair returns it as a row of None with the reason."""


class NoPair(Unusable):
    """A row whose answers are judged no pair (a tie, scored alike, the chosen scored below the rejected), `row` the
    row as it reads without that judgement: no answer of it is trained on, but its prompt is still a prompt (step 3,
    the evaluation; Chatbot Arena's ties are a third of its rows)."""

    def __init__(self, reason: str, row: dict):
        super().__init__(reason)
        self.row = row


def _index(field: str, first: object = 0) -> Callable[[dict, str], int | None]:
    """A judge reading `field` as the better response's index: `first` where the first is better."""
    def judge(value: dict, where: str) -> int | None:
        better = value[field]
        better = int(better) if better in ("0", "1") else better  # a CSV file's
        if isinstance(better, bool) or better not in (0, 1):
            raise DataError(f"{where}: field '{field}' must be 0 or 1, got {better!r}")
        return 0 if better == first else 1
    return judge


def _as_number(value: Any) -> float | None:
    """`value` as a finite number (not a bool, not NaN or infinite; a CSV file's text of one), None where it is
    none."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _number(value: dict, field: str, where: str, meaning: str = "") -> float:
    """The number in `field` (_as_number); a DataError naming the field otherwise."""
    number = _as_number(value[field])
    if number is None:
        raise DataError(f"{where}: field '{field}' must be a number{meaning}, got {value[field]!r}")
    return number


def _sign(field: str) -> Callable[[dict, str], int | None]:
    """A judge reading `field` as a preference strength: negative where the first is better, 0 a tie."""
    def judge(value: dict, where: str) -> int | None:
        strength = _number(value, field, where, " (negative where the first response is better)")
        return None if strength == 0 else int(strength > 0)
    return judge


def _scores(first: str, second: str) -> Callable[[dict, str], int | None]:
    """A judge comparing the two responses' scores: the higher is better, equal ones a tie."""
    def judge(value: dict, where: str) -> int | None:
        scores = [_number(value, field, where) for field in (first, second)]
        return None if scores[0] == scores[1] else int(scores[1] > scores[0])
    return judge


def _winner(field: str) -> Callable[[dict, str], int | None]:
    """A judge reading `field` as Chatbot Arena's winner: model_a, model_b, or a tie."""
    def judge(value: dict, where: str) -> int | None:
        winner = value[field]
        if winner in ("model_a", "model_b"):
            return int(winner == "model_b")
        if isinstance(winner, str) and winner.startswith("tie"):
            return None
        raise DataError(f"{where}: field '{field}' must be model_a, model_b or a tie, got {winner!r}")
    return judge


@dataclasses.dataclass(frozen=True)
class Ranked:
    """Shape 6: two responses and a judgement of which is the better."""
    first: str
    second: str
    prompt: str | None
    """The prompt's field; None where the responses are whole conversations that hold it."""
    judged_by: tuple[str, ...]
    """The fields the judgement is read from: their presence marks the shape."""
    judge: Callable[[dict, str], int | None]
    """The better response's index (0 the first), None for a tie."""


RANKED_SHAPES = (
    Ranked("response_0", "response_1", "prompt", ("better_response_id",), _index("better_response_id")),  # PKU
    Ranked("human_ref_A", "human_ref_B", "history", ("labels",), _index("labels", first=1)),  # SHP
    Ranked("response_1", "response_2", "prompt", ("preference_strength",), _sign("preference_strength")),  # HS2
    Ranked("response1", "response2", "context", ("overall_preference",), _sign("overall_preference")),  # HS3
    Ranked("answer_0", "answer_1", "question", ("score_0", "score_1"), _scores("score_0", "score_1")),  # WebGPT
    Ranked("conversation_a", "conversation_b", None, ("winner",), _winner("winner")),  # Chatbot Arena
)
"""Shape 6's layouts, one row each; a layout is known by its responses' and judgement's fields."""


@dataclasses.dataclass(frozen=True)
class Listed:
    """Shape 8: a list of answers, each with its rank or score; the best is the chosen answer, the worst the
    rejected one."""
    field: str
    """The list's field."""
    text: str
    """Each item's answer."""
    key: str
    """Each item's rank or score."""
    higher_is_better: bool


LISTED_SHAPES = (
    Listed("answers", "answer", "rank", higher_is_better=False),  # Nectar: rank 1 the best
    Listed("completions", "response", "overall_score", higher_is_better=True),  # UltraFeedback, before binarizing
)
"""Shape 8's layouts, one row each; a layout is known by its list's field, where the row has no chosen answer."""


NAMED_PAIRS = (("chosen_response", "rejected_response"),  # argilla's UltraFeedback binarized preferences
               ("response_j", "response_k"),  # StackExchange paired (TRL's StackLLaMA): j is the better
               ("preferred_output", "non_preferred_output"))  # OpenAI's fine-tuning data for DPO
"""Shape 9's (chosen, rejected) columns, where a row has neither `chosen` nor `rejected`."""

SCORED_PAIRS = (("score_chosen", "score_rejected"),  # HuggingFaceH4/ultrafeedback_binarized
                ("chosen_rating", "rejected_rating"),  # argilla's preference sets (dpo-mix-7k, ...)
                ("chosen-rating", "rejected-rating"),  # argilla/ultrafeedback-binarized-preferences-cleaned
                ("chosen_score", "rejected_score"),
                ("rating_chosen", "rating_rejected"))  # argilla/distilabel-capybara-dpo-7k-binarized
"""A pair's two scores beside its answers (shapes 3 and 9): equal ones are a tie, a chosen answer scored below its
rejected one a pair its own scores contradict; both unusable."""
TIE_STATUS = ("status", "tie")
"""argilla's distilabel-intel-orca-dpo-pairs: `status` "tie" where its judge found the two answers equal."""


RATED_ANSWERS = ("prompt", "response")
"""Shape 10's rows: a prompt and one answer, rated in one of RATINGS (HelpSteer and HelpSteer2's main files)."""
RATINGS = ("helpfulness", "score", "rating")


def rated_pairs(records: list[tuple[dict, str]]) -> list[tuple[dict, str]]:
    """Shape 10: rows that answer the same prompt once each, with a rating (the first of RATINGS their columns
    hold), as one row of shape 6 per prompt (the best-rated answer and the worst, HelpSteer2's preference
    layout: equal ratings a tie); a prompt answered once, and rows of other shapes, as they are."""
    fields = set().union(*(value.keys() for value, _ in records)) if records else set()
    rating = next((name for name in RATINGS if name in fields), None)
    if rating is None or not set(RATED_ANSWERS) <= fields or fields & {"chosen", "rejected", "completion"}:
        return records
    answers: dict[str, list[int]] = {}
    for index, (value, where) in enumerate(records):
        if isinstance(value.get("prompt"), str) and isinstance(value.get("response"), str) and \
                value.get(rating) is not None:
            _number(value, rating, where, " (the answer's rating)")
            answers.setdefault(value["prompt"], []).append(index)
    grouped, done = [], set()
    for index, (value, where) in enumerate(records):
        if index in done:
            continue
        rows = answers.get(value["prompt"], []) if isinstance(value.get("prompt"), str) else []
        if index not in rows:
            grouped.append((value, where))
            continue
        if len(rows) == 1:  # a user's turn and its answer, as the pairs' prompts and answers are read
            rest = {key: item for key, item in value.items() if key not in RATED_ANSWERS}
            grouped.append(({**rest, "prompt": value["prompt"],  # a user's turn, or NeMo's turns (_nemo_turns)
                             "chosen": [{"role": "assistant", "content": value["response"]}]}, where))
            continue
        done.update(rows)
        ranked = sorted(rows, key=lambda row: _as_number(records[row][0][rating]))
        best, worst = records[ranked[-1]][0], records[ranked[0]][0]
        shared = {key: item for key, item in value.items()  # the columns every answer's row agrees on
                  if all(records[row][0].get(key) == item for row in rows) and key not in RATED_ANSWERS}
        grouped.append(({**shared, "prompt": value["prompt"], "response_1": best["response"],
                         "response_2": worst["response"],
                         "preference_strength": _as_number(worst[rating]) - _as_number(best[rating])},
                        f"{where} and the {len(rows) - 1} other answer(s) to its prompt"))
    return grouped


def unusable_row(reason: str) -> dict[str, str | None]:
    return {"prompt": None, "chosen": None, "rejected": None, UNUSABLE: reason}


def read_pair(value: dict, where: str) -> dict[str, str | None]:
    """{"prompt", "chosen", "rejected"} in the text form from one row of any of the module's shapes (answers None
    where the row has none; all three None and the reason under UNUSABLE for a row the text form cannot hold, the
    prompt kept for answers judged no pair);
    `where` ("<file>: row 3 (line 4)") starts every error."""
    value, named = _named(value)
    try:
        _judged_alike(value)
        return _read_pair(value, where)
    except NoPair as judged:  # its prompt alone: read from the row as it reads without the judgement
        try:
            prompt = _read_pair(judged.row, where)["prompt"]
        except Unusable:
            prompt = None
        return {**unusable_row(str(judged)), "prompt": prompt}
    except Unusable as why:
        return unusable_row(str(why))
    except DataError as err:  # a shape-9 row's errors name its own columns
        if not named:
            raise
        raise relabelled(err, lambda field: f"field '{named[field]}'" if field in named else None) from None


def _judged_alike(value: dict) -> None:
    """Unusable where the row's own quality columns (SCORED_PAIRS, TIE_STATUS) say its answers are no pair: scored
    alike, the chosen below the rejected, or judged a tie. Scores that are not numbers (null) say nothing."""
    field, tie = TIE_STATUS
    if value.get(field) == tie and "chosen" in value:
        raise NoPair(TIE, value)
    for chosen, rejected in SCORED_PAIRS:
        scores = _as_number(value.get(chosen)), _as_number(value.get(rejected))
        if None in scores:
            continue
        if scores[0] == scores[1]:
            raise NoPair(f"{TIE}: '{chosen}' equals '{rejected}'", value)
        if scores[0] < scores[1]:
            raise NoPair(f"'{chosen}' is below '{rejected}'", value)


def relabelled(err: DataError, label: Callable[[str], str | None]) -> DataError:
    """`err` with each "field 'x'" it names written as label(x) instead (as it is where label gives None): the
    errors of a row whose columns were read as other fields name the row's own columns."""
    return DataError(re.sub(r"field '(\w+)'", lambda match: label(match.group(1)) or match.group(0), str(err)))


def _read_pair(value: dict, where: str) -> dict[str, str | None]:
    value = _nemo_turns(value)
    value = _instruction_layout(_listed(_ranked(_arena_lists(value, where), where), where), where)
    if "label" in value and "completion" in value and "chosen" not in value:  # KTO's unpaired feedback
        return _labelled(value, where)
    if "completion" in value and "chosen" not in value:  # TRL's prompt-completion form
        value = {**value, "chosen": value["completion"]}
    if "messages" in value and "chosen" not in value:  # a chat: its last message is the answer (a `prompt` beside
        messages = _messages(value["messages"], where, "messages")  # it, as in ultrachat_200k, repeats its start)
        if messages[-1]["role"] != "assistant":  # a chat that ends with the user's turn: a prompt, as ShareGPT's
            value = {**value, "prompt": messages}
        elif len(messages) < 2:
            raise DataError(f"{where}: field 'messages' holds an assistant message alone: no prompt before it")
        else:
            value = {**value, "prompt": messages[:-1], "chosen": messages}
    if "rejected" in value and "chosen" not in value:
        raise DataError(f"{where}: missing field 'chosen'")
    if "chosen" not in value or "rejected" not in value:
        return _unpaired(value, where)
    if isinstance(value["chosen"], list) or isinstance(value.get("prompt"), list):
        return _messages_pair(value, where)
    for field in PAIR_FIELDS:
        if field == "prompt" and field not in value:
            continue
        if not isinstance(value[field], str):
            kinds = "a string" if field == "prompt" else "a string or a list of messages"
            raise DataError(f"{where}: field '{field}' must be {kinds}, got {type(value[field]).__name__}")
        if not value[field]:  # a blank answer is kept: an answer an actor gave (" "), a pair's rejected one
            raise DataError(f"{where}: field '{field}' is empty")
    if "prompt" in value:
        return {field: value[field] for field in PAIR_FIELDS}
    return _dialogues_pair(value["chosen"], value["rejected"], where)


def _nemo_turns(value: dict) -> dict:
    """A row whose prompt string is in NeMo's chat markup (HelpSteer2's multi-turn prompts: the first user turn,
    then `<extra_id_1>Assistant\n...\n<extra_id_1>User\n...`) with its prompt as those messages; other rows as
    they are."""
    prompt = value.get("prompt")
    if not isinstance(prompt, str) or not NEMO_TURN.search(prompt):
        return value
    parts = NEMO_TURN.split(prompt)  # the text before the first mark, then each mark's role and its text
    messages = [{"role": "user", "content": parts[0]}] if parts[0].strip() else []
    messages += [{"role": role.lower(), "content": text} for role, text in zip(parts[1::2], parts[2::2])]
    return {**value, "prompt": messages}


def _ranked(value: dict, where: str) -> dict:
    """A row of shape 6 as one of shape 3 (its prompt, one answer each); other rows as they are. Such a row whose
    responses were also named chosen and rejected (--chosen_key) is refused: the flags would ignore which response
    is the better."""
    fields = set(value)
    renamed = "chosen" in value or "rejected" in value
    for shape in RANKED_SHAPES:
        if (not set(shape.judged_by) <= fields or (shape.prompt and shape.prompt not in fields)
                or not ({shape.first, shape.second} <= fields or renamed)):
            continue
        if renamed:
            raise DataError(f"{where}: field '{shape.judged_by[0]}' says which of '{shape.first}' and "
                            f"'{shape.second}' is the better; read the row without --chosen_key and --rejected_key, "
                            "which would ignore it")
        better = shape.judge(value, where)
        answers = [_response(value[field], where, field, shape.prompt is None) for field in (shape.first, shape.second)]
        row = {"chosen": answers[better or 0], "rejected": answers[1 - (better or 0)]}
        if shape.prompt:
            prompt = value[shape.prompt]  # WebGPT's question is a record whose full_text is the question
            row["prompt"] = prompt["full_text"] if isinstance(prompt, dict) and "full_text" in prompt else prompt
        if better is None:
            raise NoPair(TIE, row)
        return row
    return value


ARENA_LISTS = ("prompt", "response_a", "response_b")
ARENA_VOTES = ("winner_model_a", "winner_model_b", "winner_tie")


def _arena_lists(value: dict, where: str) -> dict:
    """A row of LMSYS's arena-human-preference data (the Kaggle competition's: ARENA_LISTS JSON lists of each
    turn's text, one vote in ARENA_VOTES) as Chatbot Arena's (shape 6: whole conversations and a winner); other
    rows as they are. A turn without a response (null) makes the row unusable."""
    if not set(ARENA_LISTS + ARENA_VOTES) <= set(value):
        return value
    turns = {}
    for field in ARENA_LISTS:
        try:
            turns[field] = (json_value(value[field], f"{where}: field '{field}'") if isinstance(value[field], str)
                            else value[field])
        except json.JSONDecodeError:
            turns[field] = None
        if not (isinstance(turns[field], list) and turns[field]
                and all(text is None or isinstance(text, str) for text in turns[field])):
            raise DataError(f"{where}: field '{field}' must be a list of each turn's text (or its JSON)")
    if len({len(texts) for texts in turns.values()}) > 1:
        raise DataError(f"{where}: fields {', '.join(ARENA_LISTS)} must hold as many turns each")
    if any(text is None for texts in turns.values() for text in texts):
        raise Unusable("a turn without a response")
    votes = [_number(value, field, where) for field in ARENA_VOTES]
    if sorted(votes) != [0, 0, 1]:
        raise DataError(f"{where}: fields {', '.join(ARENA_VOTES)} must hold one 1 and two 0s, got {votes}")
    conversations = {side: [message for user, answer in zip(turns["prompt"], turns[f"response_{side}"])
                            for message in ({"role": "user", "content": user},
                                            {"role": "assistant", "content": answer})] for side in "ab"}
    rest = {key: item for key, item in value.items() if key not in ARENA_LISTS + ARENA_VOTES}
    winner = ("model_a", "model_b", "tie")[votes.index(1)]
    return {**rest, "conversation_a": conversations["a"], "conversation_b": conversations["b"], "winner": winner}


def _named(value: dict) -> tuple[dict, dict[str, str]]:
    """(a row of shape 9 with its answers as `chosen` and `rejected` and OpenAI's `input.messages` as its prompt,
    {field: the row's own column}); other rows as they are, with {}."""
    if "chosen" in value or "rejected" in value:
        return value, {}
    for chosen, rejected in NAMED_PAIRS:
        if chosen in value and rejected in value:
            row = {key: item for key, item in value.items() if key not in (chosen, rejected)}
            row.update(chosen=value[chosen], rejected=value[rejected])
            named = {"chosen": chosen, "rejected": rejected}
            given = row.get("input")
            if "prompt" not in row and isinstance(given, dict) and "messages" in given:
                row["prompt"], named["prompt"] = given["messages"], "input.messages"
                del row["input"]
            return row, named
    return value, {}


def _listed(value: dict, where: str) -> dict:
    """A row of shape 8 as one of shape 3 (its prompt as messages, the best and the worst answer); other rows as they
    are. All answers ranked alike is a tie (unusable)."""
    for shape in LISTED_SHAPES:
        items = value.get(shape.field)
        if not isinstance(items, list) or "chosen" in value or "rejected" in value:
            continue
        ranked = []
        for index, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get(shape.text), str) or shape.key not in item:
                raise DataError(f"{where}: field '{shape.field}', item {index}: expected {{\"{shape.text}\": a "
                                f"string, \"{shape.key}\": a number}}")
            rank = _number(item, shape.key, f"{where}: field '{shape.field}', item {index}")
            ranked.append((rank if shape.higher_is_better else -rank, item[shape.text]))
        if len(ranked) < 2:
            raise Unusable(f"fewer than two answers in '{shape.field}'")
        ranked.sort(key=lambda pair: pair[0])
        row = {key: item for key, item in value.items() if key != shape.field}
        if isinstance(row.get("prompt"), str):  # Nectar's prompt is in the text form: its turns as messages
            row["prompt"] = _turn_messages(row["prompt"])
        row = {**row, "chosen": ranked[-1][1], "rejected": ranked[0][1]}
        if ranked[0][0] == ranked[-1][0]:
            raise NoPair(TIE, row)
        return row
    return value


def _response(response: Any, where: str, field: str, conversation: bool) -> list[dict]:
    """One response of shape 6 as messages: a string is one assistant message; a whole `conversation` (a layout
    without a prompt field) is checked messages."""
    if conversation:
        return _messages(response, where, field)
    if isinstance(response, str):
        return [{"role": "assistant", "content": response}]
    raise DataError(f"{where}: field '{field}' must be a string, got {type(response).__name__}")


SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant", "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
                  "system": "system"}
"""ShareGPT's speakers (`from`) as roles."""
SHAREGPT_TOOLS = ("function_call", "observation", "tool", "function")
"""ShareGPT's speakers of tool calls and results (glaive, LLaMA-Factory): a conversation with one is unusable."""
MESSAGE_TREE = {"message_id", "parent_id"}
"""The fields of a row that is one message of a conversation tree (OpenAssistant's oasst1), not a whole row."""
INSTRUCTION_PROMPTS = ("question", "problem", "query", "input")
"""Other names of a prompt string, where a row has no `prompt` (nor `instruction`): Orca's and GSM8K's, MATH's,
MetaMathQA's, OpenRLHF's default."""
INSTRUCTION_INPUTS = ("input", "context")
"""The text that follows an `instruction` on the next line: Alpaca's `input`, Dolly's `context`."""
SYSTEM_FIELDS = ("system", "system_prompt")
"""A row's system prompt: LLaMA-Factory's and Orca DPO pairs' `system`, OpenOrca's `system_prompt`."""
INSTRUCTION_ANSWERS = ("output", "response")
"""Other names of an answer string, where a row has no `chosen` (nor `completion`)."""
READ_FIELDS = {"instruction", *INSTRUCTION_PROMPTS, *INSTRUCTION_INPUTS, *SYSTEM_FIELDS, *INSTRUCTION_ANSWERS,
               "history", "conversations", "conversation", "messages", "completion", "label"}
"""Columns the shapes of instruction data, chats and labelled answers read (besides prompt, chosen and rejected):
never named as columns left unread."""


def _exchanges(exchanges: list, where: str) -> list[dict]:
    """A chat as a list of exchanges, `{"input": the user's turn, "output": the assistant's}` (LDJnr/Capybara,
    Pure-Dove), as ShareGPT's messages."""
    messages = []
    for index, exchange in enumerate(exchanges):
        if not (isinstance(exchange, dict) and isinstance(exchange.get("input"), str)
                and isinstance(exchange.get("output"), str)):
            raise DataError(f"{where}: field 'conversation', exchange {index}: expected {{\"input\": a string, "
                            "\"output\": a string}")
        messages += [{"from": "human", "value": exchange["input"]}, {"from": "gpt", "value": exchange["output"]}]
    return messages


def _instruction_layout(value: dict, where: str) -> dict:
    """A row of shape 7 (instruction data, ShareGPT chats, a `system` column) as one of shapes 3 to 5; other rows
    as they are."""
    value = dict(value)
    if isinstance(value.get("conversation"), list) and not {"conversations", "messages", "chosen"} & set(value):
        value["conversations"] = _exchanges(value.pop("conversation"), where)  # beside a pair: its source chat
    if "conversations" in value and "messages" not in value:
        messages = _sharegpt(value.pop("conversations"), where, "conversations")
        if "chosen" in value or "rejected" in value:  # LLaMA-Factory's pairs: the answers one message each
            value["prompt"] = messages
            for field in ("chosen", "rejected"):
                if isinstance(value.get(field), dict):
                    value[field] = _sharegpt([value[field]], where, field, conversation=False)
        elif messages[-1]["role"] == "assistant":
            value["messages"] = messages
        else:  # a chat that ends with the user's turn: a prompt
            value["prompt"] = messages
    if "prompt" not in value and "messages" not in value:  # a user's instruction: one user message
        if "instruction" in value:  # Alpaca: the instruction, then its input on the next line
            parts = [_text(value, field, where) for field in ("instruction", *INSTRUCTION_INPUTS) if field in value]
            value["prompt"] = [{"role": "user", "content": "\n".join(part for part in parts if part.strip())}]
        else:
            for field in INSTRUCTION_PROMPTS:
                if isinstance(value.get(field), str):
                    value["prompt"] = [{"role": "user", "content": value[field]}]
                    break
    if not {"chosen", "completion", "messages"} & set(value):
        for field in INSTRUCTION_ANSWERS:
            if field in value and "prompt" in value:
                value["chosen"] = _text(value, field, where)
                break
    if "history" in value and isinstance(value.get("prompt"), list):
        value["prompt"] = _history(value["history"], where) + value["prompt"]
    for field in SYSTEM_FIELDS:
        if value.get(field) is not None:  # empty or not, a row with a system column reads as a conversation
            return _with_system(value, _text(value, field, where))
    return value


def _text(value: dict, field: str, where: str) -> str:
    if not isinstance(value[field], str):
        raise DataError(f"{where}: field '{field}' must be a string, got {type(value[field]).__name__}")
    return value[field]


def _sharegpt(value: Any, where: str, field: str, conversation: bool = True) -> list[dict]:
    """ShareGPT's `{"from", "value"}` messages (or `{"role", "content"}` ones) as checked messages. What real dumps
    hold besides whole chats is unusable rather than an error for the whole file: a conversation with tool turns
    (SHAREGPT_TOOLS) and, unless the messages are an answer (not `conversation`), an empty one or one that starts
    with the assistant (the tail of a split chat); the assistant's consecutive turns (a split answer) are one."""
    if not isinstance(value, list):
        raise DataError(f"{where}: field '{field}' must be a list of messages")
    if not value and conversation:
        raise Unusable("an empty conversation")
    messages = []
    for index, message in enumerate(value):
        if isinstance(message, dict) and "from" in message:
            if message["from"] in SHAREGPT_TOOLS:
                raise Unusable("the conversation holds tool calls or tool results")
            role = SHAREGPT_ROLES.get(message["from"]) if isinstance(message["from"], str) else None
            if role is None:
                raise DataError(f"{where}: field '{field}', message {index}: speaker {message['from']!r} is none of "
                                f"{', '.join(SHAREGPT_ROLES)}")
            message = {"role": role, "content": message.get("value")}
        messages.append(message)
    messages = _messages(messages, where, field)
    spoken = [message for message in messages if message["role"] != "system"]
    if conversation and spoken and spoken[0]["role"] == "assistant":
        raise Unusable("the conversation starts with the assistant")
    merged = []
    for message in messages:
        if merged and message["role"] == merged[-1]["role"] == "assistant":
            merged[-1] = {**merged[-1], "content": f"{merged[-1]['content']}\n\n{message['content']}"}
        else:
            merged.append(message)
    return merged


def _history(history: Any, where: str) -> list[dict]:
    """Alpaca's `history`, [[instruction, answer], ...], as the messages before the row's instruction."""
    if not isinstance(history, list) or not all(
            isinstance(turn, (list, tuple)) and len(turn) == 2 and all(isinstance(t, str) for t in turn)
            for turn in history):
        raise DataError(f"{where}: field 'history' must be a list of [instruction, answer] string pairs")
    return [{"role": role, "content": text} for turn in history for role, text in zip(("user", "assistant"), turn)]


def _with_system(value: dict, system: str) -> dict:
    """The row with its prompt (or chat) as messages, its `system` text the first one unless it is empty or the
    messages have one already: every row of a file with a system column is read as a conversation alike (Intel's
    orca_dpo_pairs and truthy-dpo leave some rows' system empty)."""
    key = "prompt" if "prompt" in value else "messages" if "messages" in value else None
    if key is None:
        return value
    messages = _turn_messages(value[key]) if isinstance(value[key], str) else value[key]
    if not isinstance(messages, list):
        return value
    if not system.strip() or any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
        return {**value, key: messages}
    return {**value, key: [{"role": "system", "content": system}, *messages]}


def _turn_messages(prompt: str) -> list[dict]:
    """A prompt string (the text form, or plain: one user turn) as its turns' messages, its system prompt first."""
    system = dialogue_system(prompt)
    messages = [{"role": "system", "content": system}] if system else []
    for user, answer in parse_dialogue(prompt):
        messages.append({"role": "user", "content": user})
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
    return messages


def _unpaired(value: dict, where: str) -> dict[str, str | None]:
    """A prompt alone, or with one answer: the missing answers None."""
    if "prompt" not in value and MESSAGE_TREE <= set(value):
        raise DataError(f"{where}: a message of a tree (OpenAssistant's oasst1: 'message_id', 'parent_id'), one row "
                        "a message; rows must be whole: flatten each path from a tree's root into 'messages' (as "
                        "oasst1's ready-made chat versions do), or its ranked replies into 'chosen' and 'rejected'")
    if "prompt" not in value and "text" in value:  # TRL's language-modelling form
        raise DataError(f"{where}: field 'text' holds a whole text, with no prompt and answer to tell apart; give "
                        "'prompt' and 'completion', or the chat as 'messages' (or name them with --prompt_key ...)")
    if "prompt" not in value:
        raise DataError(f"{where}: missing field 'prompt' (a row needs a prompt, or 'chosen' and 'rejected')")
    if "chosen" not in value:
        prompt = value["prompt"]
        if isinstance(prompt, list):
            return {"prompt": _prompt_text(_messages(prompt, where, "prompt"), where), "chosen": None,
                    "rejected": None}
        return {"prompt": _prompt_string(prompt, where), "chosen": None, "rejected": None}
    chosen = value["chosen"]
    twin = {**value, "rejected": chosen}  # read as a pair with itself, then the copy dropped
    messages = isinstance(chosen, list) or isinstance(value["prompt"], list)
    pair = _messages_pair(twin, where) if messages else _read_pair(twin, where)
    return {**pair, "rejected": None}


def _labelled(value: dict, where: str) -> dict[str, str | None]:
    """A prompt with one answer (`completion`) labelled desirable (`label` true: the row's chosen) or undesirable
    (false: its rejected, with no chosen)."""
    key = value["label"].strip().lower() if isinstance(value["label"], str) else value["label"]
    label = LABELS.get(key) if isinstance(key, (str, int, float)) else None  # a list or an object is no label
    if not isinstance(label, bool):
        raise DataError(f"{where}: field 'label' must be true (a desirable completion) or false (an undesirable one), "
                        f"got {value['label']!r}")
    if "rejected" in value:
        raise DataError(f"{where}: field 'rejected' does not go with 'label' (a labelled row has one answer, in "
                        "'completion')")
    if "prompt" not in value:
        raise DataError(f"{where}: missing field 'prompt' (a labelled completion needs its prompt)")
    try:
        pair = _unpaired({"prompt": value["prompt"], "chosen": value["completion"]}, where)
    except DataError as err:  # the answer is read as a chosen one: name the field the row has
        raise DataError(str(err).replace("field 'chosen'", "field 'completion'")) from None
    return pair if label else {**pair, "chosen": None, "rejected": pair["chosen"]}


def _dialogues_pair(chosen: str, rejected: str, where: str) -> dict[str, str | None]:
    """HH-RLHF's whole dialogues: the shared text up to its last `Assistant:` is the prompt; an answer that is empty
    after it (HH-RLHF has such rows) is None, which a step that needs it skips and counts."""
    shared = len(os.path.commonprefix([chosen, rejected]))
    cut = chosen.rfind(ASSISTANT_MARK, 0, shared)
    if cut < 0:
        raise DataError(f"{where}: missing field 'prompt', and 'chosen' and 'rejected' share no dialogue up to an "
                        f"'{ASSISTANT_MARK}' to take it from")
    cut += len(ASSISTANT_MARK)
    answers = {"chosen": chosen[cut:], "rejected": rejected[cut:]}
    if any(has_speaker_mark(answer) for answer in answers.values()):
        raise Unusable("chosen and rejected dialogues differ before their last turn")
    return {"prompt": chosen[:cut], **{field: answer if answer.strip() else None for field, answer in answers.items()}}


def _messages_pair(value: dict, where: str) -> dict[str, str]:
    """Lists of messages: the prompt's messages (given, or shared by both), then one assistant answer each."""
    strings = isinstance(value.get("prompt"), list)  # beside a prompt of messages, an answer may be a string
    chosen, rejected = (_answer_messages(value[field], where, field, strings) for field in ("chosen", "rejected"))
    prompt = value.get("prompt")
    if isinstance(prompt, list):
        prompt = _messages(prompt, where, "prompt")
    elif prompt is not None:
        prompt = _prompt_string(prompt, where)
    if isinstance(prompt, list):
        chosen, rejected = (_after(prompt, messages) for messages in (chosen, rejected))
    elif len(chosen) > 1 or len(rejected) > 1:  # whole conversations: the prompt is what they share
        shared = 0
        while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
            shared += 1
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        if len(chosen) > 1 or len(rejected) > 1:
            raise Unusable("chosen and rejected conversations differ before their last turn")
    else:
        if prompt is None:
            raise DataError(f"{where}: missing field 'prompt' ('chosen' and 'rejected' hold the answers only)")
        prompt = [{"role": "user", "content": prompt}]
    for field, messages in (("chosen", chosen), ("rejected", rejected)):
        if len(messages) != 1 or messages[0]["role"] != "assistant":
            raise DataError(f"{where}: field '{field}' must end in one assistant message after the prompt, got "
                            f"{[m['role'] for m in messages]}")
    answers = {field: messages[0]["content"].strip() for field, messages in (("chosen", chosen),
                                                                             ("rejected", rejected))}
    return {"prompt": _prompt_text(prompt, where),  # an empty answer is none, as HH-RLHF's empty last turns
            **{field: " " + answer if answer else None for field, answer in answers.items()}}


def _answer_messages(answer: Any, where: str, field: str, strings: bool) -> list[dict]:
    """An answer's messages; with `strings`, a string is one assistant message."""
    if strings and isinstance(answer, str):
        return [{"role": "assistant", "content": answer}]
    return _messages(answer, where, field)


def _prompt_string(prompt: Any, where: str) -> str:
    """A prompt given as one string (beside answers as messages, or alone), checked."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: field 'prompt' must be a non-empty string or a list of messages, got "
                        f"{type(prompt).__name__ if not isinstance(prompt, str) else 'an empty string'}")
    return prompt


def _after(prompt: list[dict], messages: list[dict]) -> list[dict]:
    """`messages` without `prompt` where they start with it (a whole conversation), else as they are."""
    return messages[len(prompt):] if messages[:len(prompt)] == prompt else messages


def _messages(value: Any, where: str, field: str) -> list[dict]:
    """A checked list of {"role", "content"} messages. OpenAI's forms read as such: content as a list of text parts
    (`{"type": "text", "text": ...}`) is their text joined, the `developer` role is `system`; a conversation with
    tool calls or tool results (TOOL_ROLES, an assistant's `tool_calls`), or a part that is not text (an image), is
    unusable: the text form holds neither."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field '{field}' must be a non-empty list of messages")
    messages = []
    for index, message in enumerate(value):
        role = content = None
        if isinstance(message, dict):
            if message.get("role") in TOOL_ROLES or message.get("tool_calls"):
                raise Unusable("the conversation holds tool calls or tool results")
            role = "system" if message.get("role") == "developer" else message.get("role")
            content = _content_text(message.get("content"))
        if not (role in ROLES and isinstance(content, str)):
            raise DataError(f"{where}: field '{field}', message {index}: expected {{\"role\": one of "
                            f"{', '.join(ROLES)}, \"content\": a string or a list of text parts}}")
        messages.append({"role": role, "content": content})
    return messages


def _content_text(content: Any) -> Any:
    """A message's content as text: a string as it is, a list of OpenAI's content parts as their texts joined
    (Unusable where a part is not text); anything else as it is, for the caller to refuse."""
    if not isinstance(content, list) or not all(isinstance(part, dict) and "type" in part for part in content):
        return content
    if any(part["type"] not in TEXT_PARTS or not isinstance(part.get("text"), str) for part in content):
        raise Unusable("a message holds a part that is not text (an image, audio, a file)")
    return "".join(part["text"] for part in content)


def _prompt_text(messages: list[dict], where: str) -> str:
    """The prompt's messages in the text form, ending with the `Assistant:` the answer follows."""
    if any(has_speaker_mark(message["content"]) for message in messages):
        raise Unusable("a message's text holds 'Human:' or 'Assistant:', which would read as a turn")
    system = "\n".join(m["content"].strip() for m in messages if m["role"] == "system")
    turns, user = [], None
    for message in (m for m in messages if m["role"] != "system"):
        content = message["content"].strip()
        if message["role"] == "user":
            user = content if user is None else f"{user}\n{content}"
        elif user is None:
            raise DataError(f"{where}: field 'prompt': an assistant message comes before any user message")
        else:
            turns.append((user, content))
            user = None
    if not user:
        raise DataError(f"{where}: field 'prompt' must end with a non-empty user message")
    turns.append((user, None))
    return with_system(system, dialogue_text(turns))
