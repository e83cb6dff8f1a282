"""Tests of inference/evaluation.py's answer statistics: the best constant answer's score, the distinct answers and
the most frequent one's share, and the answers cut at the token limit, on the built-in task's checker and a
reasoning-gym verifier (a stub `generate` plays a model that answers one thing to every question); held-out
prompts fitted to a context."""
import pytest
import torch

from inference import evaluation
from inference.evaluation import (BUILTIN_CHECKER, answer_scalars, answer_stats, builtin_prompts, evaluate_models,
                                  format_answer_stats, heldout_set)
from inference.generation import eos_token_ids, generate, tokenize_prompts
from utils.data import builtin_task as task
from utils.runtime.errors import DataError


def add_prompts(pairs):
    return [task.format_prompt(task.add_question(a, b)) for a, b in pairs]


def stub_generate(monkeypatch, answer_of, ended_of=lambda prompt: True):
    """evaluate_models' `generate` replaced by a model answering `answer_of(prompt)`, ending where `ended_of`."""
    def fake(model, tokenizer, prompts, max_new_tokens=16, return_ended=False, **kwargs):
        answers, ended = [answer_of(p) for p in prompts], [ended_of(p) for p in prompts]
        return (answers, ended) if return_ended else answers

    monkeypatch.setattr(evaluation, "generate", fake)


def test_best_constant_by_hand_on_the_builtin_checker():
    # Sums 2, 2, 2, 3, 9. The checker: 1 exact, 0.5 off by 1 or 2, 0.25 any other integer.
    prompts = add_prompts([(1, 1), (0, 2), (2, 0), (1, 2), (4, 5)])
    stats = answer_stats(prompts, ["3"] * 5, BUILTIN_CHECKER)
    # "2": 1 + 1 + 1 + 0.5 + 0.25 = 3.75; "3": 0.5 x 3 + 1 + 0.25 = 2.75; "9": 0.25 x 4 + 1 = 2.0.
    assert stats["best_constant"] == {"all": 0.75, "add": 0.75}
    assert stats["best_constant_answer"] == {"all": "2", "add": "2"}
    assert stats["distinct_answers"] == {"all": 1, "add": 1}
    assert stats["top_answer"] == {"all": "3", "add": "3"} and stats["top_answer_share"]["all"] == 1.0
    assert stats["answers"] == 5


def test_answers_in_rounds_count_every_round_and_compare_stripped():
    prompts = add_prompts([(1, 1), (1, 2)])
    stats = answer_stats(prompts, [" 2", "3", "2 ", "7"], BUILTIN_CHECKER)  # two rounds over the two prompts
    assert stats["distinct_answers"]["all"] == 3 and stats["top_answer"]["all"] == "2"
    assert stats["top_answer_share"]["all"] == 0.5 and stats["answers"] == 4


def test_pass_at_k_counts_the_questions_one_of_their_answers_solves():
    prompts = add_prompts([(1, 1), (1, 2), (4, 5)])  # 2, 3, 9
    stats = answer_stats(prompts, ["2", "4", "8", "1", "4", "9"], BUILTIN_CHECKER)  # two rounds
    # the first solved in round 1, the third in round 2, the second never (4 is a near miss, 0.5)
    assert stats["k"] == 2 and stats["pass_at_k"] == {"all": pytest.approx(2 / 3), "add": pytest.approx(2 / 3)}
    assert answer_stats(prompts, ["2", "4", "8"], BUILTIN_CHECKER)["pass_at_k"]["all"] == pytest.approx(1 / 3)


def test_without_a_checker_there_is_no_best_constant_and_a_plain_checker_has_one_group():
    prompts = add_prompts([(1, 1), (1, 2), (4, 5)])
    stats = answer_stats(prompts, ["2", "2", "x"])
    assert "best_constant" not in stats and stats["distinct_answers"] == {"all": 2}

    def mean_length(prompts, answers):  # a reward function's checker: no groups, no references
        return {"all": sum(len(a) for a in answers) / len(answers)}

    stats = answer_stats(prompts, ["2", "2", "xyz"], mean_length)
    assert stats["best_constant"] == {"all": 3.0} and stats["best_constant_answer"] == {"all": "xyz"}
    assert "pass_at_k" not in stats  # "solved" means nothing on a reward function's own scale


def test_a_constant_model_on_the_builtin_task_scores_the_best_constant_and_gives_one_answer(monkeypatch,
                                                                                           tiny_tokenizer):
    prompts = builtin_prompts()[:80]  # skills in turn: 20 of each
    stub_generate(monkeypatch, lambda prompt: "1")
    first = evaluate_models({"one": (None, tiny_tokenizer)}, prompts, samples_per_prompt=2)["one"]
    stats = first["answer_stats"]["sampled"]
    assert stats["distinct_answers"] == {"all": 1, "add": 1, "reverse": 1, "capital": 1, "upper": 1}
    assert stats["top_answer_share"]["all"] == 1.0 and stats["answers"] == 160 and stats["hit_limit"] == 0
    assert list(stats["best_constant"]) == list(first["sampled"])  # "all", then the skills, as the scores
    for group, score in first["sampled"].items():
        assert score <= stats["best_constant"][group]  # "1" is one of the constants tried
    # A model answering each skill its best constant scores exactly that, skill by skill.
    best = stats["best_constant_answer"]
    stub_generate(monkeypatch, lambda prompt: best[task.parse_prompt(prompt)[0]])
    second = evaluate_models({"per skill": (None, tiny_tokenizer)}, prompts, greedy_only=True)["per skill"]
    for group in ("add", "reverse", "capital", "upper"):
        assert second["greedy"][group] == pytest.approx(second["answer_stats"]["greedy"]["best_constant"][group])
        assert second["answer_stats"]["greedy"]["distinct_answers"][group] == 1
    assert second["answer_stats"]["greedy"]["distinct_answers"]["all"] == 4
    # which the table warns of, skill by skill (over all questions it gives four answers, none mostly)
    warning = format_answer_stats({"per skill": second}).splitlines()[-1]
    assert warning.startswith("WARNING: per skill greedy answers mostly as one answer would and scores no better "
                              "than a constant answer on: add ") and "upper" in warning and " all " not in warning
    stub_generate(monkeypatch, lambda prompt: task.parse_prompt(prompt)[1])  # right every time: no warning
    assert "WARNING" not in format_answer_stats(evaluate_models({"right": (None, tiny_tokenizer)}, prompts))
    # and one answer to every question scores at most the best constant of all of them
    stub_generate(monkeypatch, lambda prompt: best["all"])
    third = evaluate_models({"one": (None, tiny_tokenizer)}, prompts, greedy_only=True)["one"]
    assert third["greedy"]["all"] == pytest.approx(stats["best_constant"]["all"])


def test_a_model_answering_1_to_every_gcd_question_scores_the_best_constant(monkeypatch, tiny_tokenizer):
    pytest.importorskip("reasoning_gym")
    # GCDs of three numbers: "1" is the most frequent answer, as "1" was on the counting task of the issue.
    prompts, checker = heldout_set("reasoning_gym:gcd?min_numbers=3&max_numbers=3&size=300")
    stub_generate(monkeypatch, lambda prompt: "1")
    result = evaluate_models({"collapsed": (None, tiny_tokenizer)}, prompts, checker=checker)["collapsed"]
    for decoding in ("sampled", "greedy"):
        stats = result["answer_stats"][decoding]
        assert 0 < result[decoding]["all"] < 1
        assert stats["best_constant"] == {"all": result[decoding]["all"], "gcd": result[decoding]["gcd"]}
        assert stats["best_constant_answer"] == {"all": "1", "gcd": "1"}
        assert stats["distinct_answers"] == {"all": 1, "gcd": 1} and stats["top_answer_share"]["gcd"] == 1.0
    table = format_answer_stats({"collapsed": result})
    assert "WARNING: collapsed sampled answers mostly as one answer would and scores no better than a constant " \
           "answer on: all " in table and "gcd" in table.splitlines()[-1] and "answering '1' to every question" in table
    scalars = answer_scalars(result["answer_stats"]["sampled"])
    assert scalars == {"best_constant": result["sampled"]["all"], "scored_as_constant": 1.0, "distinct_answers": 1,
                       "top_answer_share": 1.0, "hit_limit": 0}


def test_hit_limit_counts_the_answers_without_an_eos(monkeypatch, tiny_tokenizer):
    prompts = add_prompts([(1, 1), (1, 2), (4, 5)])
    stub_generate(monkeypatch, lambda prompt: "2", ended_of=lambda prompt: "4 + 5" not in prompt)
    result = evaluate_models({"m": (None, tiny_tokenizer)}, prompts, samples_per_prompt=3, max_new_tokens=7)["m"]
    assert result["answer_stats"]["sampled"]["hit_limit"] == 3 and result["answer_stats"]["greedy"]["hit_limit"] == 1
    assert result["answer_stats"]["greedy"]["max_new_tokens"] == 7


def test_generate_says_which_answers_ended_before_the_limit(tiny, monkeypatch):
    import copy

    model, tokenizer = tiny
    prompts = add_prompts([(1, 1), (7, 12)]) + [task.format_prompt('Say "apple" in uppercase.')]
    with torch.no_grad():  # each prompt's greedy first answer token
        first = [int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
                 for ids in tokenize_prompts(tokenizer, prompts)]
    answers, ended = generate(model, tokenizer, prompts, max_new_tokens=1, greedy=True, return_ended=True)
    assert ended == [token in eos_token_ids(model, tokenizer) for token in first]
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = [tokenizer.eos_token_id, first[0]]  # the first prompt's answer now ends at once
    monkeypatch.setattr(model, "generation_config", config)
    answers, ended = generate(model, tokenizer, prompts, max_new_tokens=1, greedy=True, return_ended=True)
    assert answers[0] == "" and ended == [token in (tokenizer.eos_token_id, first[0]) for token in first]
    assert generate(model, tokenizer, prompts, max_new_tokens=1, greedy=True) == answers  # the plain call


def test_validation_prompts_are_a_specs_whole_eval_part_apart_from_its_held_out_and_train_questions():
    pytest.importorskip("reasoning_gym")
    from inference.evaluation import gym_validation_prompts
    from utils.data.reasoning_gym_data import gym_data

    spec = "reasoning_gym:gcd?min_numbers=3&max_numbers=3&size=300"
    validation = gym_validation_prompts(spec)
    heldout, _ = heldout_set(spec)
    train = {item.prompt for item in gym_data(spec).parts["train"]}
    assert len(validation) == 30 and len(set(validation)) == 30  # 10% of 300, none twice
    assert not set(validation) & set(heldout) and not set(validation) & train
    assert gym_validation_prompts([spec, spec]) == validation * 2
    assert gym_validation_prompts("builtin") is None and gym_validation_prompts([spec, "builtin"]) is None


def test_answers_worded_apart_that_score_as_one_answer_does_are_a_constant_answer():
    """A counting task's answers that echo each question but always say "1": no answer is given twice, yet each
    earns what the constant answer "1" earns on its question: scored as a constant answer, not as the skill."""
    from inference.evaluation import Checker, constant_likeness, scores_as_a_constant

    truth = {f"How many a in text {n}?": str(1 + n % 3) for n in range(30)}  # "1" right a third of the time

    def last_number(answer):
        return answer.split()[-1].strip(".")

    checker = Checker(lambda prompts, answers: {"all": sum(last_number(a) == truth[p] for p, a in
                                                           zip(prompts, answers)) / len(answers)}, None)
    prompts = list(truth)
    echoes = [f"In {prompt[-8:-1]} it appears 1" for prompt in prompts]
    stats = answer_stats(prompts, echoes, checker)
    assert stats["distinct_answers"]["all"] == 30 and stats["scored_as_constant"]["all"] == 1.0
    score = checker(prompts, echoes)["all"]
    assert score == pytest.approx(1 / 3) and score <= stats["best_constant"]["all"]
    assert scores_as_a_constant(score, stats)
    assert constant_likeness(stats).startswith("100% of the answers earn what ")
    right = [f"In {prompt[-8:-1]} it appears {truth[prompt]}" for prompt in prompts]
    right_stats = answer_stats(prompts, right, checker)
    assert right_stats["scored_as_constant"]["all"] == 0.0  # alike where "1" is right, never where it is wrong
    assert not scores_as_a_constant(checker(prompts, right)["all"], right_stats)
    wrong = [f"In {prompt[-8:-1]} it appears 0" for prompt in prompts]
    assert answer_stats(prompts[:3], wrong[:3], checker)["scored_as_constant"]["all"] == 0.0  # every constant fails
    # Every answer wrong where "1" is right (two thirds alike, where both fail): failing is not a constant answer.
    assert answer_stats(prompts, wrong, checker)["scored_as_constant"]["all"] == 0.0
    mostly = echoes[:27] + right[27:]  # "1" but for three questions, one of them where "1" was right: still one
    assert answer_stats(prompts, mostly, checker)["scored_as_constant"]["all"] == pytest.approx(18 / 20)
    # A task no answer solves (sudoku, graph_color for a small model): one answer scoring 0 everywhere, as every
    # constant does, is no collapse to warn of (before: "the gain is a constant answer" for 0 -> 0).
    nothing = Checker(lambda prompts, answers: {"all": 0.0}, None)
    alike = answer_stats(prompts, ["no idea"] * len(prompts), nothing)
    assert alike["best_constant"]["all"] == 0.0 and alike["top_answer_share"]["all"] == 1.0
    assert not scores_as_a_constant(0.0, alike)


def test_held_out_prompts_too_long_for_the_context_are_left_out_and_counted(tiny_tokenizer, capsys):
    """Step 3's held-out evaluation and prompt_eval.py fit the data's held-out prompts to the model's context (before,
    step 3 ended with "prompt 1 is too long" after step 1 had trained, on figlet_font and rectangle_count)."""
    from inference.evaluation import fit_prompts_to_context
    from utils.data.data_utils import tokenize_prompt

    short, long = " Human: What is 1 + 2? Assistant:", " Human: " + "many words here " * 60 + "Assistant:"
    context = len(tokenize_prompt(tiny_tokenizer, short)) + 40
    assert len(tokenize_prompt(tiny_tokenizer, long)) > context
    fitted = fit_prompts_to_context([short, long, short], tiny_tokenizer, context, 8, "--max_answer_seq_len")
    assert fitted == [short, short]
    assert "held-out prompts: 2 samples (skipped: 1 longer than the context" in capsys.readouterr().out
    assert fit_prompts_to_context([long], tiny_tokenizer, None, 8, "--max_answer_seq_len") == [long]  # no bound
    with pytest.raises(DataError, match="no held-out prompt fits the context of .* with --max_answer_seq_len 8"):
        fit_prompts_to_context([long], tiny_tokenizer, context, 8, "--max_answer_seq_len")
