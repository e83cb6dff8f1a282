"""The built-in offline task: a four-skill preference data set that a ~1M-parameter model learns in minutes.

Skills (drawn uniformly), in DeepSpeed-Chat's prompt format `" Human: <question> Assistant:"`:

- add:     `What is 7 + 12?`                      -> ` 19`      (a, b in 0..19; 80 of the 400 pairs held out)
- reverse: `Reverse the word "cat".`              -> ` tac`     (random lowercase 3-5 letter strings)
- capital: `What is the capital of France?`       -> ` Paris`   (30 countries x 3 phrasings; 20 held out)
- upper:   `Say "apple" in uppercase.`            -> ` APPLE`   (random lowercase 3-6 letter strings)

Answers start with a single space and are just the value. The held-out split (used by evaluation only) is
fixed forever: it is chosen by a stable hash (zlib.crc32 with a fixed salt), never by the data seed, and
never by Python's salted `hash()`. A string and its reversal always fall in the same split, so the answer
to a held-out reversal is never a training string either.

The checker `score_answer` parses any prompt of these skills and scores an answer
(1 exact, 0.5 near miss, 0.25 right format only, 0 otherwise); see its docstring for the precise rules.

`write_builtin_data` writes the data set once (atomically) to a directory:
train.json / eval.json (JSON lines of {"prompt", "chosen", "rejected"}), heldout.json (JSON lines of
{"prompt", "skill", "answer"}), unsup.txt (one plain-text document per line) and meta.json.
Its design (four skills, hard negatives, held-out items, chosen answers right 70% of the time) is the one
docs/quickstart-results.md measures.
"""
import json
import os
import random
import re
import shutil
import string
import zlib
from pathlib import Path
from typing import Iterator

from utils.data.prompting import text_prompt as format_prompt  # a question in DeepSpeed-Chat's text form
from utils.runtime.paths import make_temp_dir_beside

TASK_VERSION = 2
"""Bump when the generated data changes for a given seed; it is recorded in meta.json."""

SKILLS = ("add", "reverse", "capital", "upper")

HELDOUT_SALT = "chatrlhf-task-heldout-v1"
"""The fixed internal 'seed' of the held-out split. Independent of the data seed: never change it."""

COUNTRIES = {
    "Austria": "Vienna",
    "Canada": "Ottawa",
    "Chile": "Santiago",
    "China": "Beijing",
    "Cuba": "Havana",
    "Denmark": "Copenhagen",
    "Egypt": "Cairo",
    "Finland": "Helsinki",
    "France": "Paris",
    "Germany": "Berlin",
    "Greece": "Athens",
    "Hungary": "Budapest",
    "Iceland": "Reykjavik",
    "Indonesia": "Jakarta",
    "Iran": "Tehran",
    "Ireland": "Dublin",
    "Italy": "Rome",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
    "Peru": "Lima",
    "Poland": "Warsaw",
    "Portugal": "Lisbon",
    "Russia": "Moscow",
    "Spain": "Madrid",
    "Sweden": "Stockholm",
    "Thailand": "Bangkok",
    "Turkey": "Ankara",
    "Ukraine": "Kyiv",
    "Vietnam": "Hanoi",
}
"""Country -> capital: 30 real pairs, one ASCII word each."""

CAPITAL_TEMPLATES = (
    "What is the capital of {country}?",
    "Name the capital city of {country}.",
    "Which city is the capital of {country}?",
)

NUM_HELDOUT_ADD_PAIRS = 80
NUM_HELDOUT_CAPITAL_COMBOS = 20
HELDOUT_WORD_BUCKETS = 10
"""A string is held out when its stable hash is 0 modulo this, i.e. about 1 string in 10."""

NOT_KNOWN = " I don't know."

FILE_NAMES = ("train.json", "eval.json", "heldout.json", "unsup.txt", "meta.json")

# ----------------------------------------------------------------------------------------------------------
# Prompts and the fixed held-out split
# ----------------------------------------------------------------------------------------------------------


def add_question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def reverse_question(word: str) -> str:
    return f'Reverse the word "{word}".'


def capital_question(template_index: int, country: str) -> str:
    return CAPITAL_TEMPLATES[template_index].format(country=country)


def upper_question(word: str) -> str:
    return f'Say "{word}" in uppercase.'


def _stable_hash(text: str) -> int:
    """A hash that is the same in every process and Python version (unlike the salted built-in `hash`)."""
    return zlib.crc32(f"{HELDOUT_SALT}:{text}".encode("utf-8"))


def is_heldout_word(word: str) -> bool:
    """Whether a reverse/upper string belongs to the held-out split.

    The hash is taken of the smaller of the word and its reversal, so a word and its reversal share a split.
    """
    key = min(word, word[::-1])
    return _stable_hash(f"word:{key}") % HELDOUT_WORD_BUCKETS == 0


def _choose_heldout_add_pairs() -> tuple:
    """The 80 (a, b) pairs with the smallest stable hash: fixed forever, whatever the data seed."""
    pairs = [(a, b) for a in range(20) for b in range(20)]
    pairs.sort(key=lambda pair: _stable_hash(f"add:{pair[0]}+{pair[1]}"))
    return tuple(sorted(pairs[:NUM_HELDOUT_ADD_PAIRS]))


def _choose_heldout_capital_combos() -> tuple:
    """20 (template_index, country) combinations: one phrasing each of the 20 countries of smallest hash.

    Taking at most one phrasing per country keeps every country in training under two phrasings.
    """
    countries = sorted(COUNTRIES, key=lambda country: _stable_hash(f"capital:{country}"))
    chosen = countries[:NUM_HELDOUT_CAPITAL_COMBOS]
    combos = [(_stable_hash(f"template:{country}") % len(CAPITAL_TEMPLATES), country) for country in chosen]
    return tuple(sorted(combos))


HELDOUT_ADD_PAIRS = _choose_heldout_add_pairs()
TRAIN_ADD_PAIRS = tuple((a, b) for a in range(20) for b in range(20) if (a, b) not in HELDOUT_ADD_PAIRS)
HELDOUT_CAPITAL_COMBOS = _choose_heldout_capital_combos()
TRAIN_CAPITAL_COMBOS = tuple(
    sorted(
        (t, country)
        for t in range(len(CAPITAL_TEMPLATES))
        for country in COUNTRIES
        if (t, country) not in HELDOUT_CAPITAL_COMBOS
    )
)

# ----------------------------------------------------------------------------------------------------------
# The checker
# ----------------------------------------------------------------------------------------------------------

_PROMPT_RE = re.compile(r"\s*Human:\s*(?P<question>.*?)\s*Assistant:\s*", re.DOTALL)
_ADD_RE = re.compile(r"What is (\d+) \+ (\d+)\?")
_REVERSE_RE = re.compile(r'Reverse the word "([A-Za-z]+)"\.')
_UPPER_RE = re.compile(r'Say "([A-Za-z]+)" in uppercase\.')
_CAPITAL_RES = tuple(
    re.compile(re.escape(before) + r"([A-Za-z][A-Za-z .'-]*)" + re.escape(after))
    for before, after in (template.split("{country}") for template in CAPITAL_TEMPLATES)
)

_INTEGER_RE = re.compile(r"-?\d+")
_LOWER_WORD_RE = re.compile(r"[a-z]+")
_CAPITALISED_WORD_RE = re.compile(r"[A-Z][a-z]+")
_UPPER_WORD_RE = re.compile(r"[A-Z]+")


def parse_prompt(prompt: str) -> tuple[str, str]:
    """Return (skill, expected_answer) of a prompt of one of the four skills.

    The expected answer is the bare value, without the leading space (e.g. "19", "tac", "Paris", "APPLE").
    Whitespace around "Human:" and "Assistant:" is not significant. Raises ValueError for any other prompt,
    including a capital question about a country that is not in COUNTRIES.
    """
    match = _PROMPT_RE.fullmatch(prompt)
    if match is None:
        raise ValueError(f'not a " Human: ... Assistant:" prompt: {prompt!r}')
    question = match.group("question")
    if m := _ADD_RE.fullmatch(question):
        return "add", str(int(m.group(1)) + int(m.group(2)))
    if m := _REVERSE_RE.fullmatch(question):
        return "reverse", m.group(1)[::-1]
    if m := _UPPER_RE.fullmatch(question):
        return "upper", m.group(1).upper()
    for capital_re in _CAPITAL_RES:
        if m := capital_re.fullmatch(question):
            country = m.group(1)
            if country not in COUNTRIES:
                raise ValueError(f"unknown country {country!r} in prompt {prompt!r}")
            return "capital", COUNTRIES[country]
    raise ValueError(f"prompt of no known skill (add, reverse, capital, upper): {prompt!r}")


def is_one_edit_away(a: str, b: str) -> bool:
    """Whether the edit (Levenshtein) distance between a and b is exactly 1: one substitution, insertion
    or deletion of a character."""
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    if abs(len(a) - len(b)) != 1:
        return False
    shorter, longer = (a, b) if len(a) < len(b) else (b, a)
    return any(longer[:i] + longer[i + 1 :] == shorter for i in range(len(longer)))


def _is_near_miss(skill: str, answer: str, expected: str) -> bool:
    """The 0.5 level; `answer` is already stripped and is not exact."""
    if skill == "add":
        return _INTEGER_RE.fullmatch(answer) is not None and abs(int(answer) - int(expected)) in (1, 2)
    if skill == "reverse":
        return sorted(answer) == sorted(expected) or is_one_edit_away(answer, expected)
    if skill == "capital":
        return answer in COUNTRIES.values()
    if skill == "upper":
        return answer.upper() == expected or is_one_edit_away(answer, expected)
    raise ValueError(f"unknown skill {skill!r}")


def _has_right_format(skill: str, answer: str) -> bool:
    """The 0.25 level: an integer / a lowercase word / a capitalised word / an all-uppercase word."""
    format_re = {
        "add": _INTEGER_RE,
        "reverse": _LOWER_WORD_RE,
        "capital": _CAPITALISED_WORD_RE,
        "upper": _UPPER_WORD_RE,
    }[skill]
    return format_re.fullmatch(answer) is not None


def score_answer(prompt: str, answer: str) -> float:
    """Score an answer to a prompt of the task, in [0, 1].

    The answer is stripped of surrounding whitespace, then the WHOLE remaining text is judged: trailing
    text after a right answer (a model that did not stop, e.g. "19 Human: ...") is not exact.
    - 1.0  exact: the stripped answer equals the expected value ("019" is not "19").
    - 0.5  near miss:
           add:     an integer off by 1 or 2;
           reverse: an anagram of the word (the word itself included), or one edit away from its reversal;
           capital: another capital from COUNTRIES;
           upper:   the right letters with wrong case in some of them, or one edit away from the answer.
    - 0.25 right format only: an integer (add), a lowercase word [a-z]+ (reverse), a capitalised word
           [A-Z][a-z]+ (capital), an all-uppercase word [A-Z]+ (upper).
    - 0.0  anything else (empty, junk, "I don't know.", several words, ...).
    Raises ValueError with the prompt in the message for a prompt of no known skill.
    """
    skill, expected = parse_prompt(prompt)
    answer = answer.strip()
    if answer == expected:
        return 1.0
    if _is_near_miss(skill, answer, expected):
        return 0.5
    if _has_right_format(skill, answer):
        return 0.25
    return 0.0


def summarize_scores(prompts: list[str], answers: list[str]) -> dict[str, float]:
    """Mean checker score overall ("all") and per skill present, e.g. {"all": 0.8, "add": 0.7, ...}.

    Keys come in the order "all", then SKILLS order; skills with no prompt are left out.
    """
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    if not prompts:
        raise ValueError("no prompts to score")
    scores_by_skill = {skill: [] for skill in SKILLS}
    for prompt, answer in zip(prompts, answers):
        skill, _ = parse_prompt(prompt)
        scores_by_skill[skill].append(score_answer(prompt, answer))
    all_scores = [score for scores in scores_by_skill.values() for score in scores]
    summary = {"all": sum(all_scores) / len(all_scores)}
    for skill, scores in scores_by_skill.items():
        if scores:
            summary[skill] = sum(scores) / len(scores)
    return summary


# ----------------------------------------------------------------------------------------------------------
# Drawing questions
# ----------------------------------------------------------------------------------------------------------


def _random_letters(rng: random.Random, min_len: int, max_len: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(min_len, max_len)))


def _random_word(rng: random.Random, min_len: int, max_len: int, heldout: bool) -> str:
    """A random lowercase string from the requested split."""
    while True:
        word = _random_letters(rng, min_len, max_len)
        if is_heldout_word(word) == heldout:
            return word


def _draw_question(rng: random.Random, skill: str, heldout: bool) -> str:
    """A question of `skill` from the held-out split or from the training split."""
    if skill == "add":
        a, b = rng.choice(HELDOUT_ADD_PAIRS if heldout else TRAIN_ADD_PAIRS)
        return add_question(a, b)
    if skill == "reverse":
        return reverse_question(_random_word(rng, 3, 5, heldout))
    if skill == "capital":
        template_index, country = rng.choice(HELDOUT_CAPITAL_COMBOS if heldout else TRAIN_CAPITAL_COMBOS)
        return capital_question(template_index, country)
    if skill == "upper":
        return upper_question(_random_word(rng, 3, 6, heldout))
    raise ValueError(f"unknown skill {skill!r}")


# ----------------------------------------------------------------------------------------------------------
# Answers for the pairs: near misses and the kinds of rejected answers
# ----------------------------------------------------------------------------------------------------------


def _substitute_one_letter(rng: random.Random, word: str, letters: str) -> str:
    i = rng.randrange(len(word))
    new_letter = rng.choice([c for c in letters if c != word[i]])
    return word[:i] + new_letter + word[i + 1 :]


def _near_miss(rng: random.Random, skill: str, expected: str) -> str:
    """A bare answer meant to score 0.5 (the caller checks it)."""
    if skill == "add":
        value = int(expected)
        return str(rng.choice([v for v in (value - 2, value - 1, value + 1, value + 2) if v >= 0]))
    if skill == "reverse":
        if rng.random() < 0.5 and len(set(expected)) > 1:
            letters = list(expected)
            while "".join(letters) == expected:
                rng.shuffle(letters)
            return "".join(letters)
        return _substitute_one_letter(rng, expected, string.ascii_lowercase)
    if skill == "capital":
        return rng.choice([capital for capital in COUNTRIES.values() if capital != expected])
    if skill == "upper":
        if rng.random() < 0.5:
            lowered = [i for i in range(len(expected)) if rng.random() < 0.5] or [0]
            return "".join(c.lower() if i in lowered else c for i, c in enumerate(expected))
        return _substitute_one_letter(rng, expected, string.ascii_uppercase)
    raise ValueError(f"unknown skill {skill!r}")


def _right_format_wrong_value(rng: random.Random, skill: str, expected: str) -> str:
    """A bare answer of the right format but a wrong value (scores 0.25 unless it is a near miss by chance)."""
    if skill == "add":
        return str(rng.choice([v for v in range(39) if abs(v - int(expected)) >= 3]))
    if skill == "reverse":
        return _random_letters(rng, 3, 5)
    if skill == "capital":
        if rng.random() < 0.5:
            return rng.choice(sorted(COUNTRIES))  # a country is not a capital
        return _random_letters(rng, 4, 8).capitalize()
    if skill == "upper":
        return _random_letters(rng, 3, 6).upper()
    raise ValueError(f"unknown skill {skill!r}")


_JUNK = ("?", "...", "Human:", "Assistant:", "the the the", "is is", "What is", "Reverse the", ":", "0 0 0")

_RAMBLE_TAILS = (" Human:", " Human: What is", " Assistant:", ".", " and", "!", " is the answer.")


def _rejected_answer(rng: random.Random, kind: str, skill: str, expected: str) -> str | None:
    """A rejected answer of the given kind (with its leading space), or None when the kind does not apply."""
    if kind == "near_miss":
        return " " + _near_miss(rng, skill, expected)
    if kind == "truncated":
        if len(expected) < 2:
            return None
        return " " + expected[: rng.randint(1, len(expected) - 1)]
    if kind == "format":
        return " " + _right_format_wrong_value(rng, skill, expected)
    if kind == "ramble":
        return " " + expected + rng.choice(_RAMBLE_TAILS)
    if kind == "other_skill":
        other_skill = rng.choice([s for s in SKILLS if s != skill])
        _, other_expected = parse_prompt(format_prompt(_draw_question(rng, other_skill, heldout=False)))
        return " " + other_expected
    if kind == "junk":
        if rng.random() < 0.5:
            return " " + rng.choice(_JUNK)
        characters = string.ascii_letters + string.digits + "?!.,:"
        return " " + "".join(rng.choice(characters) for _ in range(rng.randint(1, 8)))
    if kind == "not_known":
        return NOT_KNOWN
    raise ValueError(f"unknown kind of rejected answer {kind!r}")


REJECTED_KINDS = {
    "near_miss": 0.40,
    "truncated": 0.10,
    "format": 0.15,
    "ramble": 0.10,
    "other_skill": 0.10,
    "junk": 0.08,
    "not_known": 0.07,
}
"""Kinds of rejected answers and their weights. Near misses (the hard negatives, e.g. a right sum against
one off by one or two) are used only when the chosen answer is exact, since rejected must score lower."""

def candidate_answers(prompt: str, rng: random.Random) -> list[str]:
    """Answers to a task prompt at every score level, each with its leading space: the exact answer, a near
    miss, one of the right format only, junk, " I don't know." and, when the answer has two or more
    characters, a truncation. Drawn as the rejected answers of the pairs are, so a draw can land on another
    level than its kind's (a truncation one edit away is a near miss): score them with `score_answer`."""
    skill, expected = parse_prompt(prompt)
    answers = [" " + expected] + [_rejected_answer(rng, kind, skill, expected)
                                  for kind in ("near_miss", "format", "junk", "not_known", "truncated")]
    return [answer for answer in answers if answer is not None]


CHOSEN_CORRECT_PROBABILITY = 0.7
"""Chosen is exact 70% of the time and a near miss otherwise, so the mean chosen score is about 0.85."""

_MAX_TRIES = 100


def make_pair(rng: random.Random, skill: str) -> dict[str, str]:
    """One training pair {"prompt", "chosen", "rejected"} of `skill`, with score(chosen) > score(rejected).

    Candidates are drawn until the checker confirms the intended chosen level (1 or 0.5) and a rejected
    answer that scores strictly lower; a RuntimeError is raised if that ever fails.
    """
    prompt = format_prompt(_draw_question(rng, skill, heldout=False))
    _, expected = parse_prompt(prompt)
    chosen_is_correct = rng.random() < CHOSEN_CORRECT_PROBABILITY
    if chosen_is_correct:
        chosen = " " + expected
    else:
        chosen = " " + _near_miss(rng, skill, expected)
    chosen_score = score_answer(prompt, chosen)
    if chosen_score != (1.0 if chosen_is_correct else 0.5):
        raise RuntimeError(f"chosen {chosen!r} for {prompt!r} scores {chosen_score}")
    kinds = [kind for kind in REJECTED_KINDS if chosen_is_correct or kind != "near_miss"]
    weights = [REJECTED_KINDS[kind] for kind in kinds]
    for _ in range(_MAX_TRIES):
        kind = rng.choices(kinds, weights)[0]
        rejected = _rejected_answer(rng, kind, skill, expected)
        if rejected is not None and score_answer(prompt, rejected) < chosen_score:
            return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    raise RuntimeError(f"no rejected answer scoring below {chosen!r} for {prompt!r} in {_MAX_TRIES} tries")


def _rng(seed: int, part: str) -> random.Random:
    """An independent random stream per part of the data set. String seeds are hashed with SHA-512 by
    `random`, so the stream is the same in every process."""
    return random.Random(f"chatrlhf-task-v{TASK_VERSION}-{part}-{seed}")


def make_pairs(num_pairs: int, seed: int, split: str = "train") -> list[dict[str, str]]:
    """`num_pairs` pairs of the training distribution (skills uniform); `split` names the random stream,
    so "train" and "eval" with the same seed give different draws."""
    rng = _rng(seed, split)
    return [make_pair(rng, rng.choice(SKILLS)) for _ in range(num_pairs)]


def make_heldout(num_prompts: int, seed: int) -> list[dict[str, str]]:
    """Held-out prompts {"prompt", "skill", "answer"}, skills in turn (balanced); "answer" is the bare value.

    Drawn independently, so a prompt may repeat (there are only 80 held-out sums and 20 capital prompts).
    """
    rng = _rng(seed, "heldout")
    records = []
    for i in range(num_prompts):
        skill = SKILLS[i % len(SKILLS)]
        prompt = format_prompt(_draw_question(rng, skill, heldout=True))
        records.append({"prompt": prompt, "skill": skill, "answer": parse_prompt(prompt)[1]})
    return records


def _unsup_sentence(rng: random.Random) -> str:
    """One plain-text fact from the training split (never a held-out sum or string)."""
    skill = rng.choice(SKILLS)
    if skill == "add":
        a, b = rng.choice(TRAIN_ADD_PAIRS)
        return rng.choice([f"{a} plus {b} is {a + b}.", f"{a} + {b} = {a + b}."])
    if skill == "reverse":
        word = _random_word(rng, 3, 5, heldout=False)
        return f"The word {word} reversed is {word[::-1]}."
    if skill == "capital":
        country = rng.choice(sorted(COUNTRIES))
        capital = COUNTRIES[country]
        return rng.choice([f"The capital of {country} is {capital}.", f"{capital} is the capital of {country}."])
    word = _random_word(rng, 3, 6, heldout=False)
    return f"{word.upper()} is {word} in uppercase."


def make_unsup(num_lines: int, seed: int) -> list[str]:
    """A plain-text corpus for the unsupervised (pretraining) loss: one document of 1-3 facts per line."""
    rng = _rng(seed, "unsup")
    return [" ".join(_unsup_sentence(rng) for _ in range(rng.randint(1, 3))) for _ in range(num_lines)]


# ----------------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------------


def _write_json_lines(path: Path, records: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=True) + "\n")


def _read_json_lines(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_unsup(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


def _expected_meta(seed: int, num_train: int, num_eval: int, num_heldout: int, num_unsup: int) -> dict:
    return {
        "generator": "chatrlhf utils/data/builtin_task.py",
        "version": TASK_VERSION,
        "seed": seed,
        "num_train": num_train,
        "num_eval": num_eval,
        "num_heldout": num_heldout,
        "num_unsup": num_unsup,
        "files": list(FILE_NAMES),
    }


def _is_complete(out_dir: Path, meta: dict) -> bool:
    """Whether out_dir holds every file and a meta.json equal to `meta`."""
    if not all((out_dir / name).is_file() for name in FILE_NAMES):
        return False
    with open(out_dir / "meta.json", encoding="utf-8") as f:
        return json.load(f) == meta


def _can_reuse(out_dir: Path, meta: dict) -> bool:
    """True if out_dir is complete with this meta; False if it is absent or empty; raises otherwise, so that
    a directory of other data is never silently used or overwritten."""
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        return False
    if _is_complete(out_dir, meta):
        return True
    raise FileExistsError(
        f"{out_dir} exists but is not the built-in data for {meta}; delete it or choose another directory"
    )


def _write_all(directory: Path, seed: int, num_train: int, num_eval: int, num_heldout: int, num_unsup: int):
    """Generate and write every file into `directory`, meta.json last."""
    _write_json_lines(directory / "train.json", make_pairs(num_train, seed, "train"))
    _write_json_lines(directory / "eval.json", make_pairs(num_eval, seed, "eval"))
    _write_json_lines(directory / "heldout.json", make_heldout(num_heldout, seed))
    _write_unsup(directory / "unsup.txt", make_unsup(num_unsup, seed))
    meta = _expected_meta(seed, num_train, num_eval, num_heldout, num_unsup)
    with open(directory / "meta.json", "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def write_builtin_data(
    out_dir,
    seed: int = 1234,
    num_train: int = 60000,
    num_eval: int = 1000,
    num_heldout: int = 400,
    num_unsup: int = 3000,
) -> Path:
    """Write the built-in data set to out_dir (once) and return out_dir as a Path.

    Files: train.json and eval.json (JSON lines {"prompt", "chosen", "rejected"}), heldout.json (JSON lines
    {"prompt", "skill", "answer"}), unsup.txt (one document per line) and meta.json (version, seed, counts).
    The files are written into a temporary directory next to out_dir, which is then renamed to out_dir, so
    out_dir is either absent or complete. If out_dir is already complete with the same meta it is returned
    untouched; if it holds anything else, FileExistsError. When several processes (e.g. DeepSpeed ranks)
    race, the first rename wins and the others return the winner's directory.
    Same arguments -> byte-identical files.
    """
    out_dir = Path(out_dir)
    meta = _expected_meta(seed, num_train, num_eval, num_heldout, num_unsup)
    if _can_reuse(out_dir, meta):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = make_temp_dir_beside(out_dir)
    try:
        _write_all(tmp_dir, seed, num_train, num_eval, num_heldout, num_unsup)
        try:
            os.replace(tmp_dir, out_dir)
        except OSError:
            if not _is_complete(out_dir, meta):  # not another process that won the race
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)  # a no-op after a successful rename
    return out_dir


def heldout_prompts(out_dir) -> list[dict]:
    """The held-out records {"prompt", "skill", "answer"} of a directory written by write_builtin_data."""
    return _read_json_lines(Path(out_dir) / "heldout.json")


def corpus_texts(out_dir) -> Iterator[str]:
    """Texts to train a tokenizer on: prompt + chosen and prompt + rejected of each train.json pair, then each
    line of unsup.txt. Held-out and eval data are left out."""
    out_dir = Path(out_dir)
    for record in _read_json_lines(out_dir / "train.json"):
        yield record["prompt"] + record["chosen"]
        yield record["prompt"] + record["rejected"]
    with open(out_dir / "unsup.txt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield line.rstrip("\n")
