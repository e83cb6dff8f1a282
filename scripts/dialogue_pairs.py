"""Dialogue-shaped preference pairs made offline, in HH-RLHF's shape, and how many of them each step keeps.

The pairs are whole dialogues, `{"chosen": "\\n\\nHuman: ...\\n\\nAssistant: ...", "rejected": ...}`, of one to
several turns about one topic; the two share every turn but the last answer. The chosen answer is polite and on
the topic of the last question; the rejected one is rude, or polite but about another topic: a preference a small
model can learn from the words alone. Turns and sentences per answer are drawn from geometric distributions, so
the lengths have the long tail real dialogue has (tens to hundreds of tokens).

    python scripts/dialogue_pairs.py --output_dir /tmp/dialogue --num_train 3000 --num_eval 300
    python scripts/dialogue_pairs.py --output_dir /tmp/dialogue --measure     # also: rows kept per step and length

`--measure` builds steps 1 and 2's data sets (utils/data/data_utils.py create_prompt_dataset, --data_split 2,4,4)
with the model's tokenizer at each --max_seq_len of --lengths (a number, or `auto`, `auto:max`, `auto:P`) and
prints a Markdown table of the rows read and kept per split: the data pipeline only, no training.
"""
import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from the clone: chatrlhf installs no packages

TOPICS = {
    "cooking": {
        "questions": ["How long should I boil an egg?", "What can I cook with rice and beans?",
                      "How do I keep pasta from sticking?", "Which oil is best for frying?",
                      "How do I make a simple tomato sauce?"],
        "facts": ["A soft egg takes about six minutes in boiling water.", "Stir the pasta in the first minutes.",
                  "Rice and beans make a filling meal with onion and spices.", "Use plenty of salted water.",
                  "Oils with a high smoke point, such as sunflower oil, suit frying.",
                  "Simmer crushed tomatoes with garlic and olive oil for twenty minutes."],
    },
    "travel": {
        "questions": ["What should I pack for a week in the mountains?", "How do I find cheap train tickets?",
                      "Is it better to travel by bus or by train?", "How early should I arrive at the airport?",
                      "What is a good way to see a new city?"],
        "facts": ["Pack layers, a rain jacket and good walking shoes.", "Booking early usually gives lower fares.",
                  "Trains are often faster, buses often cheaper.", "Arrive two hours before an international flight.",
                  "A walking tour shows you the old town and its history.", "Keep a copy of your passport apart."],
    },
    "gardening": {
        "questions": ["When should I plant tomatoes?", "How often should I water my herbs?",
                      "Why are the leaves of my plant turning yellow?", "How do I start a compost heap?",
                      "Which flowers attract bees?"],
        "facts": ["Plant tomatoes after the last frost.", "Water herbs when the top of the soil is dry.",
                  "Yellow leaves often mean too much water.", "Mix green kitchen scraps with dry leaves.",
                  "Lavender and sunflowers attract bees.", "Turn the compost every few weeks to air it."],
    },
    "computers": {
        "questions": ["How do I make my laptop faster?", "What is a good password?",
                      "How do I back up my photos?", "Why does my wifi keep dropping?",
                      "Should I update my operating system?"],
        "facts": ["Close programs you do not use and free some disk space.", "A long passphrase is hard to guess.",
                  "Keep one copy of your photos on an external drive and one online.",
                  "Restarting the router often fixes a dropping connection.",
                  "Updates fix security holes, so install them.", "Move the router away from thick walls."],
    },
    "fitness": {
        "questions": ["How can I start running?", "How much water should I drink a day?",
                      "What is a good warm-up?", "How do I stay motivated to exercise?",
                      "Is it fine to exercise every day?"],
        "facts": ["Start with short runs and walk breaks.", "About two litres of water a day suits most people.",
                  "A few minutes of light jogging and stretching warms you up.",
                  "Exercising with a friend keeps you going.", "Rest days let your muscles recover.",
                  "Increase the distance by a tenth each week at most."],
    },
}
POLITE_OPENINGS = ["Sure, happy to help.", "Good question!", "Of course.", "Thanks for asking.",
                   "I would be glad to help with that."]
POLITE_CLOSINGS = ["I hope this helps.", "Let me know if you have more questions.", "Good luck!",
                   "Feel free to ask again."]
RUDE_ANSWERS = ["Figure it out yourself.", "That is a stupid question.", "Why would I care about that?",
                "Stop bothering me.", "Nobody has time for this.", "Look it up, it is not my job."]
FOLLOW_UPS = ["Thanks. And one more thing:", "Okay, that makes sense. Also,", "Great. Another question:",
              "I see. Then", "Interesting. Now,"]


def _geometric(rng, p, most):
    """1, 2, ... with probability p (1 - p)^(k - 1), at most `most`: mostly short, some long."""
    count = 1
    while count < most and rng.random() > p:
        count += 1
    return count


def polite_answer(rng, topic):
    """An on-topic answer: a polite opening, one or more of the topic's facts (a long tail of them), and half the
    time a polite closing."""
    facts = rng.sample(TOPICS[topic]["facts"], _geometric(rng, 0.6, len(TOPICS[topic]["facts"])))
    closing = [rng.choice(POLITE_CLOSINGS)] if rng.random() < 0.5 else []
    return " ".join([rng.choice(POLITE_OPENINGS), *facts, *closing])


def rude_or_off_topic(rng, topic):
    """The rejected answer: rude (half the time), else polite but about another topic."""
    if rng.random() < 0.5:
        return " ".join(rng.sample(RUDE_ANSWERS, rng.randint(1, 2)))
    return polite_answer(rng, rng.choice([other for other in TOPICS if other != topic]))


def dialogue_pair(rng):
    """One pair: a dialogue of 1 to 6 turns about one topic (geometric), both sides sharing all but the last
    answer."""
    topic = rng.choice(list(TOPICS))
    questions = rng.sample(TOPICS[topic]["questions"], _geometric(rng, 0.6, 5))
    text = ""
    for turn, question in enumerate(questions):
        human = question if turn == 0 else f"{rng.choice(FOLLOW_UPS)} {question[0].lower()}{question[1:]}"
        text += f"\n\nHuman: {human}\n\nAssistant:"
        if turn < len(questions) - 1:
            text += " " + polite_answer(rng, topic)
    return {"chosen": f"{text} {polite_answer(rng, topic)}", "rejected": f"{text} {rude_or_off_topic(rng, topic)}"}


def make_pairs(num_pairs, seed):
    rng = random.Random(seed)
    return [dialogue_pair(rng) for _ in range(num_pairs)]


def write_pairs(output_dir, num_train, num_eval, seed=0):
    """train.jsonl and eval.jsonl of dialogue pairs in `output_dir`; returns the folder."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, count, part_seed in (("train", num_train, seed), ("eval", num_eval, seed + 1)):
        rows = make_pairs(count, part_seed)
        (output_dir / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return output_dir


def rows_kept(data_dir, phase, max_seq_len, tokenizer, cache_dir, data_split="2,4,4", seed=1234):
    """({split: (rows read, rows kept, rows kept with earlier turns dropped)}, the length used) of phase `phase` (1:
    SFT, 2: pairs) of `data_dir` at `max_seq_len` (a number, or `auto`, `auto:max`, `auto:P`), as the steps build
    it. Where a split keeps no row
    (the step would stop with an error), the rows kept are counted on the data built unbounded: those within
    `max_seq_len` whole (sample_length), the rule the steps apply."""
    from argparse import Namespace

    from utils.data.data_utils import create_prompt_dataset, data_bound, fit_auto_lengths, sample_length
    from utils.runtime.errors import DataError

    build = [str(data_dir)], data_split, str(cache_dir), phase, seed, tokenizer
    whole, whole_eval = create_prompt_dataset(*build, None)  # every row that has what the phase needs
    read = {split: whole.counts[split]["read"] for split in ("train", "eval")}
    def bounded(limit):
        return create_prompt_dataset(*build, limit)

    try:
        train, evaluation = bounded(data_bound(max_seq_len))
        args = Namespace(seed=seed, max_seq_len=max_seq_len)
        fit_auto_lengths(args, [str(data_dir)], tokenizer, train, evaluation, rebuild=bounded)
    except DataError:
        return {split: (read[split], sum(sample_length(sample) <= max_seq_len for sample in dataset), 0)
                for split, dataset in (("train", whole), ("eval", whole_eval))}, max_seq_len
    return {split: (read[split], train.counts[split]["kept"], train.counts[split].get("trimmed", 0))
            for split in read}, args.max_seq_len


def measure(data_dir, lengths, model, cache_dir):
    """A Markdown table: per step and --max_seq_len, the length used and the rows kept of those read."""
    from utils.model.model_utils import load_tokenizer, resolve_model_path
    from utils.runtime.dist import quiet_transformers

    quiet_transformers()
    tokenizer = load_tokenizer(resolve_model_path(model))
    lines = ["| step | --max_seq_len | length used | train rows kept / read | eval rows kept / read |",
             "|---|---|---|---|---|"]
    for phase, step in ((1, "1 SFT"), (2, "2 reward model / DPO")):
        for length in lengths:
            counts, used = rows_kept(data_dir, phase, length, tokenizer, cache_dir)
            cells = [f"{kept} / {read} ({kept / read:.0%}; {trimmed} with earlier turns dropped)"
                     for read, kept, trimmed in (counts["train"], counts["eval"])]
            lines.append(f"| {step} | {length} | {used} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv=None):
    from utils.runtime.args import add_output_dir_arg, add_seed_arg, length_or_auto

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_dir_arg(parser, help="Where train.jsonl and eval.jsonl are written (required).", required=True)
    parser.add_argument("--num_train", type=int, default=3000, help="Train pairs.")
    parser.add_argument("--num_eval", type=int, default=300, help="Eval pairs.")
    add_seed_arg(parser, default=0, covers="the pairs (the eval pairs: seed + 1)")
    parser.add_argument("--measure", action="store_true", help="Print the rows steps 1 and 2 keep (no training).")
    parser.add_argument("--lengths", nargs="+", type=length_or_auto, default=[64, "auto", "auto:max"],
                        help="The --max_seq_len values --measure builds the data at (numbers, auto, auto:max, "
                             "auto:P).")
    parser.add_argument("--model", default="tiny", help="Whose tokenizer --measure counts tokens with.")
    args = parser.parse_args(argv)
    data_dir = write_pairs(args.output_dir, args.num_train, args.num_eval, args.seed)
    print(f"wrote {args.num_train} train and {args.num_eval} eval pairs to {data_dir}")
    if args.measure:
        print(measure(data_dir, args.lengths, args.model, data_dir / "split-cache"))


if __name__ == "__main__":
    main()
