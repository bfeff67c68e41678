"""Flag checks: every range a flag shared by several scripts must lie in (`FLAG_RANGES`, `COUNT_FLAGS`), checked once
by `check_common_flags` before a script's own cross-flag rules; the env id, the memory a run will need, the
`--eval-only` and `--capture-video` flags. Each failed check stops the run with one line naming the flag, its value
and what is allowed (`flag_errors.flag_error`).

Layer 3 (checks and helpers): imports flag_errors, minatar and classic_control."""

import contextlib
import importlib.util
import math
import netrc
import os
import urllib.parse
from dataclasses import replace
from typing import Optional

import gymnasium as gym

from cleanrl_q_utils import classic_control, minatar
from cleanrl_q_utils.flag_errors import PLAIN_NAME_RULE, available_memory_bytes, flag_error, is_plain_name

# Ranges of the flags that several scripts share, checked by `check_common_flags` for every field a script has.
# NaN fails every test (comparisons with NaN are false).
FLAG_RANGES = {
    **dict.fromkeys(
        ("learning_rate", "adam_eps", "kappa", "prioritized_replay_eps", "replay_ratio"), (lambda v: 0 < v < math.inf, "> 0")
    ),
    "max_grad_norm": (lambda v: v > 0, "> 0 (inf: no clipping)"),
    **dict.fromkeys(
        ("gamma", "q_lambda", "start_e", "end_e", "eval_epsilon", "priority_eta"), (lambda v: 0 <= v <= 1, "in [0, 1]")
    ),
    # Schaul et al.'s exponents: alpha 0 is uniform replay, 1 full prioritization; beta 1 fully corrects the bias.
    **dict.fromkeys(("prioritized_replay_alpha", "prioritized_replay_beta"), (lambda v: 0 <= v <= 1, "in [0, 1]")),
    "exploration_fraction": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "min_epsilon": (lambda v: v is None or 0 <= v <= 1, "in [0, 1] (or None: --end-e)"),
    **dict.fromkeys(
        (
            "epsilon_alpha",
            "learning_starts",
            "burn_in",
            "checkpoint_every",
            "eval_episodes",
        ),
        (lambda v: 0 <= v < math.inf, ">= 0"),
    ),
    # envpool takes int32 seeds; evaluation envs are seeded a little above the run's seed.
    "seed": (lambda v: 0 <= v < 2**31 - 2**16, "in [0, 2147418112) (envpool takes 32-bit signed seeds)"),
}


# What --capture-video imports, by kind of environment (module, pip package).
VIDEO_MODULES = {
    "atari": [("moviepy", "moviepy"), ("ale_py", "ale-py"), ("cv2", "opencv-python")],
    "classic": [("moviepy", "moviepy"), ("pygame", "pygame")],
    "minatar": [("moviepy", "moviepy")],
}


COUNT_FLAGS = (  # numbers of things: at least 1
    "total_timesteps num_envs num_steps num_minibatches update_epochs batch_size buffer_size seq_len n_step "
    "train_frequency target_network_frequency target_update_period hidden_size lstm_size quantile_embedding_dim "
    "num_tau_samples "
    "num_tau_prime_samples num_quantile_samples log_interval max_episode_steps frame_stack sequence_period"
).split()


def check_common_flags(args) -> None:
    """Range checks of every flag in FLAG_RANGES and COUNT_FLAGS that `args` has, before the script's own checks: a
    learning rate of 0 or NaN, a negative max grad norm (it would flip the gradient), an epsilon above 1 stop here."""
    check_flag_ranges(vars(args))
    if not is_plain_name(args.exp_name, 100):
        flag_error("exp_name", args.exp_name, f"must be a plain name: {PLAIN_NAME_RULE}, at most 100 bytes")
    if args.track:
        check_wandb_login()
    if "learning_starts" in vars(args) and args.total_timesteps <= args.learning_starts:
        flag_error("total_timesteps", args.total_timesteps, f"must exceed --learning-starts={args.learning_starts}")
    # Every action of the run is logged (a byte per environment step) so that a resume can replay it.
    check_memory(args.total_timesteps, "the action log", f"--total-timesteps={args.total_timesteps}")
    check_evaluation_flags(args)


def check_flag_ranges(values: dict) -> None:
    """Range checks of the flags among `values` (name: value) that are in FLAG_RANGES or COUNT_FLAGS."""
    for name, value in values.items():
        if name in COUNT_FLAGS and not (isinstance(value, int) and value >= 1):
            flag_error(name, value, "must be a whole number >= 1")
        if name in FLAG_RANGES and not FLAG_RANGES[name][0](value):
            flag_error(name, value, f"must be {FLAG_RANGES[name][1]}")


def check_wandb_login() -> None:
    """--track needs a Weights & Biases login (or offline logging); without one, wandb would stop the run after its
    folder exists, or wait for a key typed in."""
    if importlib.util.find_spec("wandb") is None:
        raise SystemExit("error: --track needs wandb, not installed: pip install wandb")
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    with contextlib.suppress(OSError, netrc.NetrcParseError):
        if netrc.netrc(os.environ.get("NETRC")).authenticators(host):
            return
    raise SystemExit(
        "error: --track: no Weights & Biases login found; run `wandb login`, set WANDB_API_KEY, or set "
        "WANDB_MODE=offline to log locally and `wandb sync` later"
    )


def rounded_total(args, total: int) -> int:
    """`total` rounded up to whole iterations of a script's loop: PQN rollouts (--num-envs x --num-steps), else steps
    of every environment (--num-envs)."""
    per_iteration = getattr(args, "num_envs", 1) * getattr(args, "num_steps", 1)
    return -(-total // per_iteration) * per_iteration


def whole_iterations(args):
    """`args` with --total-timesteps a whole number of iterations: a total between two multiples is rounded up,
    with a note, rather than run short without a word."""
    total = rounded_total(args, args.total_timesteps)
    if total != args.total_timesteps:
        print(f"note: --total-timesteps={args.total_timesteps} rounded up to {total}, a whole number of iterations")
    return replace(args, total_timesteps=total)


def check_evaluation_flags(args) -> None:
    """--eval-only needs a model file; --capture-video needs its optional packages, checked now rather than after
    hours of training, and something to record (only evaluation episodes are recorded)."""
    if args.eval_only and args.model_path is None:
        flag_error("eval_only", True, "needs --model-path PATH (a model written by --save-model)")
    if args.model_path is not None and not args.eval_only:
        flag_error("model_path", args.model_path, "is only read with --eval-only")
    if args.eval_only and args.resume is not None:
        flag_error("resume", args.resume, "cannot be combined with --eval-only")
    if args.model_path is not None and not os.path.isfile(args.model_path):
        flag_error("model_path", args.model_path, "not a file" if os.path.exists(args.model_path) else "no such file")
    if args.capture_video:
        check_video_modules(args.env_id)
        if not (args.save_model or args.eval_only):
            print("warning: --capture-video records the evaluation episodes, which only --save-model or --eval-only play")


def check_video_modules(env_id: str) -> None:
    """One line naming every missing package of --capture-video and the install command."""
    needed = VIDEO_MODULES["atari" if env_id.endswith("-v5") else "minatar" if minatar.is_minatar(env_id) else "classic"]
    missing = [package for module, package in needed if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(f'error: --capture-video needs {", ".join(missing)}, not installed: pip install -e ".[video]"')


def check_env_id(env_id: str, atari: Optional[bool] = None):
    """The envpool spec of `env_id`, after checking that envpool knows it, that its actions are discrete and, with
    `atari` given, that it is (True) or is not (False) an Atari game of image observations. MinAtar ids (gymnasium's)
    are for the scripts of vector observations, which give their 10x10 images a torso of their own. Where envpool is not
    installed (it has Linux wheels only), classic control is gymnasium's and an Atari id stops with one line."""
    if minatar.is_minatar(env_id):
        if atari:
            flag_error("env_id", env_id, "a MinAtar game: this script needs an Atari game; its twin for vectors plays MinAtar")
        return minatar.spec(env_id)
    envpool = classic_control.import_envpool()
    if envpool is None:
        return classic_control.check_env_id(env_id, atari)
    if env_id not in envpool.list_all_envs():
        flag_error("env_id", env_id, "not an envpool environment id (e.g. CartPole-v1, Breakout-v5)")
    spec = envpool.make_spec(env_id)
    if not isinstance(spec.action_space, gym.spaces.Discrete):
        flag_error("env_id", env_id, f"has a {type(spec.action_space).__name__} action space; discrete actions needed")
    if atari is not None and (len(spec.observation_space.shape) == 3) != atari:
        kind = "an Atari game (e.g. Breakout-v5)" if atari else "vector observations (e.g. CartPole-v1)"
        flag_error("env_id", env_id, f"this script needs {kind}; its docs page names the script for the other kind")
    return spec


def check_memory(needed_bytes: int, what: str, flags: str) -> None:
    """Stops before allocating when `what` (e.g. "the replay") would not fit in the available RAM; `flags` names the
    flags and values that set its size, e.g. "--buffer-size=1000000"."""
    available = available_memory_bytes()
    if needed_bytes > available:
        raise SystemExit(
            f"error: {flags}: {what} needs about {needed_bytes / 1e9:,.1f} GB but {available / 1e9:,.1f} GB are "
            "available; lower it"
        )


# Resident memory one environment adds, rounded up from measurements (process RSS before and after building 8 to 1,024
# envs and stepping them 50 times, envpool 1.2 on a 2-core CPU): envpool Atari 1.3-1.7 MB, envpool CartPole 9-17 KB,
# a MinAtar game under gymnasium about 20 KB (after a one-off 100 MB for the package, not counted here).
ENV_BYTES = {"atari": 2 * 2**20, "classic": 64 * 2**10, "minatar": 64 * 2**10}
FLOAT_BYTES = 4  # the networks, their gradients and optimizer moments, and their activations are float32


def env_memory_bytes(env_id: str, count: int) -> int:
    """An upper bound of the memory `count` environments of `env_id` take (ENV_BYTES)."""
    kind = "atari" if env_id.endswith("-v5") else "minatar" if minatar.is_minatar(env_id) else "classic"
    return count * ENV_BYTES[kind]


def network_memory_bytes(parameters: int, copies: int) -> int:
    """Bytes of `copies` float32 copies of a network of `parameters` parameters: the weights, a target network, the
    gradients, the optimizer's moments, a model file's weights read back."""
    return FLOAT_BYTES * parameters * copies


def activation_memory_bytes(samples: int, floats_per_sample: int) -> int:
    """Bytes of an update's activations: every layer output of the `samples` inputs of a differentiated pass
    (`floats_per_sample` floats each) kept for the backward pass, and half as much again for the gradients and
    temporaries alive at the peak. Against the growth of a process's peak memory with the batch (CPU, one update),
    the scripts' estimates are upper bounds: 1.7 times for R2D2's Atari update (batches of 4 and 8 sequences of 85
    trained positions: 125 MB more), 3.1 times for IQN's (batches of 8 and 32: 88 MB more)."""
    return FLOAT_BYTES * samples * floats_per_sample * 3 // 2


def linear_parameters(inputs: int, outputs: int) -> int:
    """Parameters of nn.Linear(inputs, outputs): weights and biases."""
    return inputs * outputs + outputs


def lstm_parameters(inputs: int, hidden: int) -> int:
    """Parameters of a one-layer nn.LSTM (or LSTMCell): four gates, each with input and hidden weights and two biases."""
    return 4 * (inputs * hidden + hidden * hidden + 2 * hidden)


def conv_parameters(in_channels: int, out_channels: int, kernel: int) -> int:
    return in_channels * out_channels * kernel * kernel + out_channels


# What a run holds in the GPU's memory when it trains on one (--cuda and a GPU present); the rest stays in RAM.
DEVICE_NEEDS = ("the network", "the network and its copies", "an update's activations")


def check_run_memory(args, needs: list[tuple[str, int, tuple[str, ...]]]) -> list[tuple[str, list[tuple[str, int]], int]]:
    """Stops before anything is built when the sum of what the run will allocate does not fit in the available RAM, or
    in the GPU's free memory for what a GPU run holds there (DEVICE_NEEDS). `needs` holds (what, bytes, flags that set
    its size) for each allocation that grows with a flag: the replay or rollout, the networks with their copies, an
    update's activations, the environments. Returns what it checked, for the start-up block to say: (where: "" for the
    RAM, " on the GPU", [(what, bytes)] of the needs there, the bytes available there) of each place."""
    on_gpu = gpu_used(args)
    in_ram = [need for need in needs if not (on_gpu and need[0] in DEVICE_NEEDS)]
    checked = [("", in_ram, available_memory_bytes())]
    if on_gpu:
        import torch

        checked.append((" on the GPU", [need for need in needs if need[0] in DEVICE_NEEDS], torch.cuda.mem_get_info()[0]))
    for where, place_needs, available in checked:
        refuse_beyond(args, place_needs, available, where)
    return [(where, [(what, size) for what, size, _ in place_needs], available) for where, place_needs, available in checked]


def gpu_used(args) -> bool:
    """Whether the run will put its networks on a GPU (as run_folder.pick_device decides)."""
    if not getattr(args, "cuda", False):
        return False
    import torch

    return torch.cuda.is_available()


def refuse_beyond(args, needs: list[tuple[str, int, tuple[str, ...]]], available: int, where: str) -> None:
    """Stops when the `needs` add up to more than `available` bytes, with one line naming the flags of the largest
    need (the flag furthest above its default first), its size and every other need's share."""
    total = sum(size for _, size, _ in needs)
    if total <= available:
        return
    needs = sorted(needs, key=lambda need: -need[1])
    what, largest, flags = needs[0]
    defaults = type(args)()

    def above_default(flag: str) -> float:
        default = getattr(defaults, flag, None)
        return getattr(args, flag) / default if isinstance(default, int) and default > 0 else 1.0

    named = " ".join(
        f"--{flag.replace('_', '-')}={getattr(args, flag)}" for flag in sorted(flags, key=lambda flag: -above_default(flag))
    )
    rest = ", ".join(f"{other} {size / 1e9:,.1f} GB" for other, size, _ in needs[1:] if size >= 0.05e9)
    whole = f" (about {total / 1e9:,.1f} GB in all; {rest})" if rest else ""
    verb = "need" if what.endswith("s") else "needs"
    raise SystemExit(
        f"error: {named}: {what} {verb} about {largest / 1e9:,.1f} GB{whole} but {available / 1e9:,.1f} GB are available"
        f"{where}; lower it"
    )


def common_needs(
    args, parameters: int, copies: int, network_flags: tuple, evaluation_envs: int, acting_floats: int
) -> list[tuple[str, int, tuple[str, ...]]]:
    """The needs (for `check_run_memory`) every script has: in training, `copies` float32 copies of a network of
    `parameters` (weights, target network, gradients, optimizer moments), --num-envs envs and the action log;
    with --save-model or --eval-only, the evaluation's network and its model file's weights (read once, held while
    the evaluation runs) and its `evaluation_envs` envs (one with --capture-video), whose every forward pass
    holds at most `acting_floats` floats per env (as the training envs' do: no gradient is kept)."""
    needs = []
    if args.eval_only or args.save_model:
        envs = 1 if args.capture_video else evaluation_envs
        playing = env_memory_bytes(args.env_id, envs) + FLOAT_BYTES * acting_floats * envs
        needs.append(("the evaluation environments", playing, ("eval_episodes",)))
    evaluation_copies = 2 if args.eval_only or args.save_model else 0
    if args.eval_only:
        return needs + [("the network", network_memory_bytes(parameters, evaluation_copies), network_flags)]
    networks = network_memory_bytes(parameters, copies + evaluation_copies)
    needs.append(("the network and its copies", networks, network_flags))
    acting = env_memory_bytes(args.env_id, args.num_envs) + FLOAT_BYTES * acting_floats * args.num_envs
    # a byte per agent step: every action is logged for a resume to replay (check_common_flags checks it alone)
    action_log = ("the action log", rounded_total(args, args.total_timesteps), ("total_timesteps",))
    return needs + [("the training environments", acting, ("num_envs",)), action_log]
