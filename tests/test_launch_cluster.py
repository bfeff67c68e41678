"""benchmark/launch.py's cluster backends on this machine: a real local Ray cluster (no mocks) and submitit's local
executor. Four small PQN runs (CartPole-v1 and Acrobot-v1, seeds 1 and 2) through the local backend are the reference
that runs through Ray, a run killed on Ray, and a preempted-and-requeued Slurm job must reproduce to the last bit."""

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO, import_file

LAUNCH = REPO / "benchmark" / "launch.py"
EXTRA = 'pip install -e ".[cluster]"'
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason=f"needs the cluster extra: {EXTRA}")
needs_submitit = pytest.mark.skipif(importlib.util.find_spec("submitit") is None, reason=f"needs the cluster extra: {EXTRA}")
ENV_IDS, SEEDS = ["CartPole-v1", "Acrobot-v1"], ["1", "2"]
# 64 iterations of 16 envs x 16 steps (about 2 s here), a checkpoint every 16 of them, the model saved at the end.
PQN = [
    sys.executable, str(REPO / "cleanrl" / "pqn.py"), "--total-timesteps", "16384", "--num-envs", "16",
    "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2", "--save-model", "--eval-episodes", "1",
]  # fmt: skip
# A wrapper that starts the command, SIGKILLs it as soon as its first checkpoint exists, then kills itself ("run") or
# the Ray worker that runs the task ("worker", as a lost node). Started again (a retry), it just runs the command.
KILL_AFTER_CHECKPOINT = """
import glob, os, signal, subprocess, sys, time
target, command = sys.argv[1], sys.argv[2:]
if os.path.exists("killed"):
    os.execv(command[0], command)
child = subprocess.Popen(command)
while not glob.glob("runs/*/checkpoint.pt") and child.poll() is None:
    time.sleep(0.005)
open("killed", "w").write(f"{child.poll()}")
child.kill()
child.wait()
os.kill(os.getppid() if target == "worker" else os.getpid(), signal.SIGKILL)
time.sleep(30)
"""


def launcher(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(LAUNCH), *args], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


def summary(stdout: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(env id, seed) -> (status, final return) from the launcher's summary table (its last column: the run folder)."""
    rows = re.findall(r"^  (\S+) seed (\d+)\s+(.+?)\s+\d+\s+[\d.]+ min\s+(\S+)  \S+$", stdout, re.MULTILINE)
    return {(env_id, seed): (status, score) for env_id, seed, status, score in rows}


def model_weights(workdir: Path) -> dict[str, torch.Tensor]:
    (path,) = workdir.glob("runs/*/pqn.cleanrl_model")
    return torch.load(path, weights_only=True)["model"]


def assert_same_weights(workdir_a: Path, workdir_b: Path) -> None:
    weights_a, weights_b = model_weights(workdir_a), model_weights(workdir_b)
    assert weights_a.keys() == weights_b.keys()
    for name, weight in weights_a.items():
        assert torch.equal(weight, weights_b[name]), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The four runs through the local backend, two at a time: (output dir, summary rows)."""
    out = tmp_path_factory.mktemp("local")
    args = ["--env-ids", *ENV_IDS, "--seeds", *SEEDS, "--workers", "2", "--output-dir", str(out)]
    result = launcher(*args, "--checkpoint-every", "4096", "--", *PQN)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = summary(result.stdout)
    assert len(rows) == 4 and all(status == "ok" and score != "-" for status, score in rows.values()), rows
    return out / "pqn", rows


RAY_HEAD = """
import os, sys, ray
ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
print(ray.get_runtime_context().gcs_address, os.environ.get("RAY_AUTH_MODE", "disabled"), flush=True)
sys.stdin.read()  # until the test closes it
ray.shutdown()
"""


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs, started by a process of its own (Ray's driver set-up stays out of pytest's):
    (address, environment). The launcher connects to it as a driver connects to a real cluster; a cluster that
    ray.init starts uses token authentication (Ray >= 2.59), whose token a driver reads from ~/.ray/ with
    RAY_AUTH_MODE=token."""
    pytest.importorskip("ray")
    head = subprocess.Popen([sys.executable, "-c", RAY_HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    address, auth_mode = head.stdout.readline().split()
    yield address, {"RAY_AUTH_MODE": auth_mode}
    head.communicate(timeout=60)


@needs_ray
def test_ray_runs_reproduce_local_runs(ray_cluster, reference, tmp_path):
    reference_dir, reference_rows = reference
    (address, env) = ray_cluster
    args = ["--backend", "ray", "--ray-address", address, "--env-ids", *ENV_IDS, "--seeds", *SEEDS]
    result = launcher(*args, "--output-dir", str(tmp_path), "--checkpoint-every", "4096", "--", *PQN, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary(result.stdout) == reference_rows
    for env_id in ENV_IDS:
        for seed in SEEDS:
            workdir = tmp_path / "pqn" / f"{env_id}__{seed}"
            assert "finished step 16384/16384" in (workdir / "console.log").read_text()
            assert_same_weights(workdir, reference_dir / f"{env_id}__{seed}")


@needs_ray
@pytest.mark.parametrize("killed, exact", [("run", True), ("worker", False)])
def test_ray_resumes_a_killed_run_from_its_checkpoint(killed, exact, ray_cluster, reference, tmp_path):
    """SIGKILL of the run (the launcher's task retries it) or of the Ray worker running it (Ray retries the task): the
    retry resumes the checkpoint. Resumed by fast-forwarding through the logged actions (--resume-args=), it ends with
    the weights and returns of the uninterrupted run; by default the cluster backends resume with fresh games."""
    reference_dir, reference_rows = reference
    (address, env) = ray_cluster
    args = ["--backend", "ray", "--ray-address", address, "--env-ids", "CartPole-v1", "--seeds", "1"]
    args += ["--resume-args="] if exact else []
    wrapped = [sys.executable, "-c", KILL_AFTER_CHECKPOINT, killed, *PQN]
    result = launcher(*args, "--output-dir", str(tmp_path), "--checkpoint-every", "4096", "--", *wrapped, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    workdir = tmp_path / "pqn" / "CartPole-v1__1"
    assert (workdir / "killed").read_text() == "None"  # killed while it was running
    log = (workdir / "console.log").read_text()
    assert "resume: continuing" in log and "finished step 16384/16384" in log
    assert len(list((workdir / "runs").iterdir())) == 1
    if exact:
        assert "resume: fast-forwarding" in log
        assert summary(result.stdout) == {("CartPole-v1", "1"): reference_rows[("CartPole-v1", "1")]}
        assert_same_weights(workdir, reference_dir / "CartPole-v1__1")
    else:
        assert "resume: fresh environments" in log and "resume: fast-forwarding" not in log


@needs_ray
def test_sigterm_to_the_ray_launcher_stops_its_runs_with_a_checkpoint(ray_cluster, tmp_path):
    """The launcher cancels its tasks; Ray interrupts each running one, which stops its run with SIGTERM and waits for
    its checkpoint; the launcher exits with 143 and no run is left."""
    from test_launch_faults import RUN, alive, start_launcher, wait_for

    (address, env) = ray_cluster
    args = ["--backend", "ray", "--ray-address", address, "--output-dir", str(tmp_path), "--env-ids", "A", "B"]
    launcher = start_launcher(*args, "--seeds", "1", "--", sys.executable, "-c", RUN, env=env)
    running = [tmp_path / "run" / f"{env_id}__1" for env_id in ("A", "B")]
    wait_for([workdir / "pid" for workdir in running], launcher, seconds=120)
    pids = [int((workdir / "pid").read_text()) for workdir in running]
    os.killpg(launcher.pid, signal.SIGTERM)
    stdout, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 143 and "Traceback" not in stdout + stderr, stdout + stderr
    for workdir, pid in zip(running, pids):
        assert (workdir / "runs" / "r" / "checkpoint.pt").read_text() == str(int(signal.SIGTERM))
        assert not alive(pid)
    assert summary(stdout) == {("A", "1"): ("stopped (exit 143)", "-"), ("B", "1"): ("stopped (exit 143)", "-")}


def load_launch():
    return import_file(LAUNCH, "launch")


def job_process(controller_pid: int) -> int:
    """The pid of the job that submitit's local controller started (its only child)."""
    for _ in range(200):
        children = Path(f"/proc/{controller_pid}/task/{controller_pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("submitit's local controller started no job")


@needs_submitit
def test_slurm_job_is_checkpointed_requeued_and_resumed(reference, tmp_path, monkeypatch):
    """The Slurm backend's job, run by submitit's local executor: its USR2 (Slurm's warning of preemption or time-out)
    stops the run with SIGTERM, the run writes its checkpoint, submitit requeues the job, and the requeued job resumes
    the checkpoint to the end that the uninterrupted run reached."""
    import submitit

    launch = load_launch()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(LAUNCH.parent), os.environ.get("PYTHONPATH", "")]))
    args, command = launch.parse_args(
        ["--backend", "slurm", "--output-dir", str(tmp_path), "--checkpoint-every", "4096", "--env-ids", "CartPole-v1"]
        + ["--seeds", "1", "--", *PQN]
    )
    (job,) = launch.make_jobs(args.env_ids, args.seeds, command, args)
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit", max_num_timeout=3)
    executor.update_parameters(timeout_min=5)
    handle = executor.submit(launch.SlurmRun(job, dict(max_retries=0, backend="slurm")))
    workdir, deadline = Path(job.workdir), time.time() + 120
    while not list(workdir.glob("runs/*/checkpoint.pt")):
        assert handle.get_info()["jobState"] == "RUNNING" and time.time() < deadline, handle.stdout()
        time.sleep(0.01)
    os.kill(job_process(handle._process.pid), signal.SIGUSR2)
    done = handle.result()
    assert done.returncode == 0 and done.attempts == 2 and done.final_return is not None
    log = (workdir / "console.log").read_text()
    assert "stopping after this step, with a checkpoint" in log and "resume: continuing" in log
    assert "Requeued job" in handle.stdout() + handle.stderr()
    assert f"{done.final_return:.2f}" == reference[1][("CartPole-v1", "1")][1]
    assert_same_weights(workdir, reference[0] / "CartPole-v1__1")


@needs_submitit
def test_slurm_submission_of_a_gpu_atari_sweep(tmp_path):
    result = launcher(
        "--backend", "slurm", "--dry-run", "--partition", "gpu", "--time", "2-00:00:00", "--gpus-per-run", "1",
        "--cpus-per-run", "8", "--mem-gb", "12", "--slurm-option", "account=rl", "--output-dir", str(tmp_path),
        "--checkpoint-every", "1000000", "--wandb-group", "recurrent_iqn", "--env-ids", "Breakout-v5", "Pong-v5",
        "--seeds", "1", "--", "python", "cleanrl/recurrent_iqn_atari.py", "--track", "--save-model",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for line in [
        "#SBATCH --partition=gpu",
        "#SBATCH --time=2880",  # minutes
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=12GB",
        "#SBATCH --array=0-1%2",  # one array task per (env, seed)
        "#SBATCH --signal=USR2@120",  # the warning that makes the job checkpoint and requeue
        "#SBATCH --job-name=launch-recurrent_iqn_atari",
        "#SBATCH --account=rl",
        f"#SBATCH --output={tmp_path}/submitit/%A_%a/%A_%a_0_log.out",
    ]:
        assert line in lines, result.stdout
    assert any(line.startswith("srun --unbuffered") and "-m submitit.core._submit" in line for line in lines)
    script = REPO / "cleanrl" / "recurrent_iqn_atari.py"
    workdir = tmp_path / "recurrent_iqn_atari" / "Pong-v5__1"
    assert lines[-1] == (
        f"(in {workdir}) WANDB_RUN_GROUP=recurrent_iqn python {script} --track --save-model --env-id Pong-v5 --seed 1 "
        "--checkpoint-every 1000000"
    )


# A stand-in training script, run in its job's directory: the 1st start makes a run directory and fails before any
# checkpoint, the 2nd makes another, writes a checkpoint and fails, the 3rd (a resume) records its flags and succeeds.
FLAKY = """
import os, pathlib, sys
start = len(list(pathlib.Path(".").glob("start-*"))) + 1
pathlib.Path(f"start-{start}").write_text(" ".join(sys.argv[1:]))
run = pathlib.Path(f"runs/E__flaky__1__{100 + start}")
if start < 3:
    run.mkdir(parents=True)
if start == 2:
    (run / "checkpoint.pt").write_text("state")
sys.exit(0 if start == 3 else 1)
"""


def test_retries_resume_the_checkpoint_and_a_second_launch_skips_finished_runs(tmp_path):
    args = ["--output-dir", str(tmp_path), "--max-retries", "2", "--resume-args=--fresh-envs", "--env-ids", "E"]
    command = ["--seeds", "1", "--", sys.executable, "-c", FLAKY, "--exp-name", "flaky"]
    result = launcher(*args, *command)
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary(result.stdout) == {("E", "1"): ("ok", "-")}
    workdir = tmp_path / "flaky" / "E__1"
    # the directory of the start that left no checkpoint is set aside; the third start resumes the second's checkpoint
    assert sorted(p.name for p in (workdir / "runs").iterdir()) == ["E__flaky__1__101.failed", "E__flaky__1__102"]
    checkpoint = workdir / "runs" / "E__flaky__1__102" / "checkpoint.pt"
    assert (workdir / "start-2").read_text() == "--exp-name flaky --env-id E --seed 1"
    assert (workdir / "start-3").read_text() == f"--exp-name flaky --env-id E --seed 1 --resume {checkpoint} --fresh-envs"
    assert "== attempt 3 of 3:" in (workdir / "console.log").read_text()

    again = launcher(*args, *command)
    assert again.returncode == 0 and summary(again.stdout) == {("E", "1"): ("ok (finished before)", "-")}
    assert not (workdir / "start-4").exists()


class RunsCode:
    """Unpickling this object creates the file `marker` (the pickle names builtins.open, not this class)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_checkpoint_in_an_output_folder_is_refused_and_runs_no_code(tmp_path):
    run_dir = tmp_path / "pqn" / "CartPole-v1__1" / "runs" / "CartPole-v1__pqn__1__100"
    run_dir.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    torch.save({"format": 3, "state": RunsCode(str(marker))}, run_dir / "checkpoint.pt")
    result = launcher("--output-dir", str(tmp_path), "--env-ids", "CartPole-v1", "--seeds", "1", "--", *PQN)
    assert result.returncode == 1 and summary(result.stdout)[("CartPole-v1", "1")][0] == "FAILED (exit 1)"
    log = (tmp_path / "pqn" / "CartPole-v1__1" / "console.log").read_text()
    assert "not a readable checkpoint (it holds Python objects other than tensors and plain values" in log
    assert "Traceback" not in log and not marker.exists()
    torch.load(run_dir / "checkpoint.pt", weights_only=False)  # the file is not harmless: read unsafely, it runs code
    assert marker.exists()


def test_a_run_that_keeps_failing_fails_the_launch(tmp_path):
    args = ["--output-dir", str(tmp_path), "--max-retries", "1", "--env-ids", "E", "--seeds", "1"]
    result = launcher(*args, "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert result.returncode == 1
    assert summary(result.stdout) == {("E", "1"): ("FAILED (exit 3)", "-")}
    assert "0/1 runs succeeded, 1 failed" in result.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_run_stopped_by_a_signal_is_not_retried(tmp_path, signum):
    args = ["--output-dir", str(tmp_path), "--max-retries", "2", "--env-ids", "E", "--seeds", "1"]
    result = launcher(*args, "--", sys.executable, "-c", f"import sys; print('attempt'); sys.exit({128 + signum})")
    assert result.returncode == 1 and result.stdout.count("attempt\n") == 1
    assert summary(result.stdout) == {("E", "1"): (f"stopped (exit {128 + signum})", "-")}


def test_benchmark_scripts_pass_launcher_args_to_every_launch():
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])  # `python` is this one
    env = {**os.environ, "PATH": path, "LAUNCHER_ARGS": "--dry-run --output-dir /cluster/out", "TRACK": "1", "ATARI": "1"}
    result = subprocess.run(["bash", "benchmark/pqn.sh"], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("pqn.sh: 46 runs in 4 launches, estimated time about ")
    commands = [line for line in result.stdout.splitlines() if line.startswith("(in ")]
    assert len(commands) == 10 + 2 * 3 + 2 * 5 * 3  # CartPole x 10, Acrobot and MountainCar x 3, 2 Atari scripts
    assert all(line.startswith("(in /cluster/out/pqn") and "WANDB_RUN_GROUP=pqn " in line for line in commands), commands


@pytest.mark.parametrize(
    "hidden, args, message",
    [
        ("ray", ["--backend", "ray"], f"error: --backend ray needs the cluster extra: {EXTRA}"),
        ("submitit", ["--backend", "slurm"], f"error: --backend slurm needs the cluster extra: {EXTRA}"),
        (None, ["--backend", "k8s"], "error: argument --backend: invalid choice: 'k8s' (choose from "),
    ],
)
def test_missing_extra_and_unknown_backend_give_one_line(hidden, args, message):
    """The extra is hidden from the launcher (an import of None fails), whether or not it is installed."""
    hide = f"sys.modules[{hidden!r}] = None; " if hidden else ""
    code = f"import runpy, sys; {hide}sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    argv = [str(LAUNCH), *args, "--env-ids", "CartPole-v1", "--seeds", "1", "--", "python", "x.py"]
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(message), line


@needs_ray
@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1:1", r"error: --ray-address=127.0.0.1:1: no Ray cluster answers there \(.*\); start one with `ray "),
        ("nonsense", "error: --ray-address=nonsense: must be auto, HOST:PORT or ray://HOST:PORT"),
    ],
)
def test_bad_ray_address_gives_one_line(address, message):
    result = launcher("--backend", "ray", "--ray-address", address, "--env-ids", "CartPole-v1", "--seeds", "1", "--", "x")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert re.fullmatch(message + ".*", line), line


def test_slurm_time_limits_in_minutes():
    launch = load_launch()
    assert [launch.slurm_minutes(limit) for limit in ["90", "10:30", "1:30:00", "2-00:00:00", "1-12", "0-00:00:01"]] == [
        90,
        11,
        90,
        2880,
        2160,
        1,
    ]
