"""Tests of utils/data/pair_formats.py: each shape of preference row read into the text form, worked out by hand,
and the rows it refuses, each with one message naming the row and field."""
import json

import pytest

from utils.data import raw_datasets as rd
from utils.data.pair_formats import UNUSABLE, read_pair, unusable_row
from utils.data.prompting import parse_dialogue
from utils.runtime.errors import DataError

WHERE = "data.json: row 3"


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def test_the_text_form_is_kept_verbatim():
    row = {"prompt": " Human: 7 + 12? Assistant:", "chosen": " 19", "rejected": " 21", "extra": 1}
    assert read_pair(row, WHERE) == {"prompt": " Human: 7 + 12? Assistant:", "chosen": " 19", "rejected": " 21"}


def test_whole_dialogues_split_at_the_last_shared_assistant_mark():
    """HH-RLHF: two turns, the answers differing in the second assistant turn only."""
    chosen = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Capital of France?\n\nAssistant: Paris."
    rejected = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Capital of France?\n\nAssistant: I don't know."
    pair = read_pair({"chosen": chosen, "rejected": rejected}, WHERE)
    assert pair == {"prompt": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Capital of France?\n\nAssistant:",
                    "chosen": " Paris.", "rejected": " I don't know."}
    assert parse_dialogue(pair["prompt"]) == [("Hi", "Hello!"), ("Capital of France?", None)]


def test_whole_dialogues_whose_answers_share_a_start_still_cut_at_the_assistant_mark():
    pair = read_pair({"chosen": "Human: 2+2? Assistant: 4, surely", "rejected": "Human: 2+2? Assistant: 4, maybe"},
                     WHERE)
    assert pair == {"prompt": "Human: 2+2? Assistant:", "chosen": " 4, surely", "rejected": " 4, maybe"}


def test_a_dialogue_whose_final_answer_is_empty_has_no_answer_on_that_side():
    """HH-RLHF has rows whose last assistant turn is empty: that answer is None (a step that needs it skips the
    row and counts it), the prompt and the other answer are kept."""
    assert read_pair({"chosen": "Human: a Assistant: b", "rejected": "Human: a Assistant:  "}, WHERE) == \
        {"prompt": "Human: a Assistant:", "chosen": " b", "rejected": None}
    assert read_pair({"chosen": "Human: a Assistant:", "rejected": "Human: a Assistant: c"}, WHERE) == \
        {"prompt": "Human: a Assistant:", "chosen": None, "rejected": " c"}


def test_messages_with_the_prompt_as_messages_and_the_answers_alone():
    """TRL's conversational preference form."""
    row = {"prompt": [{"role": "system", "content": "Be brief."}, user("Hi"), assistant("Hello."), user("2+2?")],
           "chosen": [assistant("4")], "rejected": [assistant("5")]}
    assert read_pair(row, WHERE) == {"prompt": "Be brief.\n\n Human: Hi Assistant: Hello. Human: 2+2? Assistant:",
                                     "chosen": " 4", "rejected": " 5"}


def test_messages_as_whole_conversations_with_a_prompt_string():
    """UltraFeedback binarized: `prompt` is the user's text, chosen and rejected the whole conversations."""
    row = {"prompt": "Name a colour.", "chosen": [user("Name a colour."), assistant(" Blue. ")],
           "rejected": [user("Name a colour."), assistant("Seven.")], "score_chosen": 8.0}
    assert read_pair(row, WHERE) == {"prompt": " Human: Name a colour. Assistant:", "chosen": " Blue.",
                                     "rejected": " Seven."}


def test_messages_as_whole_conversations_without_a_prompt_and_with_the_prompt_messages_repeated():
    chosen, rejected = [user("a"), assistant("b"), user("c"), assistant("d")], [user("a"), assistant("b"),
                                                                              user("c"), assistant("e")]
    expected = {"prompt": " Human: a Assistant: b Human: c Assistant:", "chosen": " d", "rejected": " e"}
    assert read_pair({"chosen": chosen, "rejected": rejected}, WHERE) == expected
    assert read_pair({"prompt": chosen[:3], "chosen": chosen, "rejected": rejected}, WHERE) == expected


def test_a_prompt_string_with_answer_messages():
    row = {"prompt": "Say hi.", "chosen": [assistant("hi")], "rejected": [assistant("no")]}
    assert read_pair(row, WHERE) == {"prompt": " Human: Say hi. Assistant:", "chosen": " hi", "rejected": " no"}


@pytest.mark.parametrize("row, message", [
    ({"prompt": "p", "rejected": "r"}, "missing field 'chosen'"),
    ({"chosen": "Human: a Assistant: b", "rejected": "Human: x Assistant: y"},
     "missing field 'prompt', and 'chosen' and 'rejected' share no dialogue up to an 'Assistant:'"),
    ({"prompt": "p", "chosen": [assistant("a")], "rejected": "r"}, "field 'rejected' must be a non-empty list"),
    ({"prompt": "p", "chosen": [], "rejected": [assistant("r")]}, "field 'chosen' must be a non-empty list"),
    ({"prompt": "p", "chosen": [{"role": "bot", "content": "a"}], "rejected": [assistant("r")]},
     "field 'chosen', message 0: expected"),
    ({"prompt": "p", "chosen": [{"role": "assistant", "content": ["a"]}], "rejected": [assistant("r")]},
     "field 'chosen', message 0: expected"),
    ({"chosen": [assistant("a")], "rejected": [assistant("r")]}, "missing field 'prompt' ('chosen' and 'rejected'"),
    ({"prompt": 3, "chosen": [assistant("a")], "rejected": [assistant("r")]},
     "field 'prompt' must be a non-empty string or a list of messages, got int"),
    ({"prompt": "", "chosen": [assistant("a")], "rejected": [assistant("r")]},
     "field 'prompt' must be a non-empty string or a list of messages, got an empty string"),
    ({"prompt": [user("q")], "chosen": [assistant("a"), user("more")], "rejected": [assistant("r")]},
     "field 'chosen' must end in one assistant message after the prompt, got ['assistant', 'user']"),
    ({"prompt": [user("q"), assistant("a")], "chosen": [assistant("b")], "rejected": [assistant("c")]},
     "field 'prompt' must end with a non-empty user message"),
    ({"prompt": [assistant("a"), user("q")], "chosen": [assistant("b")], "rejected": [assistant("c")]},
     "field 'prompt': an assistant message comes before any user message"),
])
def test_bad_rows_name_the_row_and_field(row, message):
    with pytest.raises(DataError) as err:
        read_pair(row, WHERE)
    assert str(err.value).startswith(WHERE + ": ") and message in str(err.value) and "\n" not in str(err.value)


def test_a_local_file_may_mix_the_shapes_and_reads_as_the_text_form(tmp_path):
    rows = [{"prompt": " Human: a Assistant:", "chosen": " b", "rejected": " c"},
            {"chosen": "\n\nHuman: d\n\nAssistant: e", "rejected": "\n\nHuman: d\n\nAssistant: f"},
            {"prompt": [user("g")], "chosen": [assistant("h")], "rejected": [assistant("i")]}]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read = rd.read_local_split(path).to_list()
    assert [{field: row[field] for field in ("prompt", "chosen", "rejected")} for row in read] == [
        {"prompt": " Human: a Assistant:", "chosen": " b", "rejected": " c"},
        {"prompt": "\n\nHuman: d\n\nAssistant:", "chosen": " e", "rejected": " f"},
        {"prompt": " Human: g Assistant:", "chosen": " h", "rejected": " i"}]
    # the prompt of messages is kept as written too, for a reward function in TRL's form
    assert [rd.row_columns(row)["prompt"] for row in read] == [row["prompt"] for row in read[:2]] + [[user("g")]]


def test_a_parquet_file_of_message_rows_reads_like_json(tmp_path):
    """The form hub data sets are stored in: lists of messages come back from Parquet as lists of dicts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": f"q{i}", "chosen": [user(f"q{i}"), assistant(f"a{i}")],
             "rejected": [user(f"q{i}"), assistant(f"b{i}")]} for i in range(10)]
    path = tmp_path / "prefs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    data = rd.LocalJsonFile(path, seed=0)
    pairs = data.get_train_data().to_list() + data.get_eval_data().to_list()
    assert len(data.get_eval_data()) == 1
    assert sorted(pair["prompt"] for pair in pairs) == sorted(f" Human: q{i} Assistant:" for i in range(10))
    number = {pair["prompt"]: pair["prompt"].split()[1][1:] for pair in pairs}  # " Human: q7 Assistant:" -> "7"
    assert all((pair["chosen"], pair["rejected"]) == (" a" + number[pair["prompt"]], " b" + number[pair["prompt"]])
               for pair in pairs)


def test_a_damaged_parquet_file_is_one_error_naming_it(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=r"train\.parquet: not a readable Parquet file") as err:
        rd.read_local_split(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("row, expected", [
    ({"prompt": "Solve 2+2.", "id": 7}, {"prompt": "Solve 2+2.", "chosen": None, "rejected": None}),
    ({"prompt": [user("Solve 2+2.")]}, {"prompt": " Human: Solve 2+2. Assistant:", "chosen": None, "rejected": None}),
    ({"prompt": " Human: 2+2? Assistant:", "completion": " 4"},
     {"prompt": " Human: 2+2? Assistant:", "chosen": " 4", "rejected": None}),
    ({"prompt": [user("2+2?")], "chosen": [assistant("4")]},
     {"prompt": " Human: 2+2? Assistant:", "chosen": " 4", "rejected": None}),
    ({"prompt": "2+2?", "chosen": [user("2+2?"), assistant("4")]},
     {"prompt": " Human: 2+2? Assistant:", "chosen": " 4", "rejected": None}),
    ({"messages": [{"role": "system", "content": "Be brief."}, user("2+2?"), assistant("4")]},
     {"prompt": "Be brief.\n\n Human: 2+2? Assistant:", "chosen": " 4", "rejected": None}),
    # A chat that ends with the user's turn is a prompt, as a ShareGPT chat's is (before: an error ending the file).
    ({"messages": [user("2+2?"), assistant("4"), user("And 3+3?")]},
     {"prompt": " Human: 2+2? Assistant: 4 Human: And 3+3? Assistant:", "chosen": None, "rejected": None}),
])
def test_prompts_alone_or_with_one_answer(row, expected):
    """RL prompts (OpenRLHF's prompt data, a verifier's questions) and SFT rows (TRL's prompt-completion form)."""
    assert read_pair(row, WHERE) == expected


@pytest.mark.parametrize("row, message", [
    ({"chosen": "c"}, "missing field 'prompt' (a row needs a prompt, or 'chosen' and 'rejected')"),
    ({"prompt": "  "}, "field 'prompt' must be a non-empty string or a list of messages, got an empty string"),
    ({"prompt": {"text": "q"}}, "field 'prompt' must be a non-empty string or a list of messages, got dict"),
    ({"messages": [assistant("4")]}, "field 'messages' holds an assistant message alone: no prompt before it"),
    ({"messages": "2+2? 4"}, "field 'messages' must be a non-empty list of messages"),
])
def test_bad_unpaired_rows_name_the_row_and_field(row, message):
    with pytest.raises(DataError) as err:
        read_pair(row, WHERE)
    assert str(err.value) == f"{WHERE}: {message}"


def test_prompt_only_rows_feed_step_3_and_step_1_skips_them(tmp_path, tiny_tokenizer, capsys):
    from utils.data.data_utils import create_prompt_dataset

    rows = [{"prompt": f" Human: What is {i} + 1? Assistant:"} for i in range(20)]
    rows += [{"prompt": f" Human: What is {i} + 2? Assistant:", "completion": f" {i + 2}"} for i in range(20)]
    for split in ("train", "eval"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    prompts, _ = create_prompt_dataset([str(tmp_path)], "1,1,1", str(tmp_path / "cache"), 3, 1, tiny_tokenizer, 64)
    sft, _ = create_prompt_dataset([str(tmp_path)], "1,1,1", str(tmp_path / "cache"), 1, 1, tiny_tokenizer, 64)
    assert len(prompts) == 13 and 0 < len(sft) < 13  # a third of 40 rows; step 1 keeps those with an answer
    assert "no answer" in capsys.readouterr().out


@pytest.mark.parametrize("row, expected", [
    ({"prompt": " Human: 7 + 12? Assistant:", "completion": " 19", "label": True},
     {"prompt": " Human: 7 + 12? Assistant:", "chosen": " 19", "rejected": None}),
    ({"prompt": " Human: 7 + 12? Assistant:", "completion": " 21", "label": False},
     {"prompt": " Human: 7 + 12? Assistant:", "chosen": None, "rejected": " 21"}),
    ({"prompt": [user("7 + 12?")], "completion": [assistant("21")], "label": False},  # TRL's conversational form
     {"prompt": " Human: 7 + 12? Assistant:", "chosen": None, "rejected": " 21"}),
])
def test_labelled_completions_are_a_desirable_chosen_or_an_undesirable_rejected(row, expected):
    assert read_pair(row, WHERE) == expected


@pytest.mark.parametrize("good, bad", [(1, 0), ("True", "False"), (" true", "false "), ("1", "0")])
def test_a_label_written_as_a_number_or_as_csv_text_reads_as_the_bool(good, bad):
    """Before: only a bool, so a KTO .csv file (whose cells are text) could never load."""
    for label, expected in ((good, {"chosen": " 19", "rejected": None}), (bad, {"chosen": None, "rejected": " 19"})):
        row = {"prompt": " Human: 7 + 12? Assistant:", "completion": " 19", "label": label}
        assert read_pair(row, WHERE) == {"prompt": " Human: 7 + 12? Assistant:", **expected}


@pytest.mark.parametrize("row, expected", [
    # OpenAI's content parts and developer role (current exports; TRL's vision-free chats)
    ({"messages": [{"role": "developer", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
                   {"role": "assistant", "content": [{"type": "output_text", "text": "4"}]}]},
     {"prompt": "Be brief.\n\n Human: 2+2? Assistant:", "chosen": " 4", "rejected": None}),
    # ShareGPT dumps: a split answer's consecutive turns are one
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
                        {"from": "gpt", "value": "there"}, {"from": "human", "value": "bye"},
                        {"from": "gpt", "value": "ciao"}]},
     {"prompt": " Human: hi Assistant: hello\n\nthere Human: bye Assistant:", "chosen": " ciao", "rejected": None}),
])
def test_real_chat_exports_read_as_turns(row, expected):
    assert read_pair(row, WHERE) == expected


@pytest.mark.parametrize("row, reason", [
    ({"conversations": []}, "an empty conversation"),
    ({"conversations": [{"from": "gpt", "value": "...and so on."}, {"from": "human", "value": "thanks"},
                        {"from": "gpt", "value": "welcome"}]}, "the conversation starts with the assistant"),
    ({"conversations": [{"from": "human", "value": "weather?"}, {"from": "function_call", "value": "{}"},
                        {"from": "observation", "value": "sunny"}, {"from": "gpt", "value": "Sunny."}]},
     "the conversation holds tool calls or tool results"),
    ({"messages": [user("weather?"), {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                   {"role": "tool", "content": "sunny"}, assistant("Sunny.")]},
     "the conversation holds tool calls or tool results"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                                {"type": "text", "text": "What is this?"}]}, assistant("A cat.")]},
     "a message holds a part that is not text (an image, audio, a file)"),
])
def test_rows_real_dumps_hold_besides_chats_are_skipped_not_an_error_for_the_file(row, reason):
    """Before: each was a DataError, which refused the whole file (the ShareGPT dump cannot be read at all)."""
    assert read_pair(row, WHERE) == unusable_row(reason)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "p", "completion": " 21", "label": "no"},
     "field 'label' must be true (a desirable completion) or false (an undesirable one), got 'no'"),
    ({"prompt": "p", "completion": " 21", "label": 2},
     "field 'label' must be true (a desirable completion) or false (an undesirable one), got 2"),
    ({"prompt": "p", "completion": " 21", "label": None},
     "field 'label' must be true (a desirable completion) or false (an undesirable one), got None"),
    ({"completion": " 21", "label": True}, "missing field 'prompt' (a labelled completion needs its prompt)"),
    ({"prompt": "p", "completion": "", "label": True}, "field 'completion' is empty"),
    ({"prompt": "p", "completion": [user("x")], "label": True},
     "field 'completion' must end in one assistant message after the prompt, got ['user']"),
    ({"prompt": "p", "completion": " 21", "rejected": " 22", "label": True},
     "field 'rejected' does not go with 'label' (a labelled row has one answer, in 'completion')"),
])
def test_bad_labelled_rows_name_the_row_and_field(row, message):
    with pytest.raises(DataError) as err:
        read_pair(row, WHERE)
    assert str(err.value) == f"{WHERE}: {message}"


def test_labelled_rows_feed_kto_and_step_1_imitates_only_the_desirable_ones(tmp_path, tiny_tokenizer):
    """KTO reads labelled rows and pairs alike (a pair as one answer of each kind); step 1 keeps the desirable
    answers, step 2's pairs none of the labelled rows."""
    from utils.data.data_utils import create_prompt_dataset

    rows = [{"prompt": f" Human: What is {i} + 1? Assistant:", "completion": f" {i + 1 + i % 2}", "label": i % 2 == 0}
            for i in range(20)]
    rows += [{"prompt": f" Human: What is {i} + 2? Assistant:", "chosen": f" {i + 2}", "rejected": " no"}
             for i in range(10)]
    for split in ("train", "eval"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    feedback, _ = create_prompt_dataset([str(tmp_path)], "0,1", str(tmp_path / "cache"), 2, 1, tiny_tokenizer, 64,
                                        unpaired=True)
    assert len(feedback) == 40 and sum(sample["desirable"] for sample in feedback) == 20
    assert feedback.counts["train"] == {"read": 40, "kept": 40, "skipped": {}}  # a pair counts as two rows
    sft, _ = create_prompt_dataset([str(tmp_path)], "1,0", str(tmp_path / "cache"), 1, 1, tiny_tokenizer, 64)
    pairs, _ = create_prompt_dataset([str(tmp_path)], "0,1", str(tmp_path / "cache"), 2, 1, tiny_tokenizer, 64)
    assert len(sft) == 20 and len(pairs) == 10


@pytest.mark.parametrize("row, expected", [
    # PKU-SafeRLHF: the index of the better response
    ({"prompt": "How do I boil an egg?", "response_0": "Set it on fire.", "response_1": " Boil it 8 minutes. ",
      "better_response_id": 1, "safer_response_id": 1},
     {"prompt": " Human: How do I boil an egg? Assistant:", "chosen": " Boil it 8 minutes.",
      "rejected": " Set it on fire."}),
    ({"prompt": "q", "response_0": "good", "response_1": "bad", "better_response_id": 0},
     {"prompt": " Human: q Assistant:", "chosen": " good", "rejected": " bad"}),
    # Stanford SHP: labels 1 where human_ref_A is preferred
    ({"history": "Why is the sky blue?", "human_ref_A": "Rayleigh scattering.", "human_ref_B": "Paint.",
      "labels": 1}, {"prompt": " Human: Why is the sky blue? Assistant:", "chosen": " Rayleigh scattering.",
                     "rejected": " Paint."}),
    ({"history": "q", "human_ref_A": "worse", "human_ref_B": "better", "labels": 0},
     {"prompt": " Human: q Assistant:", "chosen": " better", "rejected": " worse"}),
])
def test_two_responses_and_the_index_of_the_better_are_a_pair(row, expected):
    assert read_pair(row, WHERE) == expected


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "response_0": "a", "response_1": "b", "better_response_id": 2},
     "field 'better_response_id' must be 0 or 1, got 2"),
    ({"history": "q", "human_ref_A": "a", "human_ref_B": "b", "labels": True}, "field 'labels' must be 0 or 1"),
    ({"prompt": "q", "response_0": "a", "response_1": ["b"], "better_response_id": 0},
     "field 'response_1' must be a string, got list"),
    # the columns named chosen and rejected by --chosen_key / --rejected_key: the better one's index is not ignored
    ({"prompt": "q", "chosen": "a", "rejected": "b", "better_response_id": 1},
     "field 'better_response_id' says which of 'response_0' and 'response_1' is the better; read the row without "
     "--chosen_key and --rejected_key"),
])
def test_bad_rows_of_two_responses_name_the_field(row, message):
    with pytest.raises(DataError) as err:
        read_pair(row, WHERE)
    assert str(err.value).startswith(f"{WHERE}: {message}")


def test_renaming_the_responses_of_a_ranked_file_is_refused_by_flag(tmp_path):
    path = tmp_path / "pku.jsonl"
    path.write_text(json.dumps({"prompt": "q", "response_0": "a", "response_1": "b", "better_response_id": 1}) + "\n")
    with pytest.raises(DataError, match="'better_response_id' says which of 'response_0' and 'response_1'"):
        rd.read_local_split(path, {"chosen": "response_0", "rejected": "response_1"})


@pytest.mark.parametrize("row, reason", [
    # HH dialogues that part before their last turn: each "answer" would hold the user's next turn
    ({"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Joke?\n\nAssistant: Knock knock.",
      "rejected": "\n\nHuman: Hi\n\nAssistant: Go away.\n\nHuman: Joke?\n\nAssistant: No."},
     "chosen and rejected dialogues differ before their last turn"),
    # a message whose text holds a speaker mark would read back as turns of its own
    ({"prompt": [user("Fix the typos:\nHuman: helo\nAssistant: sure")], "chosen": [assistant("a")],
      "rejected": [assistant("b")]}, "a message's text holds 'Human:' or 'Assistant:'"),
    ({"messages": [user("Quote: Assistant: hi"), assistant("ok")]}, "a message's text holds 'Human:'"),
    ({"prompt": [user("a"), assistant("Human: b"), user("c")]}, "a message's text holds 'Human:'"),
])
def test_rows_the_text_form_cannot_hold_are_read_as_unusable_with_the_reason(row, reason):
    pair = read_pair(row, WHERE)
    assert (pair["prompt"], pair["chosen"], pair["rejected"]) == (None, None, None) and reason in pair[UNUSABLE]


def test_a_speaker_mark_only_inside_a_word_or_without_its_colon_is_kept():
    row = {"prompt": [user("The Assistant said: hi. AHuman: x. Human rights?")], "chosen": [assistant("a")],
           "rejected": [assistant("b")]}
    assert read_pair(row, WHERE)["prompt"] == " Human: The Assistant said: hi. AHuman: x. Human rights? Assistant:"


def test_an_empty_answer_message_is_no_answer_and_a_blank_text_answer_is_kept_verbatim():
    row = {"prompt": "q", "chosen": [assistant("  ")], "rejected": [assistant("b")]}
    assert read_pair(row, WHERE) == {"prompt": " Human: q Assistant:", "chosen": None, "rejected": " b"}
    assert read_pair({"messages": [user("q"), assistant("")]}, WHERE)["chosen"] is None
    # the text form is used verbatim: a blank answer an actor gave is the rejected answer of sampled pairs
    row = {"prompt": " Human: q Assistant:", "chosen": " BSUO", "rejected": " "}
    assert read_pair(row, WHERE) == row


def test_a_prompt_beside_the_whole_chat_takes_the_answer_from_the_chat():
    """ultrachat_200k and no_robots: `prompt` repeats the chat's first user turn, `messages` holds the chat."""
    row = {"prompt": "Name a colour.", "prompt_id": "x1",
           "messages": [user("Name a colour."), assistant("Blue."), user("Another?"), assistant("Red.")]}
    assert read_pair(row, WHERE) == {"prompt": " Human: Name a colour. Assistant: Blue. Human: Another? Assistant:",
                                     "chosen": " Red.", "rejected": None}


def test_unusable_rows_are_skipped_and_counted_by_reason_in_the_step(tmp_path, tiny_tokenizer):
    from utils.data.data_utils import create_prompt_dataset

    good = [{"prompt": [user(f"What is {i} + 1?")], "chosen": [assistant(f"{i + 1}")],
             "rejected": [assistant("no")]} for i in range(12)]
    marked = [{"prompt": [user(f"Say:\nHuman: {i}")], "chosen": [assistant("a")], "rejected": [assistant("b")]}
              for i in range(3)]
    empty = [{"prompt": [user(f"q{i}")], "chosen": [assistant("")], "rejected": [assistant("b")]} for i in range(2)]
    for split in ("train", "eval"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in good + marked + empty))
    pairs, _ = create_prompt_dataset([str(tmp_path)], "0,1", str(tmp_path / "cache"), 2, 1, tiny_tokenizer, 64)
    assert pairs.counts["train"] == {"read": 17, "kept": 12, "skipped": {
        "a message's text holds 'Human:' or 'Assistant:', which would read as a turn": 3, "no answer": 2}}


def test_a_file_of_one_pretty_printed_json_object_says_what_is_expected(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data": [{"prompt": "q", "chosen": "a", "rejected": "b"}]}, indent=2))
    with pytest.raises(DataError, match=r"one JSON object across several lines; expected a JSON array of rows"):
        rd.read_local_split(path)


@pytest.mark.parametrize("row, expected", [
    # HelpSteer2's preference file: negative strength where response_1 is the better
    ({"prompt": "q", "response_1": "good", "response_2": "bad", "preference_strength": -2},
     {"prompt": " Human: q Assistant:", "chosen": " good", "rejected": " bad"}),
    ({"prompt": "q", "response_1": "bad", "response_2": "good", "preference_strength": 1},
     {"prompt": " Human: q Assistant:", "chosen": " good", "rejected": " bad"}),
    # HelpSteer3: the context as messages, the same sign
    ({"context": [user("q"), assistant("a"), user("q2")], "response1": "bad", "response2": "good",
      "overall_preference": 3},
     {"prompt": " Human: q Assistant: a Human: q2 Assistant:", "chosen": " good", "rejected": " bad"}),
    # WebGPT comparisons: the question a record, the higher score the better
    ({"question": {"dataset": "eli5", "full_text": "Why?"}, "answer_0": "bad", "answer_1": "good",
      "score_0": -1.0, "score_1": 1.0, "quotes_0": {}, "tokens_0": []},
     {"prompt": " Human: Why? Assistant:", "chosen": " good", "rejected": " bad"}),
    # Chatbot Arena: two whole conversations and the winner
    ({"conversation_a": [user("q"), assistant("good")], "conversation_b": [user("q"), assistant("bad")],
      "winner": "model_a", "model_a": "x", "model_b": "y"},
     {"prompt": " Human: q Assistant:", "chosen": " good", "rejected": " bad"}),
    # LMSYS's arena-human-preference (Kaggle's CSV): JSON lists of turns, a one-hot vote
    ({"id": 1, "model_a": "x", "model_b": "y", "prompt": '["q"]', "response_a": '["bad"]', "response_b": '["good"]',
      "winner_model_a": 0, "winner_model_b": 1, "winner_tie": 0},
     {"prompt": " Human: q Assistant:", "chosen": " good", "rejected": " bad"}),
    ({"prompt": '["q"]', "response_a": '["good"]', "response_b": '["bad"]', "winner_model_a": "1",
      "winner_model_b": "0", "winner_tie": "0"},  # a CSV file's cells, read as text
     {"prompt": " Human: q Assistant:", "chosen": " good", "rejected": " bad"}),
])
def test_more_layouts_of_two_responses_and_a_judgement_are_pairs(row, expected):
    assert read_pair(row, WHERE) == expected


@pytest.mark.parametrize("row, reason", [
    ({"prompt": "q", "response_1": "a", "response_2": "b", "preference_strength": 0}, "judged equal (a tie)"),
    ({"question": {"full_text": "q"}, "answer_0": "a", "answer_1": "b", "score_0": 0.5, "score_1": 0.5},
     "judged equal (a tie)"),
    ({"conversation_a": [user("q"), assistant("a")], "conversation_b": [user("q"), assistant("b")],
      "winner": "tie (bothbad)"}, "judged equal (a tie)"),
    # a second turn in which the two conversations differ: the first answers would carry it
    ({"conversation_a": [user("q"), assistant("a"), user("q2"), assistant("a2")],
      "conversation_b": [user("q"), assistant("b"), user("q2"), assistant("b2")], "winner": "model_b"},
     "chosen and rejected conversations differ before their last turn"),
    ({"prompt": '["q"]', "response_a": '["a"]', "response_b": '["b"]', "winner_model_a": 0, "winner_model_b": 0,
      "winner_tie": 1}, "judged equal (a tie)"),
    ({"prompt": '["q", "q2"]', "response_a": '["a", "a2"]', "response_b": '["b", "b2"]', "winner_model_a": 1,
      "winner_model_b": 0, "winner_tie": 0}, "chosen and rejected conversations differ before their last turn"),
    ({"prompt": '["q"]', "response_a": '["a"]', "response_b": '[null]', "winner_model_a": 1,
      "winner_model_b": 0, "winner_tie": 0}, "a turn without a response"),
])
def test_ties_and_conversations_that_part_early_are_unusable(row, reason):
    """A tie is no pair, but its prompt is one still (step 3's, the evaluation's); conversations that part before
    their last turn, or a turn without a response, leave no prompt either."""
    pair = read_pair(row, WHERE)
    prompt = " Human: q Assistant:" if reason == "judged equal (a tie)" else None
    assert (pair["prompt"], pair["chosen"], pair["rejected"]) == (prompt, None, None) and reason in pair[UNUSABLE]


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "response_1": "a", "response_2": "b", "preference_strength": "much"},
     "field 'preference_strength' must be a number"),
    ({"question": {"full_text": "q"}, "answer_0": "a", "answer_1": "b", "score_0": None, "score_1": 1},
     "field 'score_0' must be a number, got None"),
    ({"conversation_a": [user("q"), assistant("a")], "conversation_b": [user("q"), assistant("b")],
      "winner": "model_c"}, "field 'winner' must be model_a, model_b or a tie, got 'model_c'"),
    ({"conversation_a": "a", "conversation_b": [user("q"), assistant("b")], "winner": "model_a"},
     "field 'conversation_a' must be a non-empty list of messages"),
    ({"prompt": "q", "chosen": "a", "rejected": "b", "preference_strength": 1},
     "field 'preference_strength' says which of 'response_1' and 'response_2' is the better"),
    ({"prompt": '["q"', "response_a": '["a"]', "response_b": '["b"]', "winner_model_a": 1, "winner_model_b": 0,
      "winner_tie": 0}, "field 'prompt' must be a list of each turn's text (or its JSON)"),
    ({"prompt": '["q"]', "response_a": '["a", "a2"]', "response_b": '["b"]', "winner_model_a": 1,
      "winner_model_b": 0, "winner_tie": 0}, "fields prompt, response_a, response_b must hold as many turns each"),
    ({"prompt": '["q"]', "response_a": '["a"]', "response_b": '["b"]', "winner_model_a": 1, "winner_model_b": 1,
      "winner_tie": 0}, "fields winner_model_a, winner_model_b, winner_tie must hold one 1 and two 0s"),
])
def test_bad_judgements_name_the_field(row, message):
    with pytest.raises(DataError) as err:
        read_pair(row, WHERE)
    assert str(err.value).startswith(f"{WHERE}: {message}")


@pytest.mark.parametrize("row, expected", [
    # Alpaca: the instruction and its input are the user's turn, the output its answer
    ({"instruction": "Add the numbers.", "input": "2 and 2", "output": "4"},
     {"prompt": " Human: Add the numbers.\n2 and 2 Assistant:", "chosen": " 4", "rejected": None}),
    ({"instruction": "Say hi.", "input": "", "output": "hi"},
     {"prompt": " Human: Say hi. Assistant:", "chosen": " hi", "rejected": None}),
    # LLaMA-Factory's Alpaca pairs, with a system prompt and a history of earlier turns
    ({"instruction": "And 3 + 3?", "input": "", "chosen": "6", "rejected": "7", "system": "Be brief.",
      "history": [["2 + 2?", "4"]]},
     {"prompt": "Be brief.\n\n Human: 2 + 2? Assistant: 4 Human: And 3 + 3? Assistant:", "chosen": " 6",
      "rejected": " 7"}),
    # Orca DPO pairs: the system prompt and the question
    ({"system": "You are an AI assistant.", "question": "2 + 2?", "chosen": "4", "rejected": "5"},
     {"prompt": "You are an AI assistant.\n\n Human: 2 + 2? Assistant:", "chosen": " 4", "rejected": " 5"}),
    ({"system": "", "question": "2 + 2?", "chosen": "4", "rejected": "5"},
     {"prompt": " Human: 2 + 2? Assistant:", "chosen": " 4", "rejected": " 5"}),
    # OpenRLHF's default input and output
    ({"input": "2 + 2?", "output": "4"}, {"prompt": " Human: 2 + 2? Assistant:", "chosen": " 4", "rejected": None}),
    # ShareGPT: from / value, its last message the answer, or a prompt where it ends with the user's turn
    ({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "hi"},
                        {"from": "gpt", "value": "hello"}]},
     {"prompt": "S\n\n Human: hi Assistant:", "chosen": " hello", "rejected": None}),
    ({"conversations": [{"from": "human", "value": "hi"}]},
     {"prompt": " Human: hi Assistant:", "chosen": None, "rejected": None}),
    # LLaMA-Factory's ShareGPT pairs: the answers one message each
    ({"conversations": [{"from": "human", "value": "hi"}], "chosen": {"from": "gpt", "value": "hello"},
      "rejected": {"from": "gpt", "value": "go"}},
     {"prompt": " Human: hi Assistant:", "chosen": " hello", "rejected": " go"}),
    # a system column beside a text-form prompt, a chat, or a prompt of messages that has none
    ({"prompt": " Human: q Assistant: a Human: q2 Assistant:", "chosen": " x", "rejected": " y", "system": "S"},
     {"prompt": "S\n\n Human: q Assistant: a Human: q2 Assistant:", "chosen": " x", "rejected": " y"}),
    ({"messages": [user("q"), assistant("a")], "system": "S"},
     {"prompt": "S\n\n Human: q Assistant:", "chosen": " a", "rejected": None}),
    # a prompt of messages with a string answer (TRL's unpaired form)
    ({"prompt": [user("q")], "completion": "a", "label": False},
     {"prompt": " Human: q Assistant:", "chosen": None, "rejected": " a"}),
])
def test_instruction_data_and_sharegpt_chats_read_as_user_turns(row, expected):
    assert read_pair(row, WHERE) == expected


@pytest.mark.parametrize("row, message", [
    ({"conversations": [{"from": "robot", "value": "hi"}]}, "field 'conversations', message 0: speaker 'robot'"),
    ({"conversations": "hi"}, "field 'conversations' must be a list of messages"),
    ({"instruction": ["a"], "output": "b"}, "field 'instruction' must be a string, got list"),
    ({"instruction": "a", "output": 4}, "field 'output' must be a string, got int"),
    ({"instruction": "a", "output": "b", "history": [["q"]]}, "field 'history' must be a list of [instruction, "),
    ({"question": "q", "chosen": "a", "rejected": "b", "system": 3}, "field 'system' must be a string, got int"),
    ({"text": "### Human: hi ### Assistant: hello"}, "field 'text' holds a whole text, with no prompt and answer"),
])
def test_bad_instruction_rows_name_the_field(row, message):
    with pytest.raises(DataError) as err:
        read_pair(row, WHERE)
    assert str(err.value).startswith(f"{WHERE}: {message}")


def test_sharegpt_and_alpaca_files_feed_step_1_and_ties_are_counted_in_step_2(tmp_path, tiny_tokenizer):
    from utils.data.data_utils import create_prompt_dataset

    chats = [{"conversations": [{"from": "human", "value": f"What is {i} + 1?"},
                                {"from": "gpt", "value": f"{i + 1}"}]} for i in range(10)]
    alpaca = [{"instruction": f"What is {i} + 2?", "input": "", "output": f"{i + 2}"} for i in range(10)]
    judged = [{"prompt": f"What is {i} + 3?", "response_1": f"{i + 3}", "response_2": "no",
               "preference_strength": -1 if i % 5 else 0} for i in range(10)]
    for name, rows in (("chats", chats), ("alpaca", alpaca), ("judged", judged)):
        (tmp_path / name).mkdir()
        for split in ("train", "eval"):
            (tmp_path / name / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for name in ("chats", "alpaca"):
        sft, _ = create_prompt_dataset([str(tmp_path / name)], "1,0", str(tmp_path / "cache"), 1, 1, tiny_tokenizer,
                                       64)
        assert len(sft) == 10 and sft.counts["train"]["skipped"] == {}
    pairs, _ = create_prompt_dataset([str(tmp_path / "judged")], "0,1", str(tmp_path / "cache"), 2, 1,
                                     tiny_tokenizer, 64)
    assert len(pairs) == 8
    assert pairs.counts["train"]["skipped"] == {"the responses are judged equal (a tie)": 2}


@pytest.mark.parametrize("row, expected", [
    # Nectar: a text-form prompt and seven ranked answers, rank 1 the best
    ({"prompt": "\n\nHuman: What is 2 + 2?\n\nAssistant:", "turns": 1,
      "answers": [{"answer": "5", "model": "a", "rank": 2.0}, {"answer": "4", "model": "b", "rank": 1.0},
                  {"answer": "22", "model": "c", "rank": 3.0}]},
     {"prompt": " Human: What is 2 + 2? Assistant:", "chosen": " 4", "rejected": " 22"}),
    # UltraFeedback before binarizing: an instruction and scored completions
    ({"instruction": "What is 2 + 2?", "models": ["a", "b"],
      "completions": [{"response": "5", "overall_score": 3.5}, {"response": "4", "overall_score": 9}]},
     {"prompt": " Human: What is 2 + 2? Assistant:", "chosen": " 4", "rejected": " 5"}),
    # Dolly: the context after the instruction; OpenOrca: a system_prompt; MATH: a problem alone is an RL prompt
    ({"instruction": "Summarize.", "context": "A long text.", "response": "Short.", "category": "summarization"},
     {"prompt": " Human: Summarize.\nA long text. Assistant:", "chosen": " Short.", "rejected": None}),
    ({"id": "1", "system_prompt": "Be kind.", "question": "Hi?", "response": "Hello."},
     {"prompt": "Be kind.\n\n Human: Hi? Assistant:", "chosen": " Hello.", "rejected": None}),
    ({"problem": "1 + 1?", "solution": "2", "level": "Level 1"},
     {"prompt": " Human: 1 + 1? Assistant:", "chosen": None, "rejected": None}),
])
def test_ranked_lists_and_more_instruction_layouts(row, expected):
    assert read_pair(row, WHERE) == expected


@pytest.mark.parametrize("row, outcome", [
    ({"instruction": "q", "completions": [{"response": "a", "overall_score": 5}, {"response": "b", "overall_score": 5}]},
     "unusable: the responses are judged equal (a tie)"),
    ({"instruction": "q", "completions": [{"response": "a", "overall_score": 5}]},
     "unusable: fewer than two answers in 'completions'"),
    ({"instruction": "q", "completions": [{"response": "a", "overall_score": "high"}]},
     "error: field 'completions', item 0: field 'overall_score' must be a number, got 'high'"),
    ({"prompt": "q", "answers": [{"text": "a", "rank": 1}]},
     "error: field 'answers', item 0: expected {\"answer\": a string, \"rank\": a number}"),
])
def test_bad_or_tied_ranked_lists(row, outcome):
    kind, message = outcome.split(": ", 1)
    if kind == "unusable":
        assert read_pair(row, WHERE)[UNUSABLE] == message
        return
    with pytest.raises(DataError) as err:
        read_pair(row, WHERE)
    assert str(err.value) == f"{WHERE}: {message}"


@pytest.mark.parametrize("row, expected", [
    # argilla's UltraFeedback binarized preferences: an instruction, the answers under their own names, ratings
    ({"source": "evol", "instruction": "Name a prime.", "chosen_response": "7", "chosen_rating": 5,
      "rejected_response": "8", "rejected_rating": 1},
     {"prompt": " Human: Name a prime. Assistant:", "chosen": " 7", "rejected": " 8"}),
    # StackExchange paired: response_j is the better answer to the question
    ({"qid": 3, "question": "How do I sort a list?", "date": "2020", "metadata": ["u"],
      "response_j": "Use sorted(xs).", "response_k": "You cannot."},
     {"prompt": " Human: How do I sort a list? Assistant:", "chosen": " Use sorted(xs).", "rejected": " You cannot."}),
    # OpenAI's fine-tuning form for DPO: the prompt's messages under input, one assistant message each
    ({"input": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
                "tools": [], "parallel_tool_calls": True},
      "preferred_output": [{"role": "assistant", "content": "Hello."}],
      "non_preferred_output": [{"role": "assistant", "content": "Go away."}]},
     {"prompt": "Be brief.\n\n Human: Hi? Assistant:", "chosen": " Hello.", "rejected": " Go away."}),
    # a row that also names chosen and rejected keeps them: the other names are other columns
    ({"prompt": "q", "chosen": "a", "rejected": "b", "response_j": "c", "response_k": "d"},
     {"prompt": "q", "chosen": "a", "rejected": "b"}),
])
def test_pairs_under_other_names_read_as_chosen_and_rejected(row, expected):
    assert read_pair(row, WHERE) == expected


def test_a_bad_pair_under_other_names_is_an_error_naming_its_own_column():
    row = {"input": {"messages": [{"role": "user", "content": "Hi?"}]},
           "preferred_output": [{"role": "bot", "content": "x"}],
           "non_preferred_output": [{"role": "assistant", "content": "y"}]}
    with pytest.raises(DataError) as err:
        read_pair(row, WHERE)
    assert str(err.value) == (f"{WHERE}: field 'preferred_output', message 0: expected {{\"role\": one of system, "
                              "user, assistant, \"content\": a string or a list of text parts}")


@pytest.mark.parametrize("row, reason", [
    # HuggingFaceH4/ultrafeedback_binarized: the two answers' own scores equal
    ({"prompt": "q", "chosen": [user("q"), assistant("a")], "rejected": [user("q"), assistant("b")],
      "score_chosen": 7.0, "score_rejected": 7.0}, "'score_chosen' equals 'score_rejected'"),
    # argilla's cleaned UltraFeedback, a CSV file's text of the ratings: the chosen answer rated below
    ({"instruction": "q", "chosen_response": "a", "rejected_response": "b", "chosen-rating": "2",
      "rejected-rating": "4.5"}, "'chosen-rating' is below 'rejected-rating'"),
    # argilla's distilabel-intel-orca-dpo-pairs: its judge found the two alike
    ({"input": "q", "chosen": "a", "rejected": "b", "status": "tie"}, "judged equal (a tie)"),
])
def test_a_pair_its_own_score_columns_call_a_tie_or_reverse_is_unusable(row, reason):
    """No pair, and no answer to imitate; its prompt is still one (step 3's, the evaluation's)."""
    pair = read_pair(row, WHERE)
    assert (pair["prompt"], pair["chosen"], pair["rejected"]) == (" Human: q Assistant:", None, None)
    assert reason in pair[UNUSABLE]


@pytest.mark.parametrize("extra", [{"score_chosen": 8, "score_rejected": 3.5},
                                   {"score_chosen": None, "score_rejected": 3},
                                   {"chosen_rating": "n/a", "rejected_rating": 2}, {"status": "swapped"}])
def test_scores_that_agree_or_say_nothing_keep_the_pair(extra):
    assert read_pair({"prompt": "q", "chosen": " a", "rejected": " b", **extra}, WHERE) == {
        "prompt": "q", "chosen": " a", "rejected": " b"}


def test_a_tie_status_marks_only_a_pair():
    row = {"prompt": "q", "completion": " a", "label": True, "status": "tie"}
    assert read_pair(row, WHERE)["chosen"] == " a"


def test_pku_rows_may_be_judged_by_safety_by_naming_the_column(tmp_path):
    path = tmp_path / "pku.jsonl"
    path.write_text(json.dumps({"prompt": "q", "response_0": "safe", "response_1": "helpful", "better_response_id": 1,
                                "safer_response_id": 0}) + "\n")
    assert rd.read_local_split(path).to_list()[0]["chosen"] == " helpful"
    safer = rd.read_local_split(path, {"better_response_id": "safer_response_id"}).to_list()[0]
    assert (safer["chosen"], safer["rejected"]) == (" safe", " helpful")


def test_rated_answers_to_one_prompt_are_a_pair_of_the_best_and_the_worst(tmp_path):
    """HelpSteer2's main files: one answer per row, rated; before, every answer (the worst too) was a chosen answer
    for step 1 and step 2 found no pair."""
    rows = [{"prompt": "Name a prime.", "response": "Four.", "helpfulness": 0, "correctness": 0},
            {"prompt": "Name a prime.", "response": "Seven.", "helpfulness": 4, "correctness": 4},
            {"prompt": "Say hi.", "response": "Hi!", "helpfulness": 3, "correctness": 4},
            {"prompt": "Say hi.", "response": "Hello!", "helpfulness": 3, "correctness": 3},
            {"prompt": "Add 2 and 2.", "response": "5", "helpfulness": 1, "correctness": 1},
            {"prompt": "Name a prime.", "response": "Nine.", "helpfulness": 1, "correctness": 0}]
    path = tmp_path / "helpsteer2.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read = rd.read_local_split(path).to_list()
    assert [(row["prompt"], row["chosen"], row["rejected"]) for row in read] == [
        (" Human: Name a prime. Assistant:", " Seven.", " Four."),
        (" Human: Say hi. Assistant:", None, None),  # "Say hi.": rated alike, a tie: a prompt, no pair
        (" Human: Add 2 and 2. Assistant:", " 5", None)]  # answered once: a prompt with one answer
    assert "judged equal (a tie)" in read[1][UNUSABLE]
    assert rd.read_local_split(path, {"chosen": "response"}).to_list()[0]["chosen"] == "Four."  # read as named
    assert not {"helpfulness", "correctness"} & set(json.loads(read[0][rd.ROW_COLUMNS]))  # the answers' own
    rows[1]["helpfulness"] = rows[0]["helpfulness"] = float("inf")  # json writes Infinity, which it reads back
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError, match=r"row 0 \(line 1\): field 'helpfulness' must be a number \(the answer's "
                                        r"rating\), got inf"):  # before: blamed 'preference_strength'
        rd.read_local_split(path)


def test_helpsteer2_multi_turn_prompts_in_nemo_markup_are_read_as_their_turns(tmp_path):
    """HelpSteer2 writes a multi-turn prompt as its first user turn, then `<extra_id_1>Assistant` and
    `<extra_id_1>User` lines; before, the whole of it was one user turn, the marks in its text."""
    prompt = "What is 2 + 2?\n<extra_id_1>Assistant\n4.\n<extra_id_1>User\nAnd 3 + 3?"
    expected = " Human: What is 2 + 2? Assistant: 4. Human: And 3 + 3? Assistant:"
    ranked = read_pair({"prompt": prompt, "response_1": "6.", "response_2": "7.", "preference_strength": -1}, "r")
    assert (ranked["prompt"], ranked["chosen"], ranked["rejected"]) == (expected, " 6.", " 7.")
    rows = [{"prompt": prompt, "response": "7.", "helpfulness": 1},
            {"prompt": prompt, "response": "6.", "helpfulness": 4},
            {"prompt": "<extra_id_0>System\nBe brief.\n<extra_id_1>User\nHi?", "response": "Hi.", "helpfulness": 3}]
    path = tmp_path / "helpsteer2.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read = rd.read_local_split(path).to_list()
    assert [(row["prompt"], row["chosen"], row["rejected"]) for row in read] == [
        (expected, " 6.", " 7."), ("Be brief.\n\n Human: Hi? Assistant:", " Hi.", None)]
    assert read_pair({"prompt": "Say <extra_id_1>User without a new line."}, "r")["prompt"] == \
        "Say <extra_id_1>User without a new line."  # a mark only at a line's start, before a new line


def test_rows_of_a_file_with_a_system_column_read_alike_whether_their_system_is_empty_or_not():
    """jondurbin/truthy-dpo, Intel/orca_dpo_pairs: a `system` column, empty on some rows. An empty one left its row
    in the verbatim text form (prompt and answer glued: "park?No location."), a full one made it a conversation."""
    row = {"prompt": "Nearest park?", "chosen": "No location.", "rejected": "Yosemite."}
    empty, full = read_pair({"system": "", **row}, "r"), read_pair({"system": "Be kind.", **row}, "r")
    assert empty == {"prompt": " Human: Nearest park? Assistant:", "chosen": " No location.", "rejected": " Yosemite."}
    assert full == {**empty, "prompt": "Be kind.\n\n" + empty["prompt"]}
    assert read_pair(row, "r") == row  # no system column: DeepSpeed-Chat's text form, verbatim, as before


def test_a_message_of_an_oasst1_tree_is_refused_saying_rows_must_be_whole():
    """oasst1 is one row a message (message_id, parent_id, role, text): the error named only 'text', and renaming
    it as the prompt (its advice) read every reply as a prompt without an answer."""
    row = {"message_id": "a00", "parent_id": "root0", "text": "Answer 0", "role": "assistant", "rank": 0}
    with pytest.raises(DataError, match=r"r: a message of a tree \(OpenAssistant's oasst1: 'message_id', "
                                        r"'parent_id'\), one row a message; rows must be whole"):
        read_pair(row, "r")


def test_capybaras_conversation_of_exchanges_reads_as_a_chat():
    """LDJnr/Capybara and Pure-Dove: `conversation` as a list of {"input", "output"} exchanges (before: "missing
    field 'prompt'")."""
    row = {"source": "Know-Logic", "conversation": [{"input": "Q 0", "output": "A 0"}, {"input": "More?", "output": "B"}]}
    assert read_pair(row, "r") == {"prompt": " Human: Q 0 Assistant: A 0 Human: More? Assistant:", "chosen": " B",
                                   "rejected": None}
    with pytest.raises(DataError, match=r"r: field 'conversation', exchange 0: expected \{\"input\": a string"):
        read_pair({"conversation": [{"input": 1, "output": "x"}]}, "r")


def test_capybara_dpo_pairs_read_their_whole_conversations_and_their_ratings():
    """argilla/distilabel-capybara-dpo-7k-binarized: `chosen` and `rejected` whole conversations beside the
    `conversation` of exchanges they came from (which ends with its original answer: before, it was read as the
    prompt and the whole file refused), rated in `rating_chosen` and `rating_rejected` (equal: a tie)."""
    exchanges = [{"input": "Hi", "output": "Hello"}, {"input": "Q", "output": "original"}]
    chat = [user("Hi"), assistant("Hello"), user("Q")]
    row = {"source": "Airoboros", "conversation": exchanges, "prompt": "Q", "chosen": [*chat, assistant("good")],
           "rejected": [*chat, assistant("bad")], "rating_chosen": 5, "rating_rejected": 2}
    assert read_pair(row, "r") == {"prompt": " Human: Hi Assistant: Hello Human: Q Assistant:", "chosen": " good",
                                   "rejected": " bad"}
    tie = read_pair({**row, "rating_rejected": 5}, "r")
    assert (tie["prompt"], tie["chosen"], "'rating_chosen' equals 'rating_rejected'" in tie[UNUSABLE]) == (
        " Human: Hi Assistant: Hello Human: Q Assistant:", None, True)


def test_a_ties_prompt_is_an_rl_prompt_and_no_pair_or_sft_row(tmp_path, tiny_tokenizer):
    """Chatbot Arena: a third of the votes are ties. Their prompts were lost to step 3 and the evaluation too (a
    small file's eval part could be left with none); now only the steps that train on answers skip them."""
    from utils.data.data_utils import create_prompt_dataset

    def row(i, winner):
        return {"conversation_a": [user(f"q{i}"), assistant(f"a{i}")], "conversation_b": [user(f"q{i}"),
                assistant(f"b{i}")], "winner": winner}

    rows = [row(i, "tie" if i % 2 else "model_a") for i in range(20)]
    for split in ("train", "eval"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts, _ = create_prompt_dataset([str(tmp_path)], "0,0,1", str(tmp_path / "cache"), 3, 1, tiny_tokenizer, 64)
    pairs, _ = create_prompt_dataset([str(tmp_path)], "0,1,0", str(tmp_path / "cache"), 2, 1, tiny_tokenizer, 64)
    assert prompts.counts["train"]["kept"] == 20 and prompts.counts["train"]["skipped"] == {}
    assert pairs.counts["train"] == {"read": 20, "kept": 10, "skipped": {"the responses are judged equal (a tie)": 10}}
