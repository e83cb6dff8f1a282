"""Installing chatrlhf puts no package of its own on the environment's path: another project's `utils` or
`training` stays the one that is imported (chatrlhf's scripts run from the clone)."""
import os
import subprocess
import sys


def test_another_projects_utils_and_training_are_the_ones_imported(tmp_path):
    for name in ("utils", "training"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'other project {name}'\n")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", "import utils, training; print(utils.WHO, '|', training.WHO)"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "other project utils | other project training"


def test_no_chatrlhf_folder_is_importable_from_elsewhere(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", "import utils.rl"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0 and "No module named 'utils'" in result.stderr
