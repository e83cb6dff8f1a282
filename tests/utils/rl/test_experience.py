"""A batch of experience (utils/rl/experience.py): rows picked, minibatches split (a ragged last one only when
asked) and the experiences of a round's prompt batches, of different widths, made one by padding."""
import pytest
import torch

from utils.rl.experience import Experience, concat_experiences

PAD = 0


def experience(prompts, answers, first_value):
    """An experience of rows whose prompt (left-padded with PAD) and answer (right-padded) token ids are given;
    every per-token tensor counts up from `first_value` on the real answer tokens."""
    prompt_len = max(len(row) for row in prompts)
    answer_len = max(len(row) for row in answers)
    seq, attention, action = [], [], []
    for prompt, answer in zip(prompts, answers):
        left, right = prompt_len - len(prompt), answer_len - len(answer)
        seq.append([PAD] * left + prompt + answer + [PAD] * right)
        attention.append([0] * left + [1] * (len(prompt) + len(answer)) + [0] * right)
        action.append([1.0] * len(answer) + [0.0] * right)
    action_mask = torch.tensor(action)
    values = (first_value + torch.arange(action_mask.numel(), dtype=torch.float32)).view(action_mask.shape)
    values = values * action_mask
    return Experience(seq=torch.tensor(seq), attention_mask=torch.tensor(attention), action_mask=action_mask,
                      prompt_len=prompt_len, logprobs=-values, ref_logprobs=-2 * values, advantages=values,
                      positive=torch.tensor([True] * len(prompts)), stats={"score": first_value})


def real_tokens(exp):
    """Each row's (prompt tokens, answer tokens, advantages of the answer tokens) without padding."""
    rows = []
    for row in range(exp.rows):
        prompt = exp.seq[row, :exp.prompt_len][exp.attention_mask[row, :exp.prompt_len] > 0].tolist()
        real = exp.action_mask[row] > 0
        rows.append((prompt, exp.seq[row, exp.prompt_len:][real].tolist(), exp.advantages[row][real].tolist()))
    return rows


def test_select_and_split_keep_every_field_of_the_rows():
    exp = experience([[5, 6], [7], [8, 9, 10]], [[11], [12, 13], [14]], first_value=1.0)
    picked = exp.select(torch.tensor([True, False, True]))
    assert picked.rows == 2 and real_tokens(picked) == [real_tokens(exp)[0], real_tokens(exp)[2]]
    assert picked.stats == exp.stats and picked.values is None
    with pytest.raises(ValueError, match="3 rows do not split into minibatches of 2"):
        exp.split(2)
    assert [mb.rows for mb in exp.split(2, ragged=True)] == [2, 1]
    assert [real_tokens(mb) for mb in exp.split(1)] == [[row] for row in real_tokens(exp)]


def test_concat_pads_prompts_on_the_left_and_answers_on_the_right():
    short = experience([[5]], [[11]], first_value=1.0)  # P = 1, A = 1
    wide = experience([[6, 7, 8], [9]], [[12, 13, 14], [15]], first_value=10.0)  # P = 3, A = 3
    merged = concat_experiences([short, wide], PAD)
    assert merged.rows == 3 and merged.prompt_len == 3 and merged.seq.shape == (3, 6)
    assert real_tokens(merged) == real_tokens(short) + real_tokens(wide)
    # The padding is out of the attention and of every per-token tensor.
    assert merged.seq[0].tolist() == [PAD, PAD, 5, 11, PAD, PAD]
    assert merged.attention_mask[0].tolist() == [0, 0, 1, 1, 0, 0]
    for name in ("action_mask", "logprobs", "ref_logprobs", "advantages"):
        assert (getattr(merged, name)[0, 1:] == 0).all(), name
    assert merged.positive.tolist() == [True, True, True] and merged.stats == short.stats
    assert concat_experiences([wide], PAD) is wide


def test_concat_takes_experiences_without_rows():
    exp = experience([[5, 6]], [[11, 12]], first_value=1.0)
    empty = exp.select(slice(0, 0))
    merged = concat_experiences([empty, exp, empty], PAD)
    assert merged.rows == 1 and real_tokens(merged) == real_tokens(exp)
