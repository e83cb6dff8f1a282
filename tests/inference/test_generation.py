"""Tests of inference/generation.py on the real built-in tiny model (untrained: the mechanics, not the answers)."""
import copy
import json

import pytest
import torch

from inference.generation import generate, load_causal_lm, max_prompt_tokens, tokenize_prompts
from inference.sampling import sample
from utils.data import builtin_task as task
from utils.data.prompting import format_turns
from utils.model.model_utils import REWARD_MODEL_KEY, load_tokenizer, resolve_model_path
from utils.runtime.errors import ChatRLHFError, ConfigError

PROMPTS = [
    task.format_prompt("What is 7 + 12?"),
    task.format_prompt('Reverse the word "cat".'),
    task.format_prompt("Which city is the capital of France? Please answer in one word, with no other text."),
    task.format_prompt('Say "apple" in uppercase.'),
    " Human: hi Assistant:",
]


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------
# format_turns (utils/data/prompting.py), as the chat and generation use it
# ---------------------------------------------------------------------------------------------------------


def test_format_prompt_without_chat_template_is_deepspeed_chat_format(tiny):
    _, tokenizer = tiny
    assert not tokenizer.chat_template
    assert format_turns(tokenizer, [("What is 7 + 12?", None)]) == task.format_prompt("What is 7 + 12?")
    assert format_turns(tokenizer, [("What is 7 + 12?", None)]) == " Human: What is 7 + 12? Assistant:"
    turns = [("q1", "a1"), ("q2", "a2"), ("q3", None)]
    assert format_turns(tokenizer, turns) == " Human: q1 Assistant: a1 Human: q2 Assistant: a2 Human: q3 Assistant:"


def test_format_prompt_with_chat_template_uses_it():
    tokenizer = load_tokenizer(resolve_model_path("tiny"))
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    expected = "<|user|>q1\n<|assistant|>a1\n<|user|>q2\n<|assistant|>"
    assert format_turns(tokenizer, [("q1", "a1"), ("q2", None)]) == expected


def test_format_prompt_needs_the_last_turn_unanswered(tiny):
    _, tokenizer = tiny
    with pytest.raises(ValueError):
        format_turns(tokenizer, [("q1", "a1")])
    with pytest.raises(ValueError):
        format_turns(tokenizer, [("q1", None), ("q2", None)])


# ---------------------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------------------


def test_batched_left_padded_greedy_equals_unbatched_greedy(tiny):
    model, tokenizer = tiny
    lengths = [len(ids) for ids in tokenize_prompts(tokenizer, PROMPTS)]
    assert len(set(lengths)) >= 3  # the batch really is padded
    batched = generate(model, tokenizer, PROMPTS, max_new_tokens=10, greedy=True, batch_size=len(PROMPTS))
    one_by_one = [generate(model, tokenizer, [prompt], max_new_tokens=10, greedy=True)[0] for prompt in PROMPTS]
    assert batched == one_by_one
    assert all(isinstance(answer, str) for answer in batched)
    # a batch size that splits the prompts gives the same answers, in the prompts' order
    assert generate(model, tokenizer, PROMPTS, max_new_tokens=10, greedy=True, batch_size=2) == batched


def test_answers_come_from_step_3s_sampler_and_greedy_ones_equal_hf_generates(tiny, monkeypatch):
    import inference.generation as generation
    from utils.data.data_utils import attention_mask_left, pad_left

    model, tokenizer = tiny
    calls = []
    monkeypatch.setattr(generation, "sample", lambda *args, **kwargs: calls.append(kwargs) or sample(*args, **kwargs))
    ours = generate(model, tokenizer, PROMPTS, max_new_tokens=10, greedy=True, batch_size=len(PROMPTS))
    assert len(calls) == 1 and calls[0]["greedy"]
    generate(model, tokenizer, PROMPTS, max_new_tokens=10, temperature=0.7, top_p=0.9, seed=1)
    assert not calls[1]["greedy"] and (calls[1]["temperature"], calls[1]["top_p"]) == (0.7, 0.9)
    rows = tokenize_prompts(tokenizer, PROMPTS)
    input_ids = pad_left(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        hf = model.generate(input_ids=input_ids, attention_mask=attention_mask_left(rows), max_new_tokens=10,
                            do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    expected = [tokenizer.decode(_cut(row.tolist(), tokenizer.eos_token_id), skip_special_tokens=True)
                for row in hf[:, input_ids.shape[1]:]]
    assert ours == expected


def _cut(tokens, eos_token_id):
    return tokens[:tokens.index(eos_token_id)] if eos_token_id in tokens else tokens


def test_sampling_is_reproducible_with_a_seed_and_leaves_the_global_rng_alone(tiny):
    model, tokenizer = tiny
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = generate(model, tokenizer, PROMPTS, max_new_tokens=12, temperature=1.0, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    assert generate(model, tokenizer, PROMPTS, max_new_tokens=12, temperature=1.0, seed=7) == first
    assert generate(model, tokenizer, PROMPTS, max_new_tokens=12, temperature=1.0, seed=8) != first
    assert generate(model, tokenizer, PROMPTS, max_new_tokens=12, greedy=True) != first


def test_answers_stop_at_eos_including_the_models_own_eos_ids(tiny, monkeypatch):
    model, tokenizer = tiny
    assert generate(model, tokenizer, PROMPTS[:1], max_new_tokens=6, greedy=True)[0]
    # the greedy first answer token, read from the logits (re-encoding the decoded answer could give another id:
    # a byte-level token that is part of a character decodes to U+FFFD)
    with torch.no_grad():
        prompt_ids = torch.tensor(tokenize_prompts(tokenizer, PROMPTS[:1]))
        first_token = int(model(input_ids=prompt_ids).logits[0, -1].argmax())
    assert first_token != tokenizer.eos_token_id
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = [tokenizer.eos_token_id, first_token]  # the model "ends its turn" at once
    monkeypatch.setattr(model, "generation_config", config)
    assert generate(model, tokenizer, PROMPTS[:1], max_new_tokens=6, greedy=True) == [""]


def test_the_models_generation_config_does_not_change_decoding(tiny, monkeypatch):
    model, tokenizer = tiny
    greedy = generate(model, tokenizer, PROMPTS, max_new_tokens=10, greedy=True)
    sampled = generate(model, tokenizer, PROMPTS, max_new_tokens=10, seed=3)
    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=True, top_k=1, temperature=0.01, repetition_penalty=5.0, no_repeat_ngram_size=1)
    monkeypatch.setattr(model, "generation_config", config)
    assert generate(model, tokenizer, PROMPTS, max_new_tokens=10, greedy=True) == greedy
    assert generate(model, tokenizer, PROMPTS, max_new_tokens=10, seed=3) == sampled


def test_empty_and_too_long_prompts_are_refused(tiny):
    model, tokenizer = tiny
    with pytest.raises(ChatRLHFError, match="prompt 1 is empty"):
        generate(model, tokenizer, [PROMPTS[0], "  "], max_new_tokens=4)
    limit = max_prompt_tokens(model, 64)
    assert limit == model.config.max_position_embeddings - 64
    too_long = task.format_prompt("What is 1 + 1? " * limit)
    with pytest.raises(ChatRLHFError, match="the prompt is too long"):
        generate(model, tokenizer, [too_long], max_new_tokens=64)
    with pytest.raises(ConfigError, match="leaves no room"):
        generate(model, tokenizer, PROMPTS[:1], max_new_tokens=model.config.max_position_embeddings)
    with pytest.raises(ConfigError, match="temperature"):
        generate(model, tokenizer, PROMPTS[:1], temperature=0.0)
    assert generate(model, tokenizer, [], max_new_tokens=4) == []


def test_load_causal_lm_refuses_a_reward_model_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", REWARD_MODEL_KEY: True}))
    with pytest.raises(ConfigError, match="is a reward model"):
        load_causal_lm(str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        load_causal_lm(str(tmp_path / "missing"))


def test_load_causal_lm_pads_left_in_eval_mode(tiny):
    model, tokenizer = tiny
    assert tokenizer.padding_side == "left"
    assert not model.training
