"""cleanrl_q_utils.run_folder: the run's folder and name, the device a run picks and the memory settings that come
with it."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from cleanrl_q_utils import run_folder


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_cpu_runs_reuse_the_memory_of_freed_tensors_instead_of_faulting_it_in_again():
    # IQN's target pass in miniature: tensors of 32 x 40 x 1024 floats made and freed at every call, counted in a child
    # process whose allocator starts untouched. Without the setting pick_device makes on the CPU, glibc's default
    # faults in 26k to 53k pages over these 20 calls (measured); with it, 0 (eight runs), and once 1,281 in a whole
    # suite beside a training run (the kernel faults a few pages back in under memory load). The bound, 5,000 pages,
    # is a fifth of the fewest the default faulted in, far above that noise.
    code = (
        "import resource, torch\n"
        "from cleanrl_q_utils import run_folder\n"
        "run_folder.pick_device(cuda=False, cpu_threads=1)\n"
        "embed, head = torch.nn.Linear(64, 1024), torch.nn.Linear(1024, 128)\n"
        "def forward():\n"
        "    with torch.no_grad():\n"
        "        return head(torch.rand(32, 1, 1024) * embed(torch.rand(32, 40, 64)).relu())\n"
        "for _ in range(3): forward()\n"  # the heap grows to its working size
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(20): forward()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 5_000


def test_runs_started_in_the_same_second_get_folders_of_their_own(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_folder.time, "time", lambda: 1234.5)  # every run starts in the same second
    args = SimpleNamespace(env_id="MinAtar/Breakout-v0", exp_name="toy", seed=1)
    names = [run_folder.new_run_name(args) for _ in range(3)]
    base = "MinAtar-Breakout-v0__toy__1__1234"  # a namespaced env id is written with a dash: one folder
    assert names == [base, f"{base}_2", f"{base}_3"]
    assert sorted(os.listdir("runs")) == sorted(names)
