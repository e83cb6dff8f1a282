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
   model with a chat template gets back as messages (utils.data.prompting); a system message is put before the
   first user turn's text, since the text form has no system turn.

4. **Prompts alone, or prompts with one answer**: a row with `prompt` and no `chosen` / `rejected` (RL prompts:
   step 3, the evaluation), or with `chosen` (or TRL's `completion`, or a whole chat in `messages`, its last
   message the answer) and no `rejected` (step 1 as well); the missing answers are None, and a step that needs
   them skips the row (counted in its log).

5. **Unpaired feedback** (KTO; TRL's unpaired preference form): `prompt`, one answer in `completion` (a string, or
   messages as in shape 3) and `label`, true for a desirable answer and false for an undesirable one:
   `{"prompt": " Human: What is 7 + 12? Assistant:", "completion": " 21", "label": false}`. A desirable answer is
   read as the row's `chosen` (step 1 imitates it), an undesirable one as its `rejected` with no `chosen`; KTO
   (training/step2_kto_finetuning/) takes both, and every pair of the shapes above as one of each.

6. **Two responses and the index of the better** (PKU-SafeRLHF: `prompt`, `response_0`, `response_1`,
   `better_response_id`; Stanford SHP: `history`, `human_ref_A`, `human_ref_B`, `labels`, 1 where A is preferred):
   the prompt is one user turn and the responses its answers, as in shape 3 with a prompt string.

A row that the text form cannot hold faithfully is read as unusable, with the reason (`UNUSABLE`), and each step
skips and counts it: HH dialogues that differ before their last turn (the answers would carry the later turns),
and messages whose text holds a speaker mark (`Human:`, `Assistant:`), which would read back as turns of their own.
An empty answer message is no answer, as an empty HH answer. Anything else is a `DataError` naming the row and
field.
"""
from __future__ import annotations

import os
from typing import Any

from utils.data.prompting import dialogue_text, has_speaker_mark
from utils.runtime.errors import DataError

PAIR_FIELDS = ("prompt", "chosen", "rejected")
ROLES = ("system", "user", "assistant")
ASSISTANT_MARK = "Assistant:"
UNUSABLE = "unusable"
"""The field of a row the text form cannot hold (its prompt and answers None): why, for the step's skip count."""
RANKED_SHAPES = (("response_0", "response_1", "better_response_id", "prompt"),
                 ("human_ref_A", "human_ref_B", "labels", "history"))
"""Shape 6's columns: (first response, second response, the better one's index, the prompt); for SHP the label
is 1 where the first is preferred, for PKU-SafeRLHF the index of the better response."""


class Unusable(Exception):
    """A row the text form cannot hold faithfully; read_pair returns it as a row of None with the reason."""


def unusable_row(reason: str) -> dict[str, str | None]:
    return {"prompt": None, "chosen": None, "rejected": None, UNUSABLE: reason}


def read_pair(value: dict, where: str) -> dict[str, str | None]:
    """{"prompt", "chosen", "rejected"} in the text form from one row of any of the module's shapes (answers None
    where the row has none; all three None and the reason under UNUSABLE for a row the text form cannot hold);
    `where` ("<file>: row 3 (line 4)") starts every error."""
    try:
        return _read_pair(value, where)
    except Unusable as why:
        return unusable_row(str(why))


def _read_pair(value: dict, where: str) -> dict[str, str | None]:
    value = _ranked(value, where)
    if "label" in value and "completion" in value and "chosen" not in value:  # KTO's unpaired feedback
        return _labelled(value, where)
    if "completion" in value and "chosen" not in value:  # TRL's prompt-completion form
        value = {**value, "chosen": value["completion"]}
    if "messages" in value and "chosen" not in value:  # a chat: its last message is the answer (a `prompt` beside
        messages = _messages(value["messages"], where, "messages")  # it, as in ultrachat_200k, repeats its start)
        if len(messages) < 2 or messages[-1]["role"] != "assistant":
            raise DataError(f"{where}: field 'messages' must end with an assistant message (the answer) after the "
                            "prompt's")
        value = {**value, "prompt": messages[:-1], "chosen": messages}
    if "rejected" in value and "chosen" not in value:
        raise DataError(f"{where}: missing field 'chosen'")
    if "chosen" not in value or "rejected" not in value:
        return _unpaired(value, where)
    if isinstance(value["chosen"], list):
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


def _ranked(value: dict, where: str) -> dict:
    """A row of shape 6 as one of shape 3 (a prompt string, one assistant message each); other rows as they are.
    Such a row whose responses were also named chosen and rejected (--chosen_key) is refused: the flags would
    ignore which response is the better."""
    for first, second, label, prompt in RANKED_SHAPES:
        renamed = "chosen" in value or "rejected" in value
        if label not in value or prompt not in value or not ({first, second} <= set(value) or renamed):
            continue
        if renamed:
            raise DataError(f"{where}: field '{label}' says which of '{first}' and '{second}' is the better; read "
                            "the row without --chosen_key and --rejected_key, which would ignore it")
        better = value[label]
        if isinstance(better, bool) or better not in (0, 1):
            raise DataError(f"{where}: field '{label}' must be 0 or 1, got {better!r}")
        if label == "labels":  # SHP: 1 where the first is preferred
            better = 1 - better
        answers = [value[first], value[second]]
        for name, answer in ((first, answers[0]), (second, answers[1])):
            if not isinstance(answer, str):
                raise DataError(f"{where}: field '{name}' must be a string, got {type(answer).__name__}")
        return {"prompt": value[prompt], "chosen": [{"role": "assistant", "content": answers[better]}],
                "rejected": [{"role": "assistant", "content": answers[1 - better]}]}
    return value


def _unpaired(value: dict, where: str) -> dict[str, str | None]:
    """A prompt alone, or with one answer: the missing answers None."""
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
    pair = _messages_pair(twin, where) if isinstance(chosen, list) else _read_pair(twin, where)
    return {**pair, "rejected": None}


def _labelled(value: dict, where: str) -> dict[str, str | None]:
    """A prompt with one answer (`completion`) labelled desirable (`label` true: the row's chosen) or undesirable
    (false: its rejected, with no chosen)."""
    label = value["label"]
    if not isinstance(label, bool):
        raise DataError(f"{where}: field 'label' must be true (a desirable completion) or false (an undesirable one), "
                        f"got {label!r}")
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
    chosen = _messages(value["chosen"], where, "chosen")
    rejected = _messages(value["rejected"], where, "rejected")
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
    """A checked list of {"role", "content"} messages."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field '{field}' must be a non-empty list of messages")
    messages = []
    for index, message in enumerate(value):
        if not (isinstance(message, dict) and message.get("role") in ROLES and isinstance(message.get("content"), str)):
            raise DataError(f"{where}: field '{field}', message {index}: expected {{\"role\": one of "
                            f"{', '.join(ROLES)}, \"content\": a string}}")
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


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
    if system:
        turns[0] = (f"{system}\n\n{turns[0][0]}", turns[0][1])
    return dialogue_text(turns)
