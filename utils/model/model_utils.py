"""Finding and loading models and tokenizers: the built-in names, local folders and hub names alike."""
import contextlib
import functools
import inspect
import json
import math
from pathlib import Path

from utils.model.smollm2 import smollm2_model_path
from utils.model.tiny import tiny_model_path
from utils.runtime.args import is_auto
from utils.runtime.errors import ConfigError
from utils.runtime.time_limit import Overtime, time_limit

BUILTIN_MODELS = ("tiny", "smollm2-135m")
REWARD_MODEL_KEY = "chatrlhf_reward_model"
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
"""Weight files that are pickles (PyTorch's `pytorch_model.bin`...): load_pretrained never reads them."""


def resolve_model_path(name_or_path):
    """The folder or hub name to load for `--model_name_or_path`.

    `tiny` (the built-in default) and `smollm2-135m` are built into the cache on first use; an existing folder is
    used as it is; anything else is taken as a hub name and must be reachable (or already in the HF cache).
    """
    if not name_or_path:  # Path("") is the working directory
        raise ConfigError(f"the model path is empty: give a model folder, a hub name or a built-in name "
                          f"({', '.join(BUILTIN_MODELS)})")
    if name_or_path == "tiny":

        return str(tiny_model_path())
    if name_or_path == "smollm2-135m":

        return str(smollm2_model_path())
    path = Path(name_or_path)
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"model path {name_or_path} is a file; give the model's folder (the one holding "
                              "config.json and the weights)")
        if not (path / "config.json").is_file():
            raise ConfigError(f"model folder {name_or_path} has no config.json: not a Hugging Face model folder")
        read_model_config(path)
        return str(path)
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ConfigError(f"model path {name_or_path} does not exist")
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(name_or_path)
    except Exception as err:  # offline, unknown name, gated repo: all end the same way for the user
        raise ConfigError(f"model {name_or_path!r} is not a local folder and could not be loaded from the hub "
                          f"({type(err).__name__}); built-in names: {', '.join(BUILTIN_MODELS)}") from None
    return name_or_path


def read_model_config(folder):
    """A model folder's config.json as a dict; a ConfigError naming it if it is not a JSON object."""
    return read_json_object(Path(folder) / "config.json", "a model config")


def read_json_object(path, what):
    """The JSON object in the file `path` (`what` it should be, for the error) as a dict; a ConfigError naming the
    file if it cannot be read or holds anything else."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except RecursionError:
        raise ConfigError(f"{path} cannot be read as JSON (nested too deeply)") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path} cannot be read as JSON ({one_line_error(err)})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} is not {what} (a JSON object), but a {type(value).__name__}")
    return value


def is_reward_model_folder(path):
    config = Path(path) / "config.json"
    return config.is_file() and REWARD_MODEL_KEY in read_model_config(path)


def check_model_kind(path, *, reward, name):
    """Refuse the model folder `path` if it is of the wrong kind: reward=True wants a step-2 reward-model folder,
    reward=False a causal language model (a reward model has no language-model head). `name` is how the error
    names it: the flag and the value the user gave."""
    if is_reward_model_folder(path) == reward:
        return
    if reward:
        raise ConfigError(f"{name} is not a reward model (its config.json has no '{REWARD_MODEL_KEY}' entry); pass "
                          "a step-2 output folder")
    raise ConfigError(f"{name} is a reward model (step 2 output), not a causal language model; pass a step-1 or "
                      "step-3 actor folder or a base model")


def one_line_error(err):
    """`Type: first line of the message` of an exception raised by a library reading a user's file."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def load_tokenizer(path, trust_remote_code=False, padding_side="right"):
    """The model's tokenizer, with a pad token (eos when it has none: we find real tokens from attention
    masks, never by comparing ids with pad, so pad = eos is safe)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as err:  # no tokenizer files, a damaged one: whatever the library raises, name the folder
        raise ConfigError(f"model folder {path}: its tokenizer cannot be loaded ({one_line_error(err)})") from None
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer of {path} has no eos token; answers could never end")
    context = tokenizer.model_max_length
    if isinstance(context, bool) or not isinstance(context, (int, float)) or not context > 0:
        raise ConfigError(f"model folder {path}: tokenizer_config.json's 'model_max_length' must be a number of "
                          f"tokens, got {context!r}")
    _check_template_ends(tokenizer, path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


TEMPLATE_SECONDS = 10
"""The longest a model's chat template may take to write a short conversation (real ones take milliseconds)."""
PROBE_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
              {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And you?"}]


def _check_template_ends(tokenizer, path):
    """A ConfigError for a chat template that does not write PROBE_CHAT within TEMPLATE_SECONDS: Jinja's sandbox
    bounds each range to 100,000 steps, not two nested in each other, and the data, the evaluation and chat.py would
    hang on the first prompt. A template that refuses the conversation is judged where a real one meets it
    (utils.data.prompting)."""
    if not getattr(tokenizer, "chat_template", None):
        return
    try:
        with time_limit(TEMPLATE_SECONDS):
            tokenizer.apply_chat_template(PROBE_CHAT, tokenize=False, add_generation_prompt=True)
    except Overtime:
        raise ConfigError(f"model folder {path}: its chat template took over {TEMPLATE_SECONDS} s to write a "
                          "two-turn conversation (a loop without end?); fix chat_template in tokenizer_config.json "
                          "(or chat_template.jinja)") from None
    except Exception:  # noqa: BLE001 (refused, say, a system message: what prompting makes of it)
        pass


def load_model_config(path, trust_remote_code=False):
    """The transformers config of the model in `path` (a folder or a hub name); a ConfigError naming it if it
    cannot be loaded."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as err:
        raise ConfigError(f"model folder {path}: its config.json cannot be loaded ({one_line_error(err)})") from None


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""The config entries that state a model's context (the positions it can attend over), in the order read."""


def context_entry(config):
    """(key, positions): the first CONTEXT_KEYS entry of a model's config (or of a model's `config`) that states
    its context, under the name its config.json gives it (GPT-2's n_positions, which transformers also answers
    to as max_position_embeddings); None if none does."""
    config = getattr(config, "config", config)
    for key in CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return getattr(config, "attribute_map", {}).get(key, key), value
    return None


def context_length(model):
    """The number of positions the model (or a model's config) can attend over (None if its config does not say)."""
    entry = context_entry(model)
    return entry and entry[1]


def check_fits_context(path, lengths, trust_remote_code=False):
    """Refuse (ConfigError) length flags the model in `path` has no room for, before any data is tokenized:
    `lengths` ({flag: tokens or auto}, laid end to end: step 3's prompt then answer, one flag elsewhere) must fit
    the positions its config states. A position past them trains on positions the model never learned (rotary
    models) or fails mid-run with an index error (learned position embeddings: OPT, GPT-2). An `auto` length is
    fitted to the context later (utils.data.data_utils.fit_auto_lengths) and only needs one position left; a
    config that states no context bounds nothing."""
    entry = context_entry(load_model_config(path, trust_remote_code))
    if entry is None:
        return
    key, positions = entry
    given = {flag: value for flag, value in lengths.items() if not is_auto(value)}
    autos = [f"{flag} auto" for flag in lengths if flag not in given]
    total = sum(given.values())
    if total + len(autos) <= positions:
        return
    asked = " + ".join(f"{flag} {value}" for flag, value in given.items()) + (f" = {total}" if len(given) > 1 else "")
    context = f"the model's context ({positions} positions, {key} in {path}/config.json)"
    if total > positions:
        raise ConfigError(f"{asked} is over {context}")
    raise ConfigError(f"{asked} leaves no room for {' and '.join(autos)} in {context}")


def configure_dropout(config, dropout):
    """Set every dropout probability the config knows of (DeepSpeed-Chat's `--dropout`); None leaves them."""
    if dropout is None:
        return config
    for key in ("dropout", "attention_dropout", "hidden_dropout", "activation_dropout", "attn_pdrop",
                "embd_pdrop", "resid_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob"):
        if hasattr(config, key):
            setattr(config, key, dropout)
    return config


def create_hf_model(model_class, path, tokenizer, ds_config=None, dropout=None, trust_remote_code=False):
    """Load `model_class` (AutoModelForCausalLM, AutoModel...) from `path` in fp32 (DeepSpeed casts it to the
    training dtype). Under ZeRO-3 the weights are partitioned while they load, never held whole on one rank."""
    import torch

    if model_class.__name__ == "AutoModelForCausalLM":
        check_model_kind(path, reward=False, name=path)
    config = configure_dropout(load_model_config(path, trust_remote_code), dropout)
    hf_ds_config = _zero3_init_context(ds_config)  # noqa: F841 (must stay alive while the model loads)
    # fp32 whatever the folder was saved in (transformers 5 would keep a bf16 folder in bf16 by default, and a
    # reward model's fp32 value head would then meet bf16 hidden states). A reward model's backbone (AutoModel)
    # from a causal LM's folder leaves its LM head out.
    model = load_pretrained(model_class, path, dropped=("lm_head.",) if model_class.__name__ == "AutoModel" else (),
                            config=config, dtype=torch.float32, trust_remote_code=trust_remote_code)
    del hf_ds_config
    model.config.end_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        check_tokenizer_fits(model, tokenizer, path, room=ADDED_TOKENS_ROOM)
        model.resize_token_embeddings(int(8 * math.ceil(len(tokenizer) / 8.0)))
    return model


ADDED_TOKENS_ROOM = 64
"""How many tokens a tokenizer may hold beyond the model's embeddings (a pad token, a few special ones, for which
training adds rows: DeepSpeed-Chat's resize); more, and the folder's tokenizer is another model's."""


def check_tokenizer_fits(model, tokenizer, path, room=0):
    """Refuse (ConfigError) a tokenizer with more than `room` tokens beyond the model's embeddings: its ids past
    them would index no row (inference), or train rows that start random (a tokenizer of another model)."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows + room:
        raise ConfigError(f"model folder {path}: its tokenizer has {len(tokenizer)} tokens but the model's embeddings "
                          f"{rows} rows: the folder's tokenizer is another model's")


def load_pretrained(model_class, path, dropped=(), **kwargs):
    """`model_class.from_pretrained(path, **kwargs)`, anything wrong with the folder one ConfigError naming it: an
    unreadable config or weights file, no weights, and weights that do not fit the model its config describes
    (a config.json of another architecture: the model's weights missing from the folder would stay random, the
    folder's unused ones would be dropped, silently). `dropped`: name prefixes of folder weights the model is
    meant to leave out. Weights load from safetensors only: a pickle (`pytorch_model.bin`) can run code as it is
    read, so a folder holding only pickled weights is refused, as are weights with NaN or infinite values."""
    pickles = [] if any(Path(path).glob("*.safetensors")) else sorted(
        file.name for pattern in PICKLED_WEIGHTS for file in Path(path).glob(pattern))
    if pickles:
        raise ConfigError(f"model folder {path}: its weights are a pickle ({pickles[0]}), which is never loaded "
                          "(reading a pickle can run code); where you trust it, load it once and save it as "
                          "safetensors (model.save_pretrained(folder))")
    try:
        model, info = model_class.from_pretrained(path, output_loading_info=True, use_safetensors=True, **kwargs)
    except Exception as err:  # a truncated or garbage weights file, none at all: name the folder
        raise ConfigError(f"model folder {path}: its weights cannot be loaded ({one_line_error(err)})") from None
    missing = sorted(info["missing_keys"])
    unused = sorted(key for key in info["unexpected_keys"] if not key.startswith(tuple(dropped)))
    if missing or unused:
        example = ", ".join(f"{what} e.g. {keys[0]}" for what, keys in (("missing", missing), ("unused", unused))
                            if keys)
        raise ConfigError(f"model folder {path}: its weights do not fit the {type(model).__name__} its config.json "
                          f"describes: {len(missing)} of the model's weights missing from the folder, {len(unused)} "
                          f"of the folder's unused ({example}); is config.json the weights' own?")
    import torch

    with torch.no_grad():
        broken = next((name for name, weight in model.named_parameters()
                       if weight.numel() and not torch.isfinite(weight).all()), None)
    if broken:
        raise ConfigError(f"model folder {path}: its weights hold NaN or infinite values (e.g. {broken})")
    return model


def _zero3_init_context(ds_config):
    """Under ZeRO-3, transformers partitions parameters at load time while an HfDeepSpeedConfig is alive."""
    if ds_config is None or ds_config.get("zero_optimization", {}).get("stage") != 3:
        return None
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(ds_config)


def count_parameters(model):
    """Parameter count, counting ZeRO-3 partitioned parameters at their full size."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def position_ids_from_mask(attention_mask):
    """Positions counted over real tokens only, cumsum(mask) - 1 clamped at 0, so a left-padded row starts at
    position 0 like an unpadded one."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def model_forward_kwargs(model, attention_mask):
    """The attention mask, and explicit position ids for models whose forward accepts them (Llama derives
    positions from the cache, not from the mask, so left padding would shift them)."""
    kwargs = {"attention_mask": attention_mask}
    if _accepts_position_ids(type(model)):
        kwargs["position_ids"] = position_ids_from_mask(attention_mask)
    return kwargs


@functools.lru_cache(maxsize=None)
def _accepts_position_ids(model_class):
    return "position_ids" in inspect.signature(model_class.forward).parameters


def last_logits_kwargs(model, keep):
    """Ask for the logits of the last `keep` positions only, where the model's forward can (`logits_to_keep`,
    e.g. Llama): the other positions' (B, T - keep, vocab) logits are never computed (with a 49k-token vocabulary
    the output layer is a fifth of a small model's forward). Callers slice `logits[:, -keep:]`, which holds
    either way."""
    return {"logits_to_keep": keep} if _accepts_logits_to_keep(type(model)) else {}


def new_kv_cache(model):
    """An empty key/value cache for `model`'s forward (`cache_kwargs`)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def takes_cache(model):
    """Whether `model`'s forward takes position ids and a key/value cache object (and it has a config to build
    one from): what decoding with `new_kv_cache` needs."""
    return _cache_keyword(type(model)) is not None and hasattr(model, "config")


def cache_kwargs(model, cache):
    """The keyword argument passing `cache` to `model`'s forward: `cache` (transformers 5.24 on) or
    `past_key_values` (before; 5.24 still takes it, with a deprecation warning)."""
    return {_cache_keyword(type(getattr(model, "module", model))): cache}


@functools.lru_cache(maxsize=None)
def _cache_keyword(model_class):
    parameters = set(inspect.signature(model_class.forward).parameters)
    if "position_ids" not in parameters:
        return None
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def answer_logits(model, seq, attention_mask, prompt_len):
    """The logits predicting each answer token, (B, A, V), A = seq.shape[1] - prompt_len: those of
    model([prompts | answers]) at positions prompt_len - 1 ... T - 2, with every gradient.

    Rows that repeat the row before's prompt (the answers of a group, --num_samples_per_prompt) share one pass of
    it: the U distinct prompts run through the model into a key/value cache, copied to their rows, then the
    answers run on top. Same logits to float rounding; the prompt positions are computed U times instead of B
    (with 8 answers a prompt and prompts ten times longer than answers, ~6x fewer positions). `model` is called
    as it is: a DeepSpeed engine or a Hugging Face model.
    """
    import torch

    module = getattr(model, "module", model)
    prompts, prompt_mask = seq[:, :prompt_len], attention_mask[:, :prompt_len]
    unique, inverse = torch.unique_consecutive(prompts, dim=0, return_inverse=True)
    answers = seq[:, prompt_len:]
    checkpointing = getattr(module, "is_activation_checkpointing", False)  # it turns the cache off in training
    if unique.shape[0] == seq.shape[0] or not takes_cache(module) or checkpointing:
        keep = answers.shape[1] + 1  # the positions predicting the answer tokens, and the last one
        logits = model(input_ids=seq, use_cache=False, **model_forward_kwargs(module, attention_mask),
                       **last_logits_kwargs(module, keep)).logits
        return logits[:, -keep:-1]
    first = torch.cat([inverse.new_ones(1), (inverse[1:] != inverse[:-1]).long()]).bool()  # a prompt's first row
    cache = new_kv_cache(module)
    unique_mask = prompt_mask[first]
    prefill = model(input_ids=unique, attention_mask=unique_mask, position_ids=position_ids_from_mask(unique_mask),
                    use_cache=True, **cache_kwargs(module, cache), **last_logits_kwargs(module, 1)).logits[:, -1:]
    logits = prefill[inverse]  # (B, 1, V): predicts each row's first answer token
    if answers.shape[1] > 1:
        cache.batch_select_indices(inverse)
        mask = attention_mask[:, :-1]
        positions = position_ids_from_mask(mask)[:, prompt_len:]
        rest = model(input_ids=answers[:, :-1], attention_mask=mask, position_ids=positions, use_cache=True,
                     **cache_kwargs(module, cache)).logits
        logits = torch.cat([logits, rest], dim=1)
    return logits


@functools.lru_cache(maxsize=None)
def _accepts_logits_to_keep(model_class):
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


# ---- the output layer and the labels' log-probs together (utils/rl/head_logprobs.py) ----------------------------

FUSED_HEAD_CLASSES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                      "OPTForCausalLM", "GPT2LMHeadModel")
"""Transformers' causal LMs whose logits are `lm_head(hidden)` and nothing after (no soft-capping or scale)."""
_plain_head = [False]


@contextlib.contextmanager
def plain_output_layer():
    """Within: every model computes its full logits as Hugging Face does (the reference the fused path equals,
    and the bench's baseline)."""
    _plain_head.append(True)
    try:
        yield
    finally:
        _plain_head.pop()


def fused_output_layer(model):
    """The output layer (an nn.Linear) whose inputs the fused log-probs may take, or None where the logits
    must come from the model's forward: outside FUSED_HEAD_CLASSES, a bias or a LoRA layer on it, its weight
    partitioned by ZeRO-3, a compiled engine (a hook would recompile it), or under `plain_output_layer`."""
    import torch

    module = getattr(model, "module", model)
    if _plain_head[-1] or getattr(model, "is_compiled", False):
        return None
    if type(module).__name__ not in FUSED_HEAD_CLASSES or not type(module).__module__.startswith("transformers."):
        return None
    head = module.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None or hasattr(head.weight, "ds_id"):
        return None
    return head


@contextlib.contextmanager
def final_hidden_states(head):
    """Within: the output layer `head` returns its inputs, the final hidden states (B, T, H), in place of the
    logits, and computes none (its matmul runs on zero positions): a model's `.logits` are then those hidden
    states, sliced and gathered as logits would be."""
    inputs = []

    def keep_input(_module, args):
        inputs.append(args[0])
        return (args[0][..., :0, :],)

    def return_input(_module, _args, _output):
        return inputs.pop()

    handles = [head.register_forward_pre_hook(keep_input), head.register_forward_hook(return_input)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def answer_logprobs(model, seq, attention_mask, prompt_len, temperature=1.0, with_entropy=False, entropy_grad=False):
    """(logprobs, entropy): log softmax(logits / T)[answer token] of every answer token (B, A), A = seq.shape[1] -
    prompt_len, with every gradient, and its entropy if asked (with its gradient where `entropy_grad`: an
    entropy bonus), else None. The logits are
    `answer_logits`'; where `fused_output_layer` allows, the answers' final hidden states go through
    `linear_logprobs` instead, so the (B, A, V) logits are never held."""
    from utils.rl.head_logprobs import linear_logprobs
    from utils.rl.tokens import entropy_from_logits, logprobs_from_logits

    labels = seq[:, prompt_len:]
    head = fused_output_layer(model)
    if head is None:
        logits = answer_logits(model, seq, attention_mask, prompt_len)
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature) \
            if with_entropy else None
        return logprobs_from_logits(logits, labels, temperature), entropy
    with final_hidden_states(head):
        hidden = answer_logits(model, seq, attention_mask, prompt_len)  # (B, A, H)
    logprobs, entropy = linear_logprobs(hidden.reshape(-1, hidden.shape[-1]), head.weight, labels.reshape(-1),
                                        temperature, with_entropy)
    if entropy is not None:
        entropy = (entropy if entropy_grad else entropy.detach()).view(labels.shape)
    return logprobs.view(labels.shape), entropy


def answer_sequence_logprobs(model, input_ids, attention_mask, answer_mask):
    """log pi(y|x) of each row (B,): `utils.rl.tokens.sequence_logprobs` of the model's logits on input_ids;
    where `fused_output_layer` allows, through `linear_logprobs` on the answer positions' hidden states only."""
    from utils.rl.head_logprobs import linear_logprobs
    from utils.rl.tokens import sequence_logprobs

    head = fused_output_layer(model)
    forward = dict(input_ids=input_ids, use_cache=False,
                   **model_forward_kwargs(getattr(model, "module", model), attention_mask))
    if head is None:
        return sequence_logprobs(model(**forward).logits, input_ids, answer_mask)
    if answer_mask.shape != (input_ids.shape[0], input_ids.shape[1] - 1):
        raise ValueError(f"answer_mask {tuple(answer_mask.shape)} must be (B, T - 1) for input_ids "
                         f"{tuple(input_ids.shape)}")
    with final_hidden_states(head):
        hidden = model(**forward).logits[:, :-1]  # (B, T - 1, H)
    where = answer_mask > 0
    logprobs, _ = linear_logprobs(hidden[where], head.weight, input_ids[:, 1:][where])
    rows = where.nonzero()[:, 0]
    return logprobs.new_zeros(input_ids.shape[0]).index_add(0, rows, logprobs * answer_mask[where].to(logprobs.dtype))


def causal_lm_loss(model, batch):
    """A causal LM's loss on a batch with `labels` (-100: not scored), as Hugging Face's forward computes it: the
    mean over scored positions of - log p(labels[t + 1] | tokens <= t). Where `fused_output_layer` allows, the
    scored positions' hidden states go through `linear_nll`, the rest never reach the output layer."""
    from utils.rl.head_logprobs import linear_nll

    head = fused_output_layer(model)
    if head is None:
        return model(**batch, use_cache=False).loss
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with final_hidden_states(head):
        hidden = model(**inputs, use_cache=False).logits[:, :-1]  # (B, T - 1, H)
    labels = batch["labels"][:, 1:]
    scored = labels != -100
    return linear_nll(hidden[scored], head.weight, labels[scored])
