"""Tests of the PQN family: Q(lambda) math, envpool reset-step handling, true scores, smoke runs, learning."""

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl import pqn, pqn_atari_envpool, pqn_atari_envpool_lstm
from cleanrl_q_utils.checkpoint_files import read_checkpoint
from cleanrl_q_utils.flat_radam import RAdam, flatten_parameters

from helpers import assert_synced_to_offline_wandb, checkpoint_of
from interrupts import interrupt_at_step, run_until_stopped
from learning import last_mean, passes_with_one_of
from tiny import tiny

REPO = Path(__file__).resolve().parents[1]
ALL_SCRIPTS = [pqn, pqn_atari_envpool, pqn_atari_envpool_lstm]


def q_lambda_reference(rewards, next_dones, next_max_q, gamma, lam):
    """Plain scalar loop over each environment, from the definition of the recursion."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    out = [[0.0] * num_envs for _ in range(num_steps)]
    for e in range(num_envs):
        following = None
        for t in reversed(range(num_steps)):
            r, d, q = float(rewards[t][e]), float(next_dones[t][e]), float(next_max_q[t][e])
            if following is None:
                value = r + gamma * (1 - d) * q
            else:
                value = r + gamma * (1 - d) * (lam * following + (1 - lam) * q)
            out[t][e] = value
            following = value
    return out


@pytest.mark.parametrize("module", ALL_SCRIPTS, ids=lambda m: m.__name__.split(".")[-1])
@pytest.mark.parametrize("lam", [0.0, 0.65, 1.0])
def test_q_lambda_returns_match_plain_loop(module, lam):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(37, 5, generator=gen)
    next_dones = (torch.rand(37, 5, generator=gen) < 0.15).float()
    next_max_q = torch.randn(37, 5, generator=gen) * 3
    got = module.q_lambda_returns(rewards, next_dones, next_max_q, 0.97, lam)
    want = torch.tensor(q_lambda_reference(rewards.tolist(), next_dones.tolist(), next_max_q.tolist(), 0.97, lam))
    assert got.shape == (37, 5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_q_lambda_hand_worked():
    # one env, 3 steps, episode ends after step 1: G2 = 1 + .5*4 = 3; G1 = 2 (terminal); G0 = 1 + .5*(.5*2 + .5*10) = 4
    rewards = torch.tensor([[1.0], [2.0], [1.0]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])
    next_max_q = torch.tensor([[10.0], [99.0], [4.0]])
    got = pqn.q_lambda_returns(rewards, dones, next_max_q, 0.5, 0.5)
    torch.testing.assert_close(got, torch.tensor([[4.0], [2.0], [3.0]]))


def test_reset_step_folding_bootstraps_time_outs_and_cuts_terminations():
    """Env 0 is truncated after step 1, env 1 terminates after step 1; step 2 is the reset step of both."""
    gamma, lam = 0.9, 0.65
    rewards = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    terminations = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    is_reset = torch.tensor([[False, False], [False, False], [True, True], [False, False]])
    max_q = torch.tensor([[5.0, 5.0], [6.0, 6.0], [7.0, 7.0], [-50.0, -50.0]])  # max_q[2] = value of the final obs
    next_max_q = torch.cat([max_q[1:], torch.tensor([[-60.0, -60.0]])])
    r, d = pqn.fold_reset_steps(rewards, terminations, max_q, is_reset)
    returns = pqn.q_lambda_returns(r, d, next_max_q, gamma, lam)
    # time-out: full bootstrap from the final observation, nothing from the next episode (whose values are -50, -60)
    assert returns[1, 0].item() == pytest.approx(1.0 + gamma * 7.0)
    # termination: no bootstrap at all
    assert returns[1, 1].item() == pytest.approx(1.0)
    assert returns[0, 0].item() == pytest.approx(1.0 + gamma * (lam * (1.0 + gamma * 7.0) + (1 - lam) * 6.0))


class ScriptedPool:
    """envpool-like vectorized env with NEXT_STEP autoreset, driven by a script of episodes.

    Each env plays episodes from `episodes[i]`: a list of (length, end, lives) where end is "term" or "trunc" and
    the game has `lives` lives, losing one evenly through the episode. Step k of an episode gives raw reward k+1
    and observation value k+1 (the reset step gives observation 0 and reward 0). With `episodic_life`, a life loss
    ends the training episode (terminated=True) and is followed by a reset step, as envpool does.
    """

    def __init__(self, episodes, obs_shape, num_actions=3, episodic_life=False, reward_clip=False, dtype=np.uint8):
        self.episodes, self.obs_shape, self.dtype = episodes, obs_shape, dtype
        self.num_envs = len(episodes)
        self.single_observation_space = gym.spaces.Box(0, 255, obs_shape, np.uint8)
        self.single_action_space = gym.spaces.Discrete(num_actions)
        self.episodic_life, self.reward_clip = episodic_life, reward_clip
        self.cursor = [0] * self.num_envs
        self.t = [0] * self.num_envs
        self.pending_reset = [False] * self.num_envs
        self.reset_steps_seen = 0

    def _obs(self, values):
        return np.stack([np.full(self.obs_shape, v, dtype=self.dtype) for v in values])

    def reset(self):
        return self._obs([0] * self.num_envs), {}

    def step(self, actions):
        n = self.num_envs
        obs, rew, term, trunc = [0] * n, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
        raw, game_over, lives = np.zeros(n), np.zeros(n, bool), np.zeros(n, np.int32)
        for i in range(n):
            length, end, num_lives = self.episodes[i][self.cursor[i] % len(self.episodes[i])]
            if self.pending_reset[i]:
                self.pending_reset[i] = False
                self.reset_steps_seen += 1
                if self.t[i] >= length:  # the game is over: next episode
                    self.cursor[i] += 1
                    self.t[i] = 0
                continue  # reward 0, obs 0, no flags
            k = self.t[i]
            self.t[i] += 1
            obs[i], raw[i] = k + 1, k + 1
            rew[i] = np.sign(raw[i]) if self.reward_clip else raw[i]
            life_len = length // num_lives
            lives[i] = num_lives - self.t[i] // life_len
            if self.t[i] == length:
                term[i], trunc[i] = end == "term", end == "trunc"
                game_over[i] = end == "term"
                self.pending_reset[i] = True
            elif self.episodic_life and self.t[i] % life_len == 0:
                term[i] = True
                self.pending_reset[i] = True
        info = {"reward": raw, "terminated": game_over.astype(np.int32), "lives": lives}
        return self._obs(obs), rew, term, trunc, info

    def close(self):
        pass


def test_atari_true_scores_cover_all_lives_and_time_outs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    episodes = [[(12, "term", 3), (9, "trunc", 3)], [(6, "trunc", 2), (15, "term", 3)]]
    pools = []

    def fake_make_env(env_id, num_envs, seed, episodic_life=True, reward_clip=True):
        pools.append(ScriptedPool(episodes, (4, 84, 84), episodic_life=episodic_life, reward_clip=reward_clip))
        return pools[-1]

    monkeypatch.setattr(pqn_atari_envpool, "make_env", fake_make_env)
    args = pqn_atari_envpool.Args(**tiny("pqn_atari_envpool", total_timesteps=2 * 64, num_envs=2, num_steps=16))
    scores = pqn_atari_envpool.main(args)
    # A game of length L scores 1 + ... + L (unclipped, all lives) and takes L steps plus one reset step per life.
    # Env 0 finishes games at steps 14 (78), 26 (45, time-out), 41 (78), 53 (45);
    # env 1 at steps 7 (21, time-out), 25 (120), 33 (21), 51 (120), 59 (21), within its 64 steps.
    assert scores == [21.0, 78.0, 120.0, 45.0, 21.0, 78.0, 120.0, 45.0, 21.0]
    assert pools[0].reset_steps_seen == 4 * 3 + 5 * 3 - 1  # every life ends in a reset step; env 1's last one is pending


def test_reset_steps_never_enter_the_loss(monkeypatch, tmp_path):
    """With a scripted env whose reset steps would teach Q(s_last, a) = huge, the masked loss ignores them."""
    monkeypatch.chdir(tmp_path)
    seen_valid = []
    original = pqn.fold_reset_steps

    def spy(rewards, terminations, max_q, is_reset_step):
        seen_valid.append(is_reset_step.clone())
        return original(rewards, terminations, max_q, is_reset_step)

    monkeypatch.setattr(pqn, "fold_reset_steps", spy)
    monkeypatch.setattr(
        pqn,
        "make_env",
        lambda env_id, num_envs, seed: ScriptedPool([[(5, "term", 1)], [(3, "trunc", 1)]], (4,), dtype=np.float32),
    )
    args = pqn.Args(env_id="CartPole-v1", total_timesteps=2 * 40, num_envs=2, num_steps=20, num_minibatches=2)
    scores = pqn.main(args)
    assert set(scores) == {15.0, 6.0}
    masks = torch.cat(seen_valid)  # (steps, envs)
    # env 0: episodes of 5 steps then one reset step -> every 6th step (index 5, 11, ...) is a reset step
    assert masks[:, 0].nonzero().flatten().tolist() == list(range(5, 40, 6))
    assert masks[:, 1].nonzero().flatten().tolist() == list(range(3, 40, 4))


@pytest.mark.parametrize(
    "module, flags, flag_name",
    [
        (pqn, ["--num-minibatches", "3", "--num-envs", "4", "--num-steps", "128"], "--num-minibatches"),
        (pqn, ["--env-id", "Pendulum-v1"], "--env-id"),
        (pqn, ["--env-id", "NoSuchGame-v9"], "--env-id"),
        (pqn_atari_envpool, ["--env-id", "CartPole-v1"], "--env-id"),
        (pqn_atari_envpool_lstm, ["--num-minibatches", "3"], "--num-minibatches"),
    ],
)
def test_bad_flags_give_one_clear_message(module, flags, flag_name, tmp_path):
    script = REPO / "cleanrl" / (module.__name__.split(".")[-1] + ".py")
    result = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0
    assert flag_name in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def _tb_scalars(run_dir: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return [event.value for event in acc.Scalars(tag)]


def test_pqn_smoke_with_saved_model(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    args = pqn.Args(total_timesteps=4096, num_envs=8, num_steps=32, save_model=True, eval_episodes=4)
    scores = pqn.main(args)
    assert len(scores) > 0 and all(np.isfinite(scores))
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "pqn.cleanrl_model").exists()
    assert len(_tb_scalars(run_dir, "eval/episodic_return")) == 4
    assert all(np.isfinite(_tb_scalars(run_dir, "losses/td_loss")))


@pytest.mark.parametrize("module", [pqn_atari_envpool, pqn_atari_envpool_lstm], ids=["cnn", "lstm"])
def test_atari_smoke(module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    args = module.Args(**tiny(module, short=True))
    scores = module.main(args)
    assert isinstance(scores, list)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert all(np.isfinite(_tb_scalars(run_dir, "losses/td_loss")))


def test_atari_evaluate_plays_full_games(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for module in (pqn_atari_envpool, pqn_atari_envpool_lstm):
        model = module.QNetwork(4)
        episodes = [[(30, "term", 3)], [(20, "trunc", 2)]]
        monkeypatch.setattr(
            module,
            "make_env",
            lambda *a, **k: ScriptedPool(episodes, (1 if module is pqn_atari_envpool_lstm else 4, 84, 84), 4),
        )
        args = module.Args(env_id="Breakout-v5", eval_episodes=2)
        scores = module.evaluate(model.state_dict(), args, torch.device("cpu"), "videos")
        assert sorted(scores) == [210.0, 465.0]


# The default run (500k steps, about 20 s on an idle 2-core CPU), last-100-episode mean, measured on a 2-core x86-64 CPU
# (AVX-512, PyTorch 2.13, one thread per run): 500.0 for each of seeds 1-20, and 500.0 for seeds 1 and 2 with two
# PyTorch threads (another summation order). Without bootstrapping (--gamma 0) seeds 1 and 2 end at 14.7 and 15.5.
@pytest.mark.learning
def test_pqn_learns_cartpole(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    passes_with_one_of([1, 2], lambda seed: last_mean(pqn.main(pqn.Args(seed=seed)), 100), 450.0)


def test_a_tracked_run_offline_syncs_its_log_and_flags_to_an_offline_wandb_run(offline_wandb):
    pqn.main(pqn.Args(track=True, total_timesteps=1024, num_envs=8, num_steps=32))
    assert_synced_to_offline_wandb(offline_wandb)


def test_radam_matches_torch_radam():
    torch.manual_seed(0)
    reference = torch.nn.Parameter(torch.randn(300))
    ours = torch.nn.Parameter(reference.detach().clone())
    torch_radam = torch.optim.RAdam([reference], lr=1e-2)
    radam = RAdam(ours, lr=1e-2)
    for step in range(40):  # crosses the switch from momentum steps to rectified adaptive steps (step 6)
        grad = torch.randn(300)
        reference.grad, ours.grad = grad.clone(), grad.clone()
        torch_radam.step()
        radam.step()
        torch.testing.assert_close(ours.detach(), reference.detach(), rtol=1e-5, atol=1e-6, msg=f"step {step}")


def test_flatten_parameters_keeps_the_network_and_collects_its_gradients():
    torch.manual_seed(0)
    network = pqn.QNetwork((4,), 2)
    x = torch.randn(16, 4)
    before = network(x).detach()
    expected = torch.autograd.grad(network(x).square().sum(), list(network.parameters()))
    flat = flatten_parameters(network)
    torch.testing.assert_close(network(x), before)
    network(x).square().sum().backward()
    torch.testing.assert_close(flat.grad, torch.cat([g.reshape(-1) for g in expected]))
    with torch.no_grad():
        flat.add_(1.0)  # an optimizer step on the flat tensor moves the layers' weights
    assert torch.equal(network.network[0].bias, torch.ones(120))


ATARI_SCRIPTS = [pqn_atari_envpool, pqn_atari_envpool_lstm]


@pytest.mark.parametrize("module", ATARI_SCRIPTS, ids=["cnn", "lstm"])
def test_purejaxql_config_gives_the_authors_atari_settings(module, monkeypatch):
    # purejaxql's config/alg/pqn_atari.yaml: TOTAL_TIMESTEPS 5e7 (NUM_UPDATES = 5e7 // NUM_STEPS // NUM_ENVS), 128 envs
    # x 32 steps, 2 epochs x 32 minibatches, LR 2.5e-4 without decay, EPS 1 -> 0.001 over 10%, MAX_GRAD_NORM 10,
    # 0.5 * squared error, flax LayerNorm (over the channels at each pixel), greedy tests.
    args = module.apply_config(module.Args(config="purejaxql"))
    assert args.total_timesteps == int(5e7) // 32 // 128 * 32 * 128
    assert (args.num_envs, args.num_steps, args.update_epochs, args.num_minibatches) == (128, 32, 2, 32)
    minibatch = args.num_envs * args.num_steps // args.num_minibatches
    assert minibatch == 128
    assert (args.learning_rate, args.anneal_lr, args.max_grad_norm) == (2.5e-4, False, 10.0)
    assert (args.start_e, args.end_e, args.exploration_fraction, args.eval_epsilon) == (1.0, 0.001, 0.1, 0.0)
    assert (args.gamma, args.q_lambda, args.td_loss_coef, args.conv_layer_norm) == (0.99, 0.65, 0.5, "channels")
    # the default set changes nothing; a flag given with the config keeps its value
    assert module.apply_config(module.Args()) == module.Args()
    overridden = module.apply_config(module.Args(config="purejaxql", num_envs=64))
    assert (overridden.num_envs, overridden.num_steps) == (64, 32)
    # on the command line, a flag given with its default value (the LSTM's max grad norm 0.5) overrides the set too
    monkeypatch.setattr(sys, "argv", ["script", "--config", "purejaxql", "--max-grad-norm=0.5"])
    overridden = module.apply_config(module.Args(config="purejaxql", max_grad_norm=0.5))
    assert (overridden.max_grad_norm, overridden.num_envs) == (0.5, 128)
    with pytest.raises(SystemExit, match="--config=dopamine: one of cleanrl, purejaxql"):
        module.apply_config(module.Args(config="dopamine"))


@pytest.mark.parametrize("module", ATARI_SCRIPTS, ids=["cnn", "lstm"])
def test_channel_layer_norm_normalizes_the_channels_of_each_pixel(module):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 4) * 3 + 1
    norm = module.ChannelLayerNorm(5)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    expected = torch.empty_like(x)
    for b in range(2):
        for i in range(3):
            for j in range(4):
                pixel = x[b, :, i, j]
                mean, var = pixel.mean(), ((pixel - pixel.mean()) ** 2).mean()
                expected[b, :, i, j] = (pixel - mean) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias
    torch.testing.assert_close(norm(x), expected)
    # C affine parameters per convolution instead of C x H x W
    sizes = {name: p.numel() for name, p in module.QNetwork(4, "channels").named_parameters() if "network.1." in name}
    assert sizes == {"network.1.weight": 32, "network.1.bias": 32}
    assert module.QNetwork(4).network[1].weight.shape == (32, 20, 20)


@pytest.mark.parametrize("module", ATARI_SCRIPTS, ids=["cnn", "lstm"])
def test_td_loss_coef_scales_the_gradient_step(module):
    """One SGD step without clipping: with the factor 0.5 every weight moves half as far; the logged loss is the same."""
    frames = 4 if module is pqn_atari_envpool else 1
    obs = torch.randint(0, 255, (6, 2, frames, 84, 84), dtype=torch.uint8)
    actions, returns = torch.randint(0, 3, (6, 2)), torch.randn(6, 2)
    moves, losses = [], []
    for coef in (1.0, 0.5):
        torch.manual_seed(0)
        net = module.QNetwork(3)
        before = torch.nn.utils.parameters_to_vector(net.parameters()).detach().clone()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        if module is pqn_atari_envpool:
            batch = (obs.flatten(0, 1), actions.flatten(), returns.flatten(), torch.ones(12))
        else:
            state = net.initial_state(2, torch.device("cpu"))
            batch = (obs, actions, torch.zeros(6, 2, dtype=torch.bool), returns, torch.ones(6, 2), state)
        loss, _, _ = module.train_on_rollout(net, optimizer, batch, 1, 1, float("inf"), coef)
        moves.append(torch.nn.utils.parameters_to_vector(net.parameters()).detach() - before)
        losses.append(loss.item())
    assert moves[0].abs().max() > 0
    torch.testing.assert_close(moves[1], 0.5 * moves[0])
    assert losses[0] == pytest.approx(losses[1])


@pytest.mark.parametrize("module", ATARI_SCRIPTS, ids=["cnn", "lstm"])
def test_atari_smoke_purejaxql_config(module, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    args = module.Args(config="purejaxql", total_timesteps=256, num_envs=4, num_steps=32, num_minibatches=2)
    scores = module.main(args)
    assert isinstance(scores, list)
    out = capsys.readouterr().out
    assert "config purejaxql: total_timesteps 256 (given; the config's is 49999872), num_envs 4 (given;" in out
    assert "update_epochs 2, " in out and "td_loss_coef 0.5, conv_layer_norm channels" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert all(np.isfinite(_tb_scalars(run_dir, "losses/td_loss")))
    assert _tb_scalars(run_dir, "charts/learning_rate") == pytest.approx([2.5e-4, 2.5e-4])  # constant


def test_purejaxql_config_is_kept_by_a_resume_that_repeats_the_command(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    module = pqn_atari_envpool
    flags = ["--config", "purejaxql", "--total-timesteps", "256", "--num-envs", "4", "--num-minibatches", "2"]
    monkeypatch.setattr(sys, "argv", ["pqn_atari_envpool.py", *flags, "--checkpoint-every", "128"])
    args = dict(config="purejaxql", total_timesteps=256, num_envs=4, num_minibatches=2, checkpoint_every=128)
    with monkeypatch.context() as patch:
        interrupt_at_step(patch, module, k=5)  # in the first rollout of 4 x 32 steps
        run_until_stopped(module.main, module.Args(**args))
    path = checkpoint_of(tmp_path)
    saved = read_checkpoint(path)["args"]
    assert (saved["config"], saved["num_steps"], saved["update_epochs"], saved["td_loss_coef"]) == ("purejaxql", 32, 2, 0.5)
    assert (saved["num_envs"], saved["anneal_lr"], saved["conv_layer_norm"]) == (4, False, "channels")
    # a launcher retrying the run repeats the whole command with --resume: the checkpoint's values stand
    monkeypatch.setattr(sys, "argv", ["pqn_atari_envpool.py", *flags, "--resume", str(path)])
    module.main(module.Args(**args, resume=str(path)))
    assert read_checkpoint(path)["global_step"] == 256
