"""Comparing models on the same prompts: their answers, a checker's scores (the built-in task's, or a reasoning-gym
spec's verifier), an optional reward.

`evaluate_models` serves the step-1 prompt evaluation (baseline vs fine-tuned), the step-3 comparison and the
quick start; `format_side_by_side`, `format_score_table` and `format_answer_stats` print what it returns.
Beside each score it measures what the answers are (`answer_stats`): how many distinct ones, how often the most
frequent, how many were cut at the token limit, and the score of the best constant answer, so that a gain made
by answering one thing to every question shows.
"""
import json
import time
from collections import Counter
from pathlib import Path

from inference.generation import generate, load_causal_lm
from inference.tool_rollout import tool_stats
from utils.data import builtin_task as task
from utils.data.data_utils import get_raw_dataset
from utils.data.prompting import model_prompt
from utils.data.raw_datasets import builtin_data_dir
from utils.data.reasoning_gym_data import gym_data
from utils.data.text_files import check_text, json_records, json_value, read_lines
from utils.rl.reward_fns import call_reward_fn
from utils.runtime.args import BATCH_SIZE
from utils.runtime.errors import DataError

DECODINGS = ("sampled", "greedy")
REFERENCE_CANDIDATES = 100
"""The most frequent reference answers of a group tried as its constant answer (bounds the checker calls)."""
MODEL_CANDIDATES = 3
"""The model's own most frequent answers of a group, also tried as its constant answer."""
COLLAPSED_SHARE = 0.5
"""A model whose most frequent answer in a group is at least this share of its answers there "gives mostly one
answer" (format_answer_stats warns when it then scores no better than a constant answer)."""
ALIKE_SHARE = 0.9
"""A model whose answers in a group earn, on at least this share of them, what the group's best constant answer
earns on the same question answers as that one answer would, however each is worded ("The letter appears 1 time
in ..." to every counting question): scored as a constant answer too."""


class Checker:
    """A checker of held-out answers: `checker(prompts, answers) -> {"all": mean score, <group>: mean, ...}`, and
    `key(prompt) -> (group, reference answer or None)`, each question's group and reference answer (what
    `answer_stats` tries as constant answers; None: no groups); `scores(prompts, answers)`, each answer's score
    (`score`: a function that gives them at once; else one summary per answer). A plain function
    `(prompts, answers) -> {"all": ...}` serves as a checker too, without groups or references."""

    def __init__(self, summarize, key, score=None):
        self.summarize, self.key, self.score = summarize, key, score

    def __call__(self, prompts, answers):
        return self.summarize(prompts, answers)

    def scores(self, prompts, answers):
        if self.score is not None:
            return [float(value) for value in self.score(prompts, answers)]
        return [float(self.summarize([prompt], [answer])["all"]) for prompt, answer in zip(prompts, answers)]


def answer_scores(checker, prompts, answers):
    """Each answer's score by `checker` (a Checker, or a plain function: one call per answer)."""
    return (checker if isinstance(checker, Checker) else Checker(checker, None)).scores(prompts, answers)


def reward_fn_checker(reward_fn, name, key=None):
    """A reward function (`--reward_fn name`) as a checker: {"all": the mean of its scores}, each call checked
    (utils/rl/reward_fns.call_reward_fn), the questions grouped by `key` (a data checker's, or None): what scores
    the user's data where no task checker does."""
    def scores(prompts, answers):
        return call_reward_fn(reward_fn, name, prompts, answers).tolist()

    return Checker(lambda prompts, answers: {"all": sum(scores(prompts, answers)) / len(answers)}, key, scores)


BUILTIN_CHECKER = Checker(task.summarize_scores, task.parse_prompt,
                          lambda prompts, answers: list(map(task.score_answer, prompts, answers)))
"""The built-in task's checker: groups its skills, references the expected values."""


def gym_checker(verifier):
    """A reasoning-gym verifier's checker: groups its tasks, references the questions' answers (None for a task
    whose questions accept any valid solution)."""
    def key(prompt):
        item = verifier.item(prompt)
        return item.task, item.answer

    return Checker(verifier.summarize, key, verifier.score)


def builtin_prompts():
    """The built-in task's held-out prompts (skills in turn, so any first N are balanced)."""
    return [record["prompt"] for record in task.heldout_prompts(builtin_data_dir())]


def has_checker(data_paths):
    """Whether the held-out questions of the data are scored by a checker of their own (heldout_set): the built-in
    task's, or reasoning-gym tasks' verifiers. None: the default data, `builtin`."""
    return all(path == "builtin" or path.startswith("reasoning_gym:") for path in data_paths or ["builtin"])


def heldout_set(data_paths, seed=1234, columns=None):
    """(prompts, checker) of the held-out questions of one or more data paths. `builtin`: the built-in task's
    held-out prompts, checker None (evaluate_models' default, BUILTIN_CHECKER: keys "all" and per skill);
    a `reasoning_gym:` spec: its held-out part, tasks in turn, checker its verifier's (gym_checker: keys "all" and
    per task); any other source: the prompts of its eval split (never trained on), no checker (a reward model
    scores them; its columns renamed by `columns`: utils.data.data_utils.get_raw_dataset). With several paths the
    prompts are concatenated and only a lone reasoning-gym spec's checker is kept."""
    if isinstance(data_paths, str):
        data_paths = [data_paths]
    prompts, checkers = [], []
    for data_path in data_paths:
        if data_path == "builtin":
            prompts += builtin_prompts()
        elif data_path.startswith("reasoning_gym:"):

            data = gym_data(data_path)
            prompts += [item.prompt for item in data.parts["heldout"]]
            checkers.append(gym_checker(data.verifier))
        else:

            raw = get_raw_dataset(data_path, seed, columns)
            rows = raw.get_eval_data()
            found = [raw.get_prompt(row) for row in rows] if rows is not None else []
            found = [prompt for prompt in found if prompt]
            if not found:
                raise DataError(f"--data_path {data_path} has no eval prompts to evaluate on")
            prompts += found
    checker = checkers[0] if len(data_paths) == 1 and checkers else None
    return prompts, checker


def gym_validation_prompts(data_paths):
    """The prompts of the eval parts of reasoning-gym specs (each spec's tasks in turn): questions no step trains on
    and the closing evaluation never reads, whole whatever --data_split gives each step; None unless every data
    path is such a spec (other data's steps have their own eval splits)."""
    data_paths = [data_paths] if isinstance(data_paths, str) else list(data_paths or ["builtin"])
    if not all(path.startswith("reasoning_gym:") for path in data_paths):
        return None
    return [item.prompt for path in data_paths for item in gym_data(path).parts["eval"]]


def validation_set(data_paths, seed=1234):
    """(prompts, checker) of questions with a checker of their own that no step trains on and the closing
    evaluation never reads: a reasoning-gym spec's eval part (gym_validation_prompts), the built-in task's eval
    split; None for other data and for several data paths (heldout_set keeps a checker for one spec alone)."""
    data_paths = [data_paths] if isinstance(data_paths, str) else list(data_paths or ["builtin"])
    if data_paths == ["builtin"]:
        raw = get_raw_dataset("builtin", seed)
        prompts = [prompt for prompt in map(raw.get_prompt, raw.get_eval_data()) if prompt]
        return (prompts, None) if prompts else None  # None: evaluate_models' built-in checker
    prompts = gym_validation_prompts(data_paths) if len(data_paths) == 1 else None
    return (prompts, heldout_set(data_paths)[1]) if prompts else None


def read_prompts_file(path):
    """Prompts from a file: JSON lines with a string field `prompt` (other fields ignored), a JSON array of such
    objects, or plain text with one prompt per line. Each prompt is used verbatim (write it formatted, e.g.
    " Human: ... Assistant:"); blank lines are skipped. The file is JSON lines when its first non-blank line starts
    with `{`, a JSON array when it starts with `[` then `{`, `]` or nothing (a text prompt may start `[INST]`)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"prompts file {path} is a folder, not a file")
    if not path.exists():
        raise DataError(f"prompts file {path} does not exist")
    # UTF-8 only (a byte-order mark is not part of the first prompt), a line at a time; lines end at "\n" only
    # (str.splitlines would also split at U+2028, U+0085... inside a prompt).
    lines = [(number, line) for number, line in read_lines(path, f"prompts file {path}") if line.strip()]
    if not lines:
        raise DataError(f"prompts file {path} has no prompts")
    start = lines[0][1].lstrip()
    if start.startswith("[") and start[1:].lstrip()[:1] in ("", "{", "]"):
        records = [(value, f"{path} {where}") for value, where in json_records(path, f"prompts file {path}")]
    elif start.startswith("{"):
        records = []
        for number, line in lines:
            try:
                records.append((json_value(line, f"{path} line {number}"), f"{path} line {number}"))
            except json.JSONDecodeError as err:
                raise DataError(f"{path} line {number}: not valid JSON ({err.msg})") from None
    else:
        return [line for _, line in lines]
    prompts = []
    for record, where in records:
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"].strip():
            raise DataError(f"{where}: no non-empty string field 'prompt'")
        prompts.append(check_text(record["prompt"], f"{where}: field 'prompt'"))
    if not prompts:
        raise DataError(f"prompts file {path} has no prompts")
    return prompts


def fit_prompts_to_context(prompts, tokenizer, context, max_new_tokens, flag):
    """The held-out `prompts` as they fit a model's `context` positions with `max_new_tokens` (`flag`'s) for the
    answer: a dialogue's earliest turns dropped first, as training fits its rows (utils.data.data_utils.fit_prompt);
    a prompt whose last turn alone does not fit is left out. Both counts are said; a DataError if none fits."""
    from utils.data.data_utils import SampleCounter, fit_prompt

    if context is None or max_new_tokens >= context:
        return prompts  # unbounded, or refused by the generation with its own message
    counter, fitted = SampleCounter("held-out prompts"), []
    for prompt in prompts:
        fit = fit_prompt(tokenizer, prompt, max_new_tokens, flag, context, counter)
        if fit is None:
            counter.skip_too_long(f"longer than the context ({context}) less {flag}")
        else:
            counter.kept += 1
            fitted.append(fit[0])
    if counter.trimmed or counter.skipped:
        print(counter.summary(), flush=True)
    if not fitted:
        raise DataError(f"no held-out prompt fits the context of {context} positions with {flag} {max_new_tokens}; "
                        f"give a smaller {flag}")
    return fitted


def are_task_prompts(prompts):
    """Whether every prompt is one of the built-in task's, so the checker can score the answers."""
    try:
        for prompt in prompts:
            task.parse_prompt(prompt)
    except ValueError:
        return False
    return bool(prompts)


def evaluate_models(model_specs, prompts, max_new_tokens=16, temperature=1.0, top_p=1.0, greedy_only=False,
                    seed=1234, batch_size=BATCH_SIZE, reward_fn=None, dtype="fp32", trust_remote_code=False,
                    samples_per_prompt=1, checker=None, tools=None):
    """Answer `prompts` with each model and score the answers.

    model_specs: {name: model folder or built-in name, or an already loaded (model, tokenizer)}; models given
    by path are loaded one at a time and released before the next.
    Decodings: "sampled" (at `temperature`, `top_p`, seeded with `seed`, the same for every model) and
    "greedy"; `greedy_only` keeps greedy alone. The sampled decoding answers every prompt `samples_per_prompt`
    times, in as many rounds over the prompts (answer i of the list answers prompt i % len(prompts)), and its
    scores are means over all of them: a sampled score from one answer per prompt is noisy.
    reward_fn: optional `reward_fn(prompts, answers) -> list[float]` (e.g. a step-2 reward model); the mean
    is reported as "reward".
    checker: optional `checker(prompts, answers) -> {"all": mean score, <group>: mean, ...}`, best a Checker
    (gym_checker: a reasoning-gym verifier's, grouped by task); by default BUILTIN_CHECKER when every prompt is a
    built-in task prompt ({"all": mean checker score, "add": ..., per skill present}).

    tools: a utils.runtime.tool_format.ToolUse: the answers are multi-turn, with tool calls (inference/tool_rollout.py),
    scored on their final answer (the text after the last tool output); each decoding's scores add TOOL_FIGURES:
    the score of answers from the same decoding without the tool ("all_without_tools", "reward_without_tools"; one
    answer a prompt even when sampled: it only measures what the tool adds), and how often the tool was called and
    ran cleanly.

    Returns {name: {"sampled": scores, "greedy": scores, "answers": {"sampled": [...], "greedy": [...]},
    "answer_stats": {"sampled": stats, "greedy": stats}, "seconds": {"sampled": s, "greedy": s}}}, where scores
    is the checker's summary (or {} without a checker), plus "reward" when reward_fn is given, stats
    `answer_stats`' with "hit_limit", the answers cut at "max_new_tokens" before their EOS, and seconds each
    decoding's generation time.
    """
    decodings = ("greedy",) if greedy_only else DECODINGS
    rounds = {decoding: samples_per_prompt if decoding == "sampled" else 1 for decoding in decodings}
    if checker is None and are_task_prompts(prompts):
        checker = BUILTIN_CHECKER
    constant_scores = {}  # (group, answer) -> score, shared by every model and decoding
    results = {}
    for name, spec in model_specs.items():
        model, tokenizer = spec if isinstance(spec, tuple) else load_causal_lm(spec, dtype, trust_remote_code)
        model_prompts = [model_prompt(tokenizer, prompt) for prompt in prompts]
        answers, ended, calls, plain, seconds = {}, {}, {}, {}, {}
        for decoding in decodings:
            started = time.perf_counter()
            settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            greedy=decoding == "greedy", batch_size=batch_size, seed=seed)
            answers[decoding], ended[decoding], *made = generate(
                model, tokenizer, model_prompts * rounds[decoding], **settings, desc=f"{name} {decoding}",
                return_ended=True, tools=tools, return_calls=tools is not None)
            if tools is not None:
                calls[decoding] = made[0]
                plain[decoding] = generate(model, tokenizer, model_prompts, **settings,
                                           desc=f"{name} {decoding} without tools")
            seconds[decoding] = time.perf_counter() - started
        del model, tokenizer  # a loaded model is freed before the next one (and before reward_fn runs)
        result = {"answer_stats": {}}
        for decoding in decodings:
            answered = prompts * rounds[decoding]
            final = answers[decoding] if tools is None else [tools.format.final_answer(a) for a in answers[decoding]]
            scores = dict(checker(answered, final)) if checker else {}
            if reward_fn is not None:
                rewards = [float(r) for r in reward_fn(answered, final)]
                scores["reward"] = sum(rewards) / len(rewards)
            if tools is not None:
                scores.update(tool_figures(prompts, [tools.format.final_answer(a) for a in plain[decoding]],
                                           calls[decoding], checker, reward_fn))
            result[decoding] = scores
            stats = answer_stats(prompts, final, checker, constant_scores)
            result["answer_stats"][decoding] = {**stats, "hit_limit": ended[decoding].count(False),
                                                "max_new_tokens": max_new_tokens}
        result["answers"], result["seconds"] = answers, seconds
        results[name] = result
    return results


TOOL_FIGURES = ("all_without_tools", "reward_without_tools", "tool_calls", "tool_call_rate", "tool_success_rate")
"""What an evaluation with --tools adds to each decoding's scores (evaluate_models)."""


def tool_figures(prompts, answers_without_tools, calls, checker, reward_fn):
    """TOOL_FIGURES of one decoding: the checker's "all" (and the mean reward) of the final answers written
    without the tool, and `inference.tool_rollout.tool_stats` of the (calls, clean runs) of the answers with it."""
    figures = {}
    if checker:
        figures["all_without_tools"] = checker(prompts, answers_without_tools)["all"]
    if reward_fn is not None:
        rewards = [float(r) for r in reward_fn(prompts, answers_without_tools)]
        figures["reward_without_tools"] = sum(rewards) / len(rewards)
    return {**figures, **tool_stats([c for c, _ in calls], [s for _, s in calls])}


def answer_stats(prompts, answers, checker=None, constant_scores=None):
    """What the answers are, per group of questions ("all", then each group of checker.key) and overall:

        distinct_answers     how many different answers (compared stripped)
        top_answer           the most frequent answer (the first given, on a tie)
        top_answer_share     the fraction of the answers that are top_answer
        best_constant        the mean score of the best constant answer: one answer given to every question of the
                             group, scored by `checker`; tried are the group's reference answers (its
                             REFERENCE_CANDIDATES most frequent) and the model's MODEL_CANDIDATES most frequent
                             answers of it; "all": the best one answer to every question, among each group's best
                             MODEL_CANDIDATES constants and the model's most frequent answers
        best_constant_answer that answer
        scored_as_constant   the share of the answers that earn what best_constant_answer earns on their question,
                             the lesser of that share on the questions where that answer earns more than its least
                             and on the others: at least ALIKE_SHARE, the model answers as that one answer would,
                             however worded (0 where that answer earns the same on every question: agreeing with
                             it tells nothing; and a model that fails where the constant answer earns is not one)
        pass_at_k            the share of the questions that at least one of their k answers (k: the rounds)
                             solves, scored 1 by a task's `checker` (one with `key`): with k > 1, what sampling
                             finds and RL can reinforce (a greedy decoding's pass@1 is its share of full marks)
        k                    the answers per question
        answers              how many answers

    `answers` answer `prompts` in rounds (answer i answers prompt i % len(prompts)). Without a checker there is
    no best constant; a checker without `key` has the group "all" alone and no references. `constant_scores`: a
    dict caching (group, answer) -> score across calls on the same prompts."""
    constant_scores = {} if constant_scores is None else constant_scores
    key = getattr(checker, "key", None)
    keys = [key(prompt) for prompt in prompts] if key else [("all", None)] * len(prompts)
    groups = {"all": list(range(len(prompts)))}
    if key:
        for index, (group, _) in enumerate(keys):
            groups.setdefault(group, []).append(index)
    stats = {name: {} for name in ("best_constant", "best_constant_answer", "distinct_answers", "top_answer",
                                   "top_answer_share")}
    frequent = {}
    for group, indices in groups.items():
        members = set(indices)
        given = Counter(answer.strip() for i, answer in enumerate(answers) if i % len(prompts) in members)
        (top, top_count), = given.most_common(1)
        stats["distinct_answers"][group] = len(given)
        stats["top_answer"][group] = top
        stats["top_answer_share"][group] = top_count / sum(given.values())
        frequent[group] = [answer for answer, _ in given.most_common(MODEL_CANDIDATES)]
    rounds = len(answers) // len(prompts)
    if checker is None:
        del stats["best_constant"], stats["best_constant_answer"]
        return {**stats, "k": rounds, "answers": len(answers)}
    scores = answer_scores(checker, [prompts[i % len(prompts)] for i in range(len(answers))], answers)
    if key:  # a task's checker, scores in [0, 1] (a plain function's scale is its own)
        solved = [False] * len(prompts)
        for i, value in enumerate(scores):
            solved[i % len(prompts)] = solved[i % len(prompts)] or value >= 1.0
        stats["pass_at_k"] = {group: sum(solved[i] for i in indices) / len(indices)
                              for group, indices in groups.items()}

    def score(group, answer):
        if (group, answer) not in constant_scores:
            group_prompts = [prompts[i] for i in groups[group]]
            constant_scores[group, answer] = float(checker(group_prompts, [answer] * len(group_prompts))["all"])
        return constant_scores[group, answer]

    best_of_groups = []
    for group in [group for group in groups if group != "all"] + (["all"] if len(groups) == 1 else []):
        references = Counter(keys[i][1] for i in groups[group] if keys[i][1] is not None)
        candidates = dict.fromkeys([answer for answer, _ in references.most_common(REFERENCE_CANDIDATES)]
                                   + frequent[group])
        ranked = sorted(candidates, key=lambda answer: -score(group, answer))  # stable: the first on a tie
        stats["best_constant"][group], stats["best_constant_answer"][group] = score(group, ranked[0]), ranked[0]
        best_of_groups += ranked[:MODEL_CANDIDATES]
    if len(groups) > 1:
        candidates = list(dict.fromkeys(best_of_groups + frequent["all"]))
        best = max(candidates, key=lambda answer: score("all", answer))
        stats["best_constant"]["all"], stats["best_constant_answer"]["all"] = score("all", best), best
    stats["scored_as_constant"] = {}
    for group, indices in groups.items():
        constant = answer_scores(checker, [prompts[i] for i in indices],
                                 [stats["best_constant_answer"][group]] * len(indices))
        earns, least = dict(zip(indices, constant)), min(constant)
        shares = []
        for hit in (True, False):  # where the constant answer earns more than its least, and where it does not
            alike = [value == earns[i % len(prompts)] for i, value in enumerate(scores)
                     if i % len(prompts) in earns and (earns[i % len(prompts)] > least) == hit]
            shares.append(sum(alike) / len(alike) if alike else 0.0)
        stats["scored_as_constant"][group] = min(shares)  # 0 where it earns the same everywhere: no hit to agree on
    stats = {name: {group: values[group] for group in groups if group in values} for name, values in stats.items()}
    return {**stats, "k": rounds, "answers": len(answers)}


def answer_scalars(stats):
    """answer_stats' figures over all the questions, as numbers (for TensorBoard and step 3's evaluations):
    best_constant and scored_as_constant (with a checker), distinct_answers, top_answer_share, hit_limit."""
    scalars = {name: stats[name]["all"] for name in ("best_constant", "scored_as_constant", "distinct_answers",
                                                     "top_answer_share") if name in stats}
    return {**scalars, "hit_limit": stats["hit_limit"]}


def scores_as_a_constant(score, stats, group="all"):
    """True when the answers to `group`'s questions are mostly one answer (top_answer_share at least
    COLLAPSED_SHARE) or score as one answer would (scored_as_constant at least ALIKE_SHARE), and `score` is no
    better than the best constant answer's: the score is what answering one thing earns, not the skill
    (format_answer_stats, the pipeline's report). A constant answer that earns nothing explains no score (sudoku,
    graph_color: 0 scored as 0 is no collapse to warn of)."""
    constant = stats.get("best_constant", {}).get(group)
    return (score is not None and constant is not None and 0 < constant and score <= constant
            and (stats["top_answer_share"][group] >= COLLAPSED_SHARE
                 or stats.get("scored_as_constant", {}).get(group, 0.0) >= ALIKE_SHARE))


def constant_likeness(stats, group="all"):
    """How the answers to `group`'s questions are one answer, in words: the share that is the most frequent one,
    or (answers worded differently) the share that earns what the best constant answer earns."""
    if stats["top_answer_share"][group] >= COLLAPSED_SHARE:
        return f"{stats['top_answer_share'][group]:.0%} of the answers are {stats['top_answer'][group]!r}"
    return (f"{stats['scored_as_constant'][group]:.0%} of the answers earn what "
            f"{stats['best_constant_answer'][group]!r} earns on their question")


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


def format_answer_stats(results):
    """Per model, decoding and group: the score beside the best constant answer's, the distinct answers, the share
    of the most frequent one, and the answers cut at the token limit; then a WARNING line for each model and
    decoding that mostly gives one answer (COLLAPSED_SHARE) and scores no better than the best constant answer in
    some group: its score is what answering one thing earns ("" when no result has answer_stats)."""
    rows = [(name, decoding, result[decoding], result["answer_stats"][decoding])
            for name, result in results.items() for decoding in DECODINGS if decoding in result.get("answer_stats", {})]
    if not rows:
        return ""
    name_width = max(len("model"), *(len(name) for name, *_ in rows))
    lines = [f"{'model':{name_width}}  {'decoding':8}  {'group':12}  {'score':>6}  {'best constant':>22}  "
             f"{'distinct':>8}  {'top answer':>22}  {'cut':>5}"]
    warnings = []
    for name, decoding, scores, stats in rows:
        collapsed = []
        for group, distinct in stats["distinct_answers"].items():
            score = scores.get(group)
            constant = stats.get("best_constant", {}).get(group)
            constant_cell = "-" if constant is None else \
                f"{constant:.3f} {_shorten(repr(stats['best_constant_answer'][group]), 14)}"
            top_cell = f"{stats['top_answer_share'][group]:.0%} {_shorten(repr(stats['top_answer'][group]), 14)}"
            cut = f"{stats['hit_limit']:5d}" if group == "all" else f"{'':5}"
            lines.append(f"{name:{name_width}}  {decoding:8}  {_shorten(group, 12):12}  "
                         f"{'-' if score is None else f'{score:.3f}':>6}  {constant_cell:>22}  {distinct:8d}  "
                         f"{top_cell:>22}  {cut}")
            if scores_as_a_constant(score, stats, group):
                collapsed.append(f"{group} {score:.3f} (answering {stats['best_constant_answer'][group]!r} to every "
                                 f"question: {constant:.3f})")
        if collapsed:
            warnings.append(f"WARNING: {name} {decoding} answers mostly as one answer would and scores no better "
                            f"than a constant answer on: {', '.join(collapsed)}")
    return "\n".join(lines + warnings)


def _shorten(text, width):
    """One line of at most `width` characters, control characters escaped (a newline shows as \\n)."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return text if len(text) <= width else text[:width - 3] + "..."
