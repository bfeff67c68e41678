"""A flat-parameter RAdam for small networks: pqn.py's optimizer, kept out of the script because it only serves speed.

`flatten_parameters` puts every parameter of a network, and its gradient, into one contiguous tensor, and `RAdam`
updates that one tensor with torch.optim.RAdam's defaults and update rule. Training is the same as with
torch.optim.RAdam up to floating-point rounding; for a network the size of pqn.py's it is faster, because torch.optim
and the gradient clip otherwise loop over ten small tensors with per-step bookkeeping that costs more than the math.

Layer 2 (parts): imports no module of this package.
"""

import math

import torch
import torch.nn as nn


def flatten_parameters(module: nn.Module) -> nn.Parameter:
    """Moves the parameters of `module`, and their gradients, into one contiguous tensor each, and returns it as a
    single parameter for the optimizer and the gradient clip.

    Only for speed: the layers keep working on views of the flat tensor, and backward accumulates into views of its
    gradient, so training is unchanged; but RAdam and the clip run a few kernels on one tensor instead of a loop over
    ten small ones. Measured with `python benchmark/pqn_radam_speed.py` (minibatch 256, one thread, 7 interleaved
    rounds): 0.86 ms per update against 1.47 ms with torch.optim.RAdam on the plain module (0.98 ms with
    torch.optim.RAdam on this flat parameter). See docs/rl-algorithms/pqn.md.
    """
    params = list(module.parameters())
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        p.data = flat.data[offset : offset + p.numel()].view_as(p)
        p.grad = flat.grad[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


class RAdam:
    """RAdam (Liu et al. 2020) for one flat parameter, with torch.optim.RAdam's defaults and update rule.

    Only for speed: for a network this small torch.optim costs more than the math, in per-step bookkeeping and in
    the import of torch._dynamo when the first optimizer is built. With `flatten_parameters`, a default 100k-step run
    (`python cleanrl/pqn.py --total-timesteps 100000`, 5 interleaved runs each, process start included) took 5.9-6.3 s
    against 8.8-9.3 s (and two runs slowed by other jobs) with torch.optim.RAdam on the plain module.
    """

    def __init__(self, param: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.param, self.lr, self.betas, self.eps = param, lr, betas, eps
        self.steps = 0
        self.exp_avg = torch.zeros_like(param)  # first moment m
        self.exp_avg_sq = torch.zeros_like(param)  # second moment v

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        grad = self.param.grad
        self.steps += 1
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1, bias_correction2 = 1 - beta1**self.steps, 1 - beta2**self.steps
        # Length of the approximated simple moving average; the adaptive step is used once its variance is finite.
        rho_inf = 2 / (1 - beta2) - 1
        rho = rho_inf - 2 * self.steps * beta2**self.steps / bias_correction2
        if rho > 5.0:
            rect = math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
            denom = self.exp_avg_sq.sqrt().add_(self.eps)
            self.param.addcdiv_(self.exp_avg, denom, value=-self.lr * rect * math.sqrt(bias_correction2) / bias_correction1)
        else:  # early steps: bias-corrected momentum SGD
            self.param.add_(self.exp_avg, alpha=-self.lr / bias_correction1)

    def state_dict(self) -> dict:
        return {"lr": self.lr, "steps": self.steps, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def load_state_dict(self, state: dict) -> None:
        self.lr, self.steps = state["lr"], state["steps"]
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
