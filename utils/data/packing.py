"""Sample packing for steps 1 and 2 (`--packing`): the samples of a batch are laid end to end in as few rows of at
most `--max_seq_len` tokens as first-fit decreasing finds, instead of each in a row of its own padded to the
batch's longest, so far fewer padding positions are computed.

Each sample stays on its own: its position ids restart at 0, and the model is given no attention mask and no
cache (`use_cache=False`), which tells transformers (5.x, `masking_utils.find_packed_sequence_indices`) that a
row is packed: wherever the position ids do not go up by one a new sample starts, and attention is causal within
each sample only. Verified on Llama with sdpa and eager attention (an explicit 4-D block-diagonal mask works too,
but costs a rows x W x W tensor per batch); with a cache, which a model makes by default, transformers skips the
detection and the samples see each other, as they do in models that derive positions from the mask (OPT):
`check_keeps_samples_apart` refuses those at start-up. The padding at a row's end has position 0 at every token,
so each pad token is a sample of one that attends only to itself. No label crosses a sample boundary: a sample's
first token, which the causal shift would make the target of the previous sample's last token, is labelled -100.

A packed batch holds the same samples as the padded one (--per_device_train_batch_size of them, pairs in step
2), so the loss, the optimizer steps and the learning-rate schedule are those of the unpacked run.
"""
from dataclasses import dataclass

import torch

from utils.data.data_utils import IGNORE_INDEX
from utils.runtime.errors import ConfigError


def pack_lengths(lengths, capacity):
    """First-fit decreasing: the indices of the samples of each row, longest first, every row's total length at
    most `capacity` (a sample longer than `capacity` gets a row of its own).

        rows = [[i, j, ...], ...],   sum(lengths[k] for k in row) <= capacity
    """
    rows, room = [], []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for row, space in enumerate(room):
            if lengths[index] <= space:
                rows[row].append(index)
                room[row] -= lengths[index]
                break
        else:
            rows.append([index])
            room.append(capacity - lengths[index])
    return rows


def pack_rows(sequences, capacity, pad_token_id):
    """`sequences` (lists of token ids) packed into rows (`pack_lengths`) and right-padded to the longest row.

    Returns input_ids (R, W), position_ids (R, W) (0, 1, ... within each sample; 0 on every pad token) and
    `starts`: the (row, column) at which each sequence begins, in the order of `sequences`."""
    rows = pack_lengths([len(seq) for seq in sequences], capacity)
    width = max(sum(len(sequences[i]) for i in row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    starts = [None] * len(sequences)
    for r, row in enumerate(rows):
        column = 0
        for index in row:
            length = len(sequences[index])
            input_ids[r, column:column + length] = torch.tensor(sequences[index], dtype=torch.long)
            position_ids[r, column:column + length] = torch.arange(length)
            starts[index] = (r, column)
            column += length
    return input_ids, position_ids, starts


@dataclass
class DataCollatorPackedSFT:
    """DataCollatorSFT's samples packed (`pack_rows`): input_ids, position_ids and labels (R, W), no attention
    mask. Labels are -100 on the prompt (as unpacked), on padding and at each sample's first token."""
    pad_token_id: int
    max_seq_len: int

    def __call__(self, samples):
        input_ids, position_ids, starts = pack_rows([s["input_ids"] for s in samples], self.max_seq_len,
                                                    self.pad_token_id)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        for sample, (row, column) in zip(samples, starts):
            labels[row, column + 1:column + len(sample["labels"])] = torch.tensor(sample["labels"][1:])
        return {"input_ids": input_ids, "position_ids": position_ids, "labels": labels}


@dataclass
class DataCollatorPackedReward:
    """DataCollatorReward's sequences (the batch's chosen ones, then its rejected ones) packed (`pack_rows`):
    input_ids and position_ids (R, W), no attention mask, and `sequence_ends` (2B, 2): the (row, column) of each
    sequence's last token, where the reward model reads its score; rows i and i + B of it are a pair."""
    pad_token_id: int
    max_seq_len: int

    def __call__(self, samples):
        sequences = [s["chosen_ids"] for s in samples] + [s["rejected_ids"] for s in samples]
        input_ids, position_ids, starts = pack_rows(sequences, self.max_seq_len, self.pad_token_id)
        ends = [(row, column + len(seq) - 1) for seq, (row, column) in zip(sequences, starts)]
        return {"input_ids": input_ids, "position_ids": position_ids,
                "sequence_ends": torch.tensor(ends, dtype=torch.long)}


def batch_counts(batch):
    """(samples, real tokens) of a padded or a packed batch. Padded: its rows and the ones of its attention mask.
    Packed (no mask): a sample is where a position id is 1 (every sample has at least two tokens: a prompt and an
    answer), and a token is real unless it is padding: position 0 followed by position 0 or the row's end."""
    if "attention_mask" in batch:
        return batch["input_ids"].shape[0], int(batch["attention_mask"].sum())
    positions = batch["position_ids"]
    following = torch.nn.functional.pad(positions[:, 1:], (0, 1), value=0)
    padding = (positions == 0) & (following == 0)
    return int((positions == 1).sum()), int(positions.numel() - padding.sum())


def check_keeps_samples_apart(model, flag="--packing"):
    """ConfigError unless `model` (a transformers base or causal-LM model) gives two short sequences packed in
    one row (position ids restarting, no attention mask) the same outputs as each on its own: models whose
    attention ignores per-sample position ids (OPT, for one) would let packed samples see each other."""
    vocab_size = model.config.vocab_size
    first = (torch.arange(7) * 5 + 3) % vocab_size
    second = (torch.arange(5) * 7 + 2) % vocab_size
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            alone = torch.cat([_first_output(model, ids.unsqueeze(0).to(device)) for ids in (first, second)], 1)
            packed = _first_output(model, torch.cat([first, second]).unsqueeze(0).to(device),
                                   torch.cat([torch.arange(7), torch.arange(5)]).unsqueeze(0).to(device))
    finally:
        model.train(was_training)
    tolerance = (1e-3 if packed.dtype == torch.float32 else 5e-2) * alone.float().abs().max().clamp(min=1.0)
    if (packed.float() - alone.float()).abs().max() > tolerance:
        raise ConfigError(f"{flag}: {type(model).__name__} does not keep packed samples apart (its attention "
                          "ignores per-sample position ids); drop --packing for this model")


def _first_output(model, input_ids, position_ids=None):
    kwargs = {"position_ids": position_ids} if position_ids is not None else {}
    return model(input_ids=input_ids, use_cache=False, **kwargs)[0]
