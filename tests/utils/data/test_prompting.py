"""DeepSpeed-Chat text prompts and chat-template models: parsing, formatting, tokenizing."""
import copy

import pytest

from utils.data.data_utils import tokenize_answer, tokenize_prompt
from utils.data.prompting import (dialogue_system, encode_prompt_text, format_turns, model_answer, model_prompt,
                                  parse_dialogue, shorter_prompts)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def chat_tokenizer(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHATML
    return tokenizer


@pytest.mark.parametrize("prompt, turns", [
    (" Human: What is 7 + 12? Assistant:", [("What is 7 + 12?", None)]),
    ("\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant:",
     [("hi", "hello"), ("how are you?", None)]),
    ("just a question", [("just a question", None)]),
    # HH-RLHF rows with an empty assistant turn in the middle: a turn answered with ""
    ("\n\nHuman: hi\n\nAssistant: Human: anyone?\n\nAssistant:", [("hi", ""), ("anyone?", None)]),
    (" Human: a Assistant: Human: b Assistant: c Human: d Assistant:", [("a", ""), ("b", "c"), ("d", None)]),
])
def test_parse_dialogue(prompt, turns):
    assert parse_dialogue(prompt) == turns


def test_text_form_round_trips_without_a_template(tiny_tokenizer):
    prompt = " Human: What is 7 + 12? Assistant:"
    assert format_turns(tiny_tokenizer, parse_dialogue(prompt)) == prompt
    assert model_prompt(tiny_tokenizer, prompt) == prompt
    assert model_answer(tiny_tokenizer, " 19") == " 19"


def test_a_chat_template_model_gets_its_own_format(chat_tokenizer):
    text = model_prompt(chat_tokenizer, " Human: What is 7 + 12? Assistant:")
    assert text == "<|im_start|>user\nWhat is 7 + 12?</s>\n<|im_start|>assistant\n"
    assert model_answer(chat_tokenizer, " 19") == "19"
    # Training tokenizes the templated prompt, then the answer without the text form's space, then EOS.
    assert tokenize_prompt(chat_tokenizer, " Human: What is 7 + 12? Assistant:") == encode_prompt_text(
        chat_tokenizer, text)
    answer_ids = tokenize_answer(chat_tokenizer, " 19")
    assert answer_ids[-1] == chat_tokenizer.eos_token_id
    assert chat_tokenizer.decode(answer_ids[:-1]) == "19"


def test_an_empty_assistant_turn_in_the_middle_is_formatted_for_a_chat_template_model(chat_tokenizer):
    """It crashed steps 1-3 and rw_eval on HH-RLHF data with SmolLM2 ("only the last turn may be without an
    assistant answer")."""
    text = model_prompt(chat_tokenizer, "\n\nHuman: hi\n\nAssistant: Human: anyone there?\n\nAssistant:")
    assert text == ("<|im_start|>user\nhi</s>\n<|im_start|>assistant\n</s>\n<|im_start|>user\nanyone there?</s>\n"
                    "<|im_start|>assistant\n")
    assert tokenize_prompt(chat_tokenizer, "\n\nHuman: hi\n\nAssistant: Human: anyone there?\n\nAssistant:")


def test_format_turns_refuses_a_finished_conversation(tiny_tokenizer):
    with pytest.raises(ValueError):
        format_turns(tiny_tokenizer, [("q", "a")])


def test_shorter_prompts_drop_the_earliest_exchanges_first():
    prompt = " Human: a Assistant: b Human: c Assistant: d Human: e Assistant:"
    assert shorter_prompts(prompt) == [" Human: c Assistant: d Human: e Assistant:", " Human: e Assistant:"]
    assert shorter_prompts(" Human: only one Assistant:") == []


def test_the_text_before_the_first_turn_is_the_system_prompt_a_chat_template_model_gets_as_such(chat_tokenizer,
                                                                                                  tiny_tokenizer):
    """Before: a row's system prompt was pasted into the first user turn, and a chat template then wrote its own
    default system prompt too (SmolLM2's), two instructions at odds; the text before a prompt's first turn (a
    data set's preamble) was dropped for such a model."""
    prompt = "Be brief.\n\n Human: hi Assistant: hello Human: 2+2? Assistant:"
    assert dialogue_system(prompt) == "Be brief." and parse_dialogue(prompt) == [("hi", "hello"), ("2+2?", None)]
    assert dialogue_system(" Human: hi Assistant:") is dialogue_system("\n\nHuman: hi\n\nAssistant:") is None
    assert dialogue_system("no marks: all of it one user turn") is None
    assert model_prompt(chat_tokenizer, prompt) == (
        "<|im_start|>system\nBe brief.</s>\n<|im_start|>user\nhi</s>\n<|im_start|>assistant\nhello</s>\n"
        "<|im_start|>user\n2+2?</s>\n<|im_start|>assistant\n")
    assert model_prompt(tiny_tokenizer, prompt) == prompt  # no template: the text form as it is
    assert format_turns(tiny_tokenizer, parse_dialogue(prompt), dialogue_system(prompt)) == prompt
    # A length limit gives up the earliest exchanges, never the system prompt.
    assert shorter_prompts(prompt) == ["Be brief.\n\n Human: 2+2? Assistant:"]


def test_a_special_tokens_text_in_the_data_is_text_not_that_token(tiny_tokenizer):
    """Before: an answer ' use <s>old</s> new' trained a BOS and an EOS mid-answer (SFT taught the model to stop
    there). Training and the evaluation tokenize a prompt alike."""
    from inference.generation import tokenize_prompts

    tok = tiny_tokenizer
    answer = tokenize_answer(tok, " use <s>old</s> new")
    assert answer.count(tok.eos_token_id) == 1 and answer[-1] == tok.eos_token_id and tok.bos_token_id not in answer
    assert tok.decode(answer[:-1]) == " use <s>old</s> new"
    prompt = " Human: what does </s> mean in HTML? Assistant:"
    ids = tokenize_prompt(tok, prompt)
    assert tok.eos_token_id not in ids and ids == tokenize_prompts(tok, [prompt])[0]
    assert tokenize_prompt(tok, " Human: hi Assistant:") == tok(" Human: hi Assistant:")["input_ids"]  # as before


def test_a_special_tokens_text_in_a_chat_turn_is_text_and_the_templates_marks_stay_tokens(chat_tokenizer):
    """Before: a user turn holding the template's end-of-turn text (here `</s>`) was tokenized as that token, so
    the words could close the turn and open one of the assistant's."""
    from inference.generation import tokenize_prompts

    tok = chat_tokenizer
    prompt = " Human: what does </s> mean? Assistant: a strike. Human: and <s>? Assistant:"
    text = model_prompt(tok, prompt)
    assert text == ("<|im_start|>user\nwhat does </s> mean?</s>\n<|im_start|>assistant\na strike.</s>\n"
                    "<|im_start|>user\nand <s>?</s>\n<|im_start|>assistant\n")
    ids = tokenize_prompt(tok, prompt)
    assert ids == tokenize_prompts(tok, [text])[0]
    assert ids.count(tok.eos_token_id) == 3 and tok.bos_token_id not in ids[1:]  # the template's three turn ends
    assert tok.decode(ids, skip_special_tokens=False).replace(" ", "") == (tok.decode(
        tok(text)["input_ids"], skip_special_tokens=False).replace(" ", ""))
    plain = " Human: what does it mean? Assistant:"  # no special token's text: tokenized as before
    assert tokenize_prompt(tok, plain) == tok(model_prompt(tok, plain))["input_ids"]
    assert type(model_prompt(tok, plain)) is str


def test_a_template_that_refuses_a_system_message_gets_it_in_the_first_user_turn(chat_tokenizer):
    """Gemma's and Mistral's templates raise on a system message: the system prompt then opens the first turn."""
    tok = chat_tokenizer
    tok.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                         "{% endif %}" + CHATML)
    assert model_prompt(tok, "Be brief.\n\n Human: 2+2? Assistant:") == (
        "<|im_start|>user\nBe brief.\n\n2+2?</s>\n<|im_start|>assistant\n")


def test_a_template_that_fails_is_one_error_naming_the_model(chat_tokenizer):
    from utils.runtime.errors import ConfigError

    chat_tokenizer.chat_template = "{{ raise_exception('boom') }}"
    with pytest.raises(ConfigError, match=r"its chat template fails on a conversation of 1 message\(s\) "
                                          r"\(TemplateError: boom\)"):
        tokenize_prompt(chat_tokenizer, " Human: hi Assistant:")
    chat_tokenizer.chat_template = "{{ messages[0]['content'] | no_such_filter }}"
    with pytest.raises(ConfigError, match="its chat template fails"):
        model_prompt(chat_tokenizer, " Human: hi Assistant:")
