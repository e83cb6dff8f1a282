"""utils/trainer/loop.py: --answer_filter_fn's judge."""
from argparse import Namespace

from utils.trainer.loop import answer_judge


def test_the_answer_judge_scores_each_prompt_and_answer_once(tmp_path):
    """step_data builds its data twice where a length is `auto`: the second build's pairs are not scored again."""
    log = tmp_path / "calls.txt"
    (tmp_path / "judge.py").write_text(f"def score(prompts, answers):\n"
                                       f"    with open({str(log)!r}, 'a') as f:\n"
                                       f"        f.write('|'.join(answers) + '\\n')\n"
                                       f"    return [1.0 if answer == 'right' else 0.0 for answer in answers]\n")
    judge = answer_judge(Namespace(answer_filter_fn=f"{tmp_path}/judge.py:score", data_path=["builtin"]))
    prompts, answers = [" Human: a? Assistant:"] * 3, ["right", "wrong", "right"]
    assert judge(prompts, answers) == [1.0, 0.0, 1.0]
    assert judge(prompts, answers) == [1.0, 0.0, 1.0]
    assert judge(prompts[:1], ["other"]) == [0.0]
    assert log.read_text().splitlines() == ["right|wrong", "other"]  # each distinct pair once, first seen first
    assert answer_judge(Namespace(answer_filter_fn=None)) is None
