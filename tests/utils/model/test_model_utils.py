"""Tests of utils/model/model_utils.py: resolving --model_name_or_path, loading tokenizers and models, the reward-model
guard, embedding resize, the length flags against the model's context and parameter counting."""
import json
import socket

import pytest
import torch
import transformers
from transformers import AutoModel, AutoModelForCausalLM

from utils.model.model_utils import (ADDED_TOKENS_ROOM, REWARD_MODEL_KEY, check_fits_context, configure_dropout,
                                     context_entry, count_parameters, create_hf_model, load_tokenizer,
                                     position_ids_from_mask, resolve_model_path)
from utils.model.tiny import train_tokenizer
from utils.runtime.errors import ConfigError

TEXTS = [" Human: What is 1 + 2? Assistant: 3", " Human: Reverse the word \"abc\". Assistant: cba"] * 20


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to reach the hub fails the test loudly."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected hub lookup {args}")
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, small_config, tiny_tokenizer):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model")
    AutoModelForCausalLM.from_config(small_config("llama", vocab_size=len(tiny_tokenizer))).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


# --------------------------------------------------------------------------- resolve_model_path


def test_resolve_an_existing_folder(model_dir, no_hub):
    assert resolve_model_path(str(model_dir)) == str(model_dir)


def test_resolve_an_empty_path_is_no_working_folder(no_hub):
    with pytest.raises(ConfigError, match="the model path is empty"):  # Path("") is the working folder
        resolve_model_path("")


def test_resolve_a_folder_without_config(tmp_path, no_hub):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model_path(str(tmp_path))


@pytest.mark.parametrize("path", ["./nope", "/nope", "~/surely-not-a-model-folder", "../nope/model",
                                  "some/deep/path"])
def test_resolve_a_missing_path_never_reaches_the_network(path, no_hub, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected connection {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model_path(path)


def test_resolve_an_unreachable_hub_name(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("offline")
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", offline)
    with pytest.raises(ConfigError, match="someone/some-model.*tiny"):
        resolve_model_path("someone/some-model")


# --------------------------------------------------------------------------- tokenizers


def save_tokenizer_without(tmp_path, *missing):
    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    for name in missing:
        setattr(tokenizer, name, None)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_load_tokenizer_uses_eos_as_pad_when_missing(tmp_path):
    path = save_tokenizer_without(tmp_path, "pad_token")
    tokenizer = load_tokenizer(str(path), padding_side="left")
    assert tokenizer.eos_token_id is not None
    assert tokenizer.pad_token == tokenizer.eos_token and tokenizer.pad_token_id == tokenizer.eos_token_id
    assert tokenizer.padding_side == "left"


def test_load_tokenizer_keeps_its_own_pad(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.padding_side == "right"


def test_load_tokenizer_without_eos_is_refused(tmp_path):
    path = save_tokenizer_without(tmp_path, "eos_token")
    with pytest.raises(ConfigError, match="no eos token"):
        load_tokenizer(str(path))


# --------------------------------------------------------------------------- models


def test_create_hf_model_loads_a_causal_lm(model_dir, tiny_tokenizer):
    model = create_hf_model(AutoModelForCausalLM, str(model_dir), tiny_tokenizer, dropout=0.25)
    assert model.config.end_token_id == tiny_tokenizer.eos_token_id
    assert model.config.pad_token_id == tiny_tokenizer.pad_token_id
    assert model.config.attention_dropout == 0.25
    assert model.get_input_embeddings().num_embeddings == len(tiny_tokenizer)  # fits: not resized
    assert next(model.parameters()).dtype == torch.float32


def test_a_bf16_folder_loads_in_fp32(tmp_path, small_config, tiny_tokenizer):
    """A step trained with --dtype bf16 saves bf16 weights; the next step (and a reward model's fp32 value head)
    must still get fp32, not transformers 5's default of the folder's own dtype."""
    config = small_config("llama", vocab_size=len(tiny_tokenizer))
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(tmp_path)
    for model_class in (AutoModelForCausalLM, AutoModel):
        model = create_hf_model(model_class, str(tmp_path), tiny_tokenizer)
        assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_create_hf_model_grows_embeddings_to_fit_the_tokenizer(tmp_path, small_config, tiny_tokenizer):
    """A few tokens past the embeddings (a pad token, special ones) get rows (DeepSpeed-Chat's resize); a tokenizer
    far larger than them is another model's, refused rather than trained on rows that start random."""
    near, far = tmp_path / "near", tmp_path / "far"
    vocab = len(tiny_tokenizer) - ADDED_TOKENS_ROOM
    AutoModelForCausalLM.from_config(small_config("llama", vocab_size=vocab)).save_pretrained(near)
    model = create_hf_model(AutoModelForCausalLM, str(near), tiny_tokenizer)
    rows = model.get_input_embeddings().num_embeddings
    assert rows >= len(tiny_tokenizer) and rows % 8 == 0 and rows - len(tiny_tokenizer) < 8
    AutoModelForCausalLM.from_config(small_config("llama", vocab_size=vocab - 1)).save_pretrained(far)
    with pytest.raises(ConfigError, match=f"its tokenizer has {len(tiny_tokenizer)} tokens but the model's "
                                          f"embeddings {vocab - 1} rows"):
        create_hf_model(AutoModelForCausalLM, str(far), tiny_tokenizer)


def test_a_reward_model_folder_is_refused_as_a_causal_lm(model_dir, tmp_path, tiny_tokenizer):
    import shutil

    folder = tmp_path / "critic"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config[REWARD_MODEL_KEY] = {"num_padding_at_beginning": 0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="reward model"):
        create_hf_model(AutoModelForCausalLM, str(folder), tiny_tokenizer)
    assert create_hf_model(AutoModel, str(folder), tiny_tokenizer) is not None  # as a backbone it loads


FITS_CONTEXT = [
    # (the length flags, what the error says after them; None: they fit the 512 positions)
    ({"--max_seq_len": 512}, None),
    ({"--max_seq_len": 513}, "--max_seq_len 513 is over the model's context (512 positions, max_position_embeddings "
                             "in {folder}/config.json)"),
    ({"--max_seq_len": "auto"}, None),
    ({"--max_prompt_seq_len": 256, "--max_answer_seq_len": 256}, None),
    ({"--max_prompt_seq_len": 256, "--max_answer_seq_len": 300}, "--max_prompt_seq_len 256 + --max_answer_seq_len "
                                                                  "300 = 556 is over the model's context"),
    ({"--max_prompt_seq_len": 511, "--max_answer_seq_len": "auto"}, None),
    ({"--max_prompt_seq_len": 512, "--max_answer_seq_len": "auto"}, "--max_prompt_seq_len 512 leaves no room for "
                                                                    "--max_answer_seq_len auto in the model's context"),
    ({"--max_prompt_seq_len": "auto", "--max_answer_seq_len": 600}, "--max_answer_seq_len 600 is over the model's "
                                                                    "context"),
]


@pytest.mark.parametrize("lengths, message", FITS_CONTEXT, ids=[json.dumps(row[0]) for row in FITS_CONTEXT])
def test_length_flags_are_checked_against_the_model_s_context(tmp_path, lengths, message):
    """Positions past a model's context train on positions it never learned, or (learned position embeddings: OPT)
    fail mid-run with an index error; refused before the data is read."""
    folder = tmp_path / "model"
    transformers.LlamaConfig(max_position_embeddings=512).save_pretrained(folder)
    if message is None:
        check_fits_context(str(folder), lengths)
        return
    with pytest.raises(ConfigError) as raised:
        check_fits_context(str(folder), lengths)
    assert str(raised.value).startswith(message.format(folder=folder)), raised.value


def test_a_model_of_no_stated_context_bounds_no_length(tmp_path, small_config):
    """A config stating none of CONTEXT_KEYS (Mamba's: no positions at all) keeps working at any length; OPT's and
    GPT-2's are read under their own names."""
    folder = tmp_path / "mamba"
    transformers.MambaConfig().save_pretrained(folder)
    check_fits_context(str(folder), {"--max_seq_len": 10 ** 6})
    assert context_entry(transformers.MambaConfig()) is None
    assert context_entry(small_config("opt")) == ("max_position_embeddings", 64)
    assert context_entry(transformers.GPT2Config(n_positions=32)) == ("n_positions", 32)


def test_configure_dropout(small_config):
    config = small_config("opt")
    config.attention_dropout = 0.3
    config = configure_dropout(config, 0.0)
    assert (config.dropout, config.attention_dropout) == (0.0, 0.0)
    untouched = small_config("opt")
    assert configure_dropout(untouched, None).dropout == small_config("opt").dropout != 0.0


def test_count_parameters(small_config):
    model = AutoModelForCausalLM.from_config(small_config("opt"))
    assert count_parameters(model) == sum(p.numel() for p in model.parameters())


def test_position_ids_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]


@pytest.mark.parametrize("kind", ["llama", "opt"])
def test_last_logits_kwargs_give_the_last_positions_logits_of_a_full_forward(small_config, kind):
    from transformers import AutoModelForCausalLM

    from utils.model.model_utils import last_logits_kwargs, model_forward_kwargs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(small_config(kind)).eval()
    input_ids = torch.randint(1, 64, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0  # left padding
    kwargs = model_forward_kwargs(model, attention_mask)
    with torch.no_grad():
        full = model(input_ids=input_ids, **kwargs).logits
        last = model(input_ids=input_ids, **kwargs, **last_logits_kwargs(model, 4)).logits
    assert last.shape[1] == (4 if "logits_to_keep" in last_logits_kwargs(model, 4) else 9)
    assert kind != "llama" or last.shape[1] == 4
    torch.testing.assert_close(last[:, -4:], full[:, -4:])


def test_a_chat_template_that_never_ends_is_one_error_naming_the_folder(tmp_path, tiny_tokenizer, monkeypatch):
    """Jinja's sandbox bounds one range to 100,000 steps, not two nested: chat.py hung on such a template (and so
    would the data and the evaluation)."""
    import time

    from utils.model import model_utils

    monkeypatch.setattr(model_utils, "TEMPLATE_SECONDS", 1)
    folder = tmp_path / "looping"
    tiny_tokenizer.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"model folder {folder}: its chat template took over 1 s to write a "
                                          "two-turn conversation"):
        model_utils.load_tokenizer(str(folder))
    assert time.monotonic() - start < 30
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # a template that ends: kept
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert model_utils.load_tokenizer(str(folder)).chat_template == config["chat_template"]
