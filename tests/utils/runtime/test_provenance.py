"""utils/runtime/provenance.py: the CPU and the commit every report, card, bench page and table names."""
import subprocess

from utils.runtime.provenance import code_commit, cpu_model, cpu_name

AMX = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n"
AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 sha_ni\n"


def test_the_cpu_is_its_model_and_whether_it_runs_bf16_natively():
    assert cpu_name(AMX) == "Intel(R) Xeon(R) Platinum 8480+, native bf16"
    assert cpu_name(AVX2) == "AMD EPYC 7B13, no native bf16 (fp32)"
    assert cpu_model("") != ""  # no /proc/cpuinfo: the platform's name


def test_the_commit_is_the_clones_and_says_when_files_differ(tmp_path):
    assert code_commit(tmp_path) == "unknown"  # not a git clone

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-qm", "first")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True, text=True
                          ).stdout.strip()
    assert code_commit(tmp_path) == head
    (tmp_path / "b.py").write_text("untracked files do not count\n")
    assert code_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_commit(tmp_path) == f"{head} + uncommitted changes"
