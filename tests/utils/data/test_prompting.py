"""DeepSpeed-Chat text prompts and chat-template models: parsing, formatting, tokenizing."""
import copy

import pytest

from utils.data.data_utils import tokenize_answer, tokenize_prompt
from utils.data.prompting import encode_prompt_text, format_turns, model_answer, model_prompt, parse_dialogue

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


def test_format_turns_refuses_a_finished_conversation(tiny_tokenizer):
    with pytest.raises(ValueError):
        format_turns(tiny_tokenizer, [("q", "a")])
