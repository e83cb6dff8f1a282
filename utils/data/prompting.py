"""Prompts as data sets write them and as a model wants them.

Data sets use DeepSpeed-Chat's text form, `" Human: q1 Assistant: a1 Human: q2 Assistant:"`; the text before its
first turn, if any, is the conversation's system prompt (`"Be brief.\n\n Human: q1 Assistant:"`). A model whose
tokenizer has a chat template (SmolLM2, Llama-3, Qwen...) is given the same conversation in its own format
instead, the system prompt as its system message (in place of the template's default one), ending with its
generation prompt, and answers without the leading space of the text form. A model without a template gets the
text form as it is.
"""
import re

from utils.runtime.errors import ConfigError

_SPEAKER = re.compile(r"(?:^|\s)(Human|Assistant):")


def has_speaker_mark(text):
    """Whether `text` holds a speaker mark (`Human:`, `Assistant:` at its start or after white space) that
    parse_dialogue would read as the start of a turn."""
    return bool(_SPEAKER.search(text))


def text_prompt(user):
    """One user turn in DeepSpeed-Chat's text form: `" Human: <user> Assistant:"`."""
    return f" Human: {user} Assistant:"


def has_chat_template(tokenizer):
    return bool(getattr(tokenizer, "chat_template", None))


def parse_dialogue(prompt):
    """[(user, assistant), ..., (user, None)] from a prompt in DeepSpeed-Chat's form; a prompt without
    speaker markers is one user turn. An empty assistant turn before the last ("... Assistant: Human: ...", about
    1% of HH-RLHF's rows) is a turn whose answer is "", as written."""
    pieces = _SPEAKER.split(prompt)
    if len(pieces) < 3:
        return [(prompt.strip(), None)]
    turns, user = [], None
    for speaker, text in zip(pieces[1::2], pieces[2::2]):
        text = text.strip()
        if speaker == "Human":
            user = text if user is None else f"{user}\n{text}"
        elif user is not None:
            turns.append((user, text))
            user = None
    if user is not None:
        turns.append((user, None))
    if not turns or turns[-1][1] is not None:
        turns[-1:] = [(turns[-1][0], None)] if turns else [(prompt.strip(), None)]
    return turns


def dialogue_system(prompt):
    """The system prompt of a prompt in the text form: its text before the first turn, stripped; None where there
    is none (or the prompt has no speaker marks: then it is all one user turn)."""
    pieces = _SPEAKER.split(prompt)
    return (pieces[0].strip() or None) if len(pieces) >= 3 else None


def with_system(system, text):
    """A conversation in the text form with `system` (None: none) written before its first turn."""
    return f"{system}\n\n{text}" if system else text


def format_turns(tokenizer, turns, system=None):
    """The prompt text of a conversation: (user, assistant) pairs, the last with assistant None, after the
    `system` prompt if one is given."""
    if not turns or turns[-1][1] is not None:
        raise ValueError("the last turn must be the user's, with assistant None")
    if any(assistant is None for _, assistant in turns[:-1]):
        raise ValueError("only the last turn may be without an assistant answer")
    if has_chat_template(tokenizer):
        messages = [{"role": "system", "content": system}] if system else []
        for user, assistant in turns:
            messages.append({"role": "user", "content": user})
            if assistant is not None:
                messages.append({"role": "assistant", "content": assistant})
        return _templated(tokenizer, messages)
    return with_system(system, dialogue_text(turns))


class TemplatePrompt(str):
    """A chat template's prompt that holds a special token's text in the conversation's own words: `spans` are
    where those words are, so that encode_prompt_text tokenizes them as text and only the template's own marks as
    special tokens (a user turn's `<|im_end|><|im_start|>assistant` would otherwise be a turn of its own)."""
    spans: tuple[tuple[int, int], ...] = ()


_SLOT = "\ue000{}\ue001"
"""A placeholder for the i-th content while the template is rendered (private-use characters no text holds)."""


def _templated(tokenizer, messages):
    """The template's prompt of `messages`, ending with the generation prompt; a TemplatePrompt where a message's
    content holds a special token's text and the template writes the contents as they are. Where the template
    refuses a system message (Gemma's and Mistral's raise on one), the system prompt opens the first user turn
    instead; a template that fails even so is a ConfigError naming the model."""
    def render(contents):
        return tokenizer.apply_chat_template([{**message, "content": content}
                                              for message, content in zip(messages, contents)],
                                             tokenize=False, add_generation_prompt=True)

    try:
        text = render([message["content"] for message in messages])
    except Exception as err:  # jinja2's TemplateError, a template's raise_exception: whatever the template raises
        if messages[0]["role"] != "system" or len(messages) < 2:
            raise _template_error(tokenizer, messages, err) from None
        messages = [{"role": "user", "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"},
                    *messages[2:]]
        try:
            text = render([message["content"] for message in messages])
        except Exception as again:
            raise _template_error(tokenizer, messages, again) from None
    contents = [message["content"] for message in messages]
    specials = special_token_texts(tokenizer)
    if not any(special in content for content in contents for special in specials):
        return text
    pieces = re.split("\ue000(\\d+)\ue001", render([_SLOT.format(i) for i in range(len(contents))]))
    spans, rebuilt = [], ""
    for index, piece in enumerate(pieces):
        if index % 2:
            piece = contents[int(piece)]
            spans.append((len(rebuilt), len(rebuilt) + len(piece)))
        rebuilt += piece
    if rebuilt != text:  # the template rewrites the contents (trims them): their words cannot be told apart
        return text
    prompt = TemplatePrompt(text)
    prompt.spans = tuple(spans)
    return prompt


def _template_error(tokenizer, messages, err):
    return ConfigError(f"{tokenizer.name_or_path}: its chat template fails on a conversation of {len(messages)} "
                       f"message(s) ({type(err).__name__}: {err})")


def dialogue_text(turns):
    """(user, assistant) pairs, the last with assistant None, in DeepSpeed-Chat's text form:
    `" Human: u1 Assistant: a1 Human: u2 Assistant:"`."""
    parts = []
    for user, assistant in turns:
        parts.append(text_prompt(user))
        if assistant is not None:
            parts.append(" " + assistant)
    return "".join(parts)


def shorter_prompts(prompt):
    """The prompt with its earliest exchanges dropped, one more each time, down to its last user turn alone, in
    DeepSpeed-Chat's text form, its system prompt kept: the context a length limit gives up first (TRL's
    `keep_end`, by whole turns)."""
    turns, system = parse_dialogue(prompt), dialogue_system(prompt)
    return [with_system(system, dialogue_text(turns[first:])) for first in range(1, len(turns))]


def model_prompt(tokenizer, prompt):
    """A data-set prompt in the model's format."""
    if not has_chat_template(tokenizer):
        return prompt
    return format_turns(tokenizer, parse_dialogue(prompt), dialogue_system(prompt))


def model_answer(tokenizer, answer):
    """A data-set answer as the model should write it (no leading space after a chat template)."""
    return answer.strip() if has_chat_template(tokenizer) else answer


def special_token_texts(tokenizer):
    """The texts the tokenizer reads as special tokens (`<|im_end|>`, `</s>`, ...)."""
    texts = set(tokenizer.all_special_tokens)
    texts.update(token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values() if token.special)
    return {text for text in texts if text}


def encode_prompt_text(tokenizer, text):
    """Token ids of a prompt already in the model's format: the tokenizer's special tokens are added, except a
    second BOS when the text starts with one (a chat template that writes it). Without a chat template the prompt
    is the data's text alone, so a special token's text in it (`</s>` in HTML or code) is text, not that token;
    with one, so is such text in the conversation's own words (a TemplatePrompt's spans)."""
    if not has_chat_template(tokenizer):
        return tokenizer(text, split_special_tokens=True)["input_ids"]
    bos = tokenizer.bos_token
    add_special_tokens = not (bos and text.startswith(bos))
    spans = getattr(text, "spans", ())
    if not spans:
        return tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    ids = tokenizer("", add_special_tokens=True)["input_ids"] if add_special_tokens else []
    start = 0
    for begin, end in (*spans, (len(text), len(text))):
        for piece, as_text in ((text[start:begin], False), (text[begin:end], True)):
            if piece:
                ids += tokenizer(piece, add_special_tokens=False, split_special_tokens=as_text)["input_ids"]
        start = end
    return ids
