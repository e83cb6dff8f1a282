"""The reward model of step 2, which is also step 3's critic: a base transformer (no LM head) and a scalar value
head on every position. A sequence's score is the value at its last real token (EOS included), found from the
attention mask, so steps 2 and 3 score the same position whatever the padding side.

Saved folder: the backbone as a normal Hugging Face model (loadable with `AutoModel`), `value_head.safetensors`,
and a `chatrlhf_reward_model` entry in config.json naming the head file, the base model and
`num_padding_at_beginning`.
"""
from pathlib import Path

import torch
from torch import nn

from utils.data.data_utils import attention_mask_right, pad_right, tokenize_answer, tokenize_prompt
from utils.model.model_utils import (REWARD_MODEL_KEY, check_model_kind, create_hf_model, is_reward_model_folder,
                                     load_tokenizer, model_forward_kwargs, one_line_error, resolve_model_path)
from utils.model.save import load_safetensors, save_safetensors
from utils.rl.losses import pairwise_loss
from utils.rl.tokens import last_token_index
from utils.runtime.errors import ConfigError
from utils.runtime.progress import progress

VALUE_HEAD_FILE = "value_head.safetensors"


def _saved_entry(saved, path):
    """config.json's REWARD_MODEL_KEY entry of the reward-model folder `path`, checked: a JSON object whose
    `value_head` is a file name in the folder, `num_padding_at_beginning` a count, `base_model` a name (each
    optional); a ConfigError naming the file and key otherwise."""
    where = f"{Path(path) / 'config.json'}: '{REWARD_MODEL_KEY}'"
    if not isinstance(saved, dict):
        raise ConfigError(f"{where} must be a JSON object (step 2 writes it), not a {type(saved).__name__}")
    head, padding, base = (saved.get(key) for key in ("value_head", "num_padding_at_beginning", "base_model"))
    if head is not None and not (isinstance(head, str) and head and Path(head).name == head):
        raise ConfigError(f"{where}: 'value_head' must be the name of a file in the folder, got {head!r}")
    if padding is not None and (isinstance(padding, bool) or not isinstance(padding, int) or padding < 0):
        raise ConfigError(f"{where}: 'num_padding_at_beginning' must be a count (0 or more), got {padding!r}")
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{where}: 'base_model' must be a model's name, got {base!r}")
    return saved


class RewardModel(nn.Module):
    always_trainable = ("v_head.",)  # trained even under --only_optimize_lora (see utils.model.lora)

    def __init__(self, backbone, num_padding_at_beginning=0, base_model_name=None):
        super().__init__()
        self.config = backbone.config
        self.rwtransformer = backbone
        # OPT projects its hidden states to word_embed_proj_dim on the way out.
        hidden = getattr(self.config, "word_embed_proj_dim", None) or getattr(self.config, "hidden_size", None) \
            or self.config.n_embd
        # In the backbone's dtype: under ZeRO-3 its weights are partitioned in the training dtype as they load, and
        # DeepSpeed's ZeRO-3 optimizer refuses a model of mixed dtypes (an fp32 head beside bf16 weights).
        self.v_head = nn.Linear(hidden, 1, bias=False, dtype=next(backbone.parameters()).dtype)
        self.num_padding_at_beginning = num_padding_at_beginning
        self.base_model_name = base_model_name

    @classmethod
    def from_pretrained(cls, path, tokenizer, ds_config=None, dropout=None, num_padding_at_beginning=0,
                        trust_remote_code=False):
        """A reward-model folder (step 2 output) with its head, or a base/SFT model with a new head."""
        from transformers import AutoModel

        backbone = create_hf_model(AutoModel, path, tokenizer, ds_config, dropout, trust_remote_code)
        if not is_reward_model_folder(path):
            return cls(backbone, num_padding_at_beginning, base_model_name=str(path))
        saved = _saved_entry(getattr(backbone.config, REWARD_MODEL_KEY), path)
        model = cls(backbone, saved.get("num_padding_at_beginning", num_padding_at_beginning),
                    saved.get("base_model"))
        head_file = Path(path) / saved.get("value_head", VALUE_HEAD_FILE)
        try:
            head = load_safetensors(head_file)
        except Exception as err:  # missing, truncated, not safetensors
            raise ConfigError(f"{head_file} cannot be loaded ({one_line_error(err)})") from None
        if head.get("weight") is None or head["weight"].shape != model.v_head.weight.shape:
            raise ConfigError(f"{head_file} does not hold a value head of shape {tuple(model.v_head.weight.shape)}")
        if not torch.isfinite(head["weight"]).all():
            raise ConfigError(f"{head_file}: the value head holds NaN or infinite values")
        with torch.no_grad():
            model.v_head.weight.copy_(head["weight"])
        return model

    def gradient_checkpointing_enable(self, **kwargs):
        self.rwtransformer.gradient_checkpointing_enable(**kwargs)

    def enable_input_require_grads(self):
        self.rwtransformer.enable_input_require_grads()

    def forward_value(self, input_ids, attention_mask=None, use_cache=False, position_ids=None, sequence_ends=None):
        """Per-token values (rows, seq) and each sequence's end score: the value at its last real token.

        A padded batch (attention_mask) has one sequence per row, ending at the row's last real token. A packed
        batch (utils/data/packing.py: position_ids restarting per sequence, no mask, no cache) has several per
        row, the (row, column) of each one's last token in `sequence_ends`."""
        if attention_mask is None:
            outputs = self.rwtransformer(input_ids=input_ids, position_ids=position_ids, use_cache=False)
            values = self.v_head(outputs[0]).squeeze(-1)
            return values, values[sequence_ends[:, 0], sequence_ends[:, 1]]
        outputs = self.rwtransformer(input_ids=input_ids, use_cache=use_cache,
                                     **model_forward_kwargs(self.rwtransformer, attention_mask))
        values = self.v_head(outputs[0]).squeeze(-1)
        end_scores = values.gather(1, last_token_index(attention_mask).unsqueeze(1)).squeeze(1)
        return values, end_scores

    def forward(self, input_ids, attention_mask=None, use_cache=False, position_ids=None, sequence_ends=None):
        """A batch of chosen sequences followed by as many rejected ones (padded rows, or packed with their
        `sequence_ends`): the pairwise loss and both end scores."""
        _, end_scores = self.forward_value(input_ids, attention_mask, use_cache, position_ids, sequence_ends)
        chosen_scores, rejected_scores = end_scores.chunk(2)
        return {"loss": pairwise_loss(chosen_scores, rejected_scores),
                "chosen_end_scores": chosen_scores, "rejected_end_scores": rejected_scores}

    def save_pretrained(self, save_dir, state_dict):
        """Write the backbone (keys `rwtransformer.*`) as a Hugging Face folder and the head beside it."""
        backbone_state = {k[len("rwtransformer."):]: v for k, v in state_dict.items()
                          if k.startswith("rwtransformer.")}
        setattr(self.rwtransformer.config, REWARD_MODEL_KEY, {
            "value_head": VALUE_HEAD_FILE, "base_model": self.base_model_name,
            "num_padding_at_beginning": self.num_padding_at_beginning})
        self.rwtransformer.save_pretrained(save_dir, state_dict=backbone_state)
        save_safetensors({"weight": state_dict["v_head.weight"]}, Path(save_dir) / VALUE_HEAD_FILE)


def load_reward_model(name_or_path, trust_remote_code=False):
    """(model, tokenizer) of a step-2 output folder, the model in eval mode; any other folder is refused."""
    path = resolve_model_path(name_or_path)
    check_model_kind(path, reward=True, name=name_or_path)
    tokenizer = load_tokenizer(path, trust_remote_code)
    model = RewardModel.from_pretrained(path, tokenizer, trust_remote_code=trust_remote_code)
    return model.eval(), tokenizer


def score_sequences(model, sequences, pad_token_id, batch_size=32, desc=None):
    """End scores of token-id lists, right-padded in batches of `batch_size`, the model in eval mode and
    without gradients (its training mode is restored afterwards). `desc`: the label of a progress bar over the
    batches (None: no bar)."""
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    scores = []
    try:
        with torch.no_grad():
            for start in progress(range(0, len(sequences), batch_size), desc=desc, unit="batch",
                                  disable=desc is None):
                chunk = sequences[start:start + batch_size]
                _, end_scores = model.forward_value(pad_right(chunk, pad_token_id).to(device),
                                                    attention_mask_right(chunk).to(device))
                scores += end_scores.float().tolist()
    finally:
        model.train(was_training)
    return scores


def score_answers(model, tokenizer, prompts, answers, batch_size=32, desc=None):
    """The reward model's score of each answer to its prompt: prompt + answer + EOS, tokenized as step 2
    tokenizes its pairs (`tokenize_prompt`, `tokenize_answer`), scored at the last real token."""
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    sequences = [tokenize_prompt(tokenizer, prompt) + tokenize_answer(tokenizer, answer)
                 for prompt, answer in zip(prompts, answers)]
    return score_sequences(model, sequences, tokenizer.pad_token_id, batch_size, desc)
