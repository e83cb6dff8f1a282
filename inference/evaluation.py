"""Comparing models on the same prompts: their answers, a checker's scores (the built-in task's, or a reasoning-gym
spec's verifier), an optional reward.

`evaluate_models` serves the step-1 prompt evaluation (baseline vs fine-tuned), the step-3 comparison and the
quick start; `format_side_by_side` and `format_score_table` print what it returns.
"""
import json
from pathlib import Path

from inference.generation import generate, load_causal_lm
from utils.data import builtin_task as task
from utils.data.data_utils import get_raw_dataset
from utils.data.prompting import model_prompt
from utils.data.raw_datasets import builtin_data_dir
from utils.data.reasoning_gym_data import gym_data
from utils.runtime.errors import DataError

DECODINGS = ("sampled", "greedy")


def builtin_prompts():
    """The built-in task's held-out prompts (skills in turn, so any first N are balanced)."""
    return [record["prompt"] for record in task.heldout_prompts(builtin_data_dir())]


def has_checker(data_paths):
    """Whether the held-out questions of the data are scored by a checker of their own (heldout_set): the built-in
    task's, or reasoning-gym tasks' verifiers. None: the default data, `builtin`."""
    return all(path == "builtin" or path.startswith("reasoning_gym:") for path in data_paths or ["builtin"])


def heldout_set(data_paths, seed=1234):
    """(prompts, checker) of the held-out questions of one or more data paths. `builtin`: the built-in task's
    held-out prompts, checker None (evaluate_models' default, `task.summarize_scores`: keys "all" and per skill);
    a `reasoning_gym:` spec: its held-out part, tasks in turn, checker its verifier's `summarize` (keys "all" and
    per task); any other source: the prompts of its eval split (never trained on), no checker (a reward model
    scores them). With several paths the prompts are concatenated and only a lone reasoning-gym spec's checker
    is kept."""
    if isinstance(data_paths, str):
        data_paths = [data_paths]
    prompts, checkers = [], []
    for data_path in data_paths:
        if data_path == "builtin":
            prompts += builtin_prompts()
        elif data_path.startswith("reasoning_gym:"):

            data = gym_data(data_path)
            prompts += [item.prompt for item in data.parts["heldout"]]
            checkers.append(data.verifier.summarize)
        else:

            raw = get_raw_dataset(data_path, seed)
            rows = raw.get_eval_data()
            found = [raw.get_prompt(row) for row in rows] if rows is not None else []
            found = [prompt for prompt in found if prompt]
            if not found:
                raise DataError(f"--data_path {data_path} has no eval prompts to evaluate on")
            prompts += found
    checker = checkers[0] if len(data_paths) == 1 and checkers else None
    return prompts, checker


def read_prompts_file(path):
    """Prompts from a file: JSON lines with a string field `prompt` (other fields ignored), or plain text with
    one prompt per line. Each prompt is used verbatim (write it formatted, e.g. " Human: ... Assistant:");
    blank lines are skipped. The file is JSON lines when its first non-blank line starts with `{`."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"prompts file {path} is a folder, not a file")
    if not path.is_file():
        raise DataError(f"prompts file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the first prompt
    except UnicodeDecodeError as err:
        raise DataError(f"prompts file {path} is not UTF-8 text (byte {err.start})") from None
    # Lines end at "\n" only (str.splitlines would also split at U+2028, U+0085... inside a prompt).
    lines = [(number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), 1)]
    lines = [(number, line) for number, line in lines if line.strip()]
    if not lines:
        raise DataError(f"prompts file {path} has no prompts")
    if not lines[0][1].lstrip().startswith("{"):
        return [line for _, line in lines]
    prompts = []
    for number, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path} line {number}: not valid JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"].strip():
            raise DataError(f"{path} line {number}: no non-empty string field 'prompt'")
        prompts.append(record["prompt"])
    return prompts


def are_task_prompts(prompts):
    """Whether every prompt is one of the built-in task's, so the checker can score the answers."""
    try:
        for prompt in prompts:
            task.parse_prompt(prompt)
    except ValueError:
        return False
    return bool(prompts)


def evaluate_models(model_specs, prompts, max_new_tokens=16, temperature=1.0, top_p=1.0, greedy_only=False,
                    seed=1234, batch_size=32, reward_fn=None, dtype="fp32", trust_remote_code=False,
                    samples_per_prompt=1, checker=None):
    """Answer `prompts` with each model and score the answers.

    model_specs: {name: model folder or built-in name, or an already loaded (model, tokenizer)}; models given
    by path are loaded one at a time and released before the next.
    Decodings: "sampled" (at `temperature`, `top_p`, seeded with `seed`, the same for every model) and
    "greedy"; `greedy_only` keeps greedy alone. The sampled decoding answers every prompt `samples_per_prompt`
    times, in as many rounds over the prompts (answer i of the list answers prompt i % len(prompts)), and its
    scores are means over all of them: a sampled score from one answer per prompt is noisy.
    reward_fn: optional `reward_fn(prompts, answers) -> list[float]` (e.g. a step-2 reward model); the mean
    is reported as "reward".
    checker: optional `checker(prompts, answers) -> {"all": mean score, <group>: mean, ...}` (e.g. a reasoning-gym
    verifier's `summarize`, grouped by task); by default `task.summarize_scores` when every prompt is a built-in
    task prompt ({"all": mean checker score, "add": ..., per skill present}).

    Returns {name: {"sampled": scores, "greedy": scores, "answers": {"sampled": [...], "greedy": [...]}}},
    where scores is the checker's summary (or {} without a checker), plus "reward" when reward_fn is given.
    """
    decodings = ("greedy",) if greedy_only else DECODINGS
    rounds = {decoding: samples_per_prompt if decoding == "sampled" else 1 for decoding in decodings}
    if checker is None and are_task_prompts(prompts):
        checker = task.summarize_scores
    results = {}
    for name, spec in model_specs.items():
        model, tokenizer = spec if isinstance(spec, tuple) else load_causal_lm(spec, dtype, trust_remote_code)
        model_prompts = [model_prompt(tokenizer, prompt) for prompt in prompts]
        answers = {decoding: generate(model, tokenizer, model_prompts * rounds[decoding],
                                      max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                      greedy=decoding == "greedy", batch_size=batch_size, seed=seed,
                                      desc=f"{name} {decoding}")
                   for decoding in decodings}
        del model, tokenizer  # a loaded model is freed before the next one (and before reward_fn runs)
        result = {}
        for decoding in decodings:
            answered = prompts * rounds[decoding]
            scores = dict(checker(answered, answers[decoding])) if checker else {}
            if reward_fn is not None:
                rewards = [float(r) for r in reward_fn(answered, answers[decoding])]
                scores["reward"] = sum(rewards) / len(rewards)
            result[decoding] = scores
        result["answers"] = answers
        results[name] = result
    return results


def format_side_by_side(prompts, results, num_show=8, width=28):
    """The first `num_show` prompts with each model's answer(s) side by side, one row per decoding."""
    names = list(results)
    decodings = [d for d in DECODINGS if d in results[names[0]]["answers"]]
    header = f"{'':8} | " + " | ".join(f"{name:{width}}" for name in names)
    lines = [header, "-" * len(header)]
    for index, prompt in enumerate(prompts[:num_show]):
        lines.append(f"prompt {index}: {_shorten(prompt.strip(), 2 * width + 20)}")
        for decoding in decodings:
            answers = [_shorten(results[name]["answers"][decoding][index], width) for name in names]
            lines.append(f"{decoding:8} | " + " | ".join(f"{answer:{width}}" for answer in answers))
    return "\n".join(lines)


def format_score_table(results):
    """Mean scores per model and decoding: "all", each skill or task, and "reward" when present ("" if no
    scores). Columns come in the order of the scores, "reward" last."""
    rows = [(name, decoding, scores) for name, result in results.items()
            for decoding in DECODINGS if decoding in result for scores in [result[decoding]]]
    columns = list(dict.fromkeys(key for _, _, scores in rows for key in scores if key != "reward"))
    columns += ["reward"] if any("reward" in scores for _, _, scores in rows) else []
    if not columns:
        return ""
    name_width = max(len("model"), *(len(name) for name, _, _ in rows))
    widths = {c: max(7, len(c)) for c in columns}
    lines = [f"{'model':{name_width}}  {'decoding':8}  " + "  ".join(f"{c:>{widths[c]}}" for c in columns)]
    for name, decoding, scores in rows:
        cells = [f"{scores[c]:{widths[c]}.3f}" if c in scores else f"{'-':>{widths[c]}}" for c in columns]
        lines.append(f"{name:{name_width}}  {decoding:8}  " + "  ".join(cells))
    return "\n".join(lines)


def _shorten(text, width):
    """One line of at most `width` characters, control characters escaped (a newline shows as \\n)."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return text if len(text) <= width else text[:width - 3] + "..."
