"""Unrolling an LSTM over replayed sequences whose recurrent state restarts at episode starts, fast on CPU and GPU.

Used by the Recurrent IQN scripts. The semantics are those of a plain step loop, `h, c = lstm(x_t, (h * keep_t,
c * keep_t))`, which the tests compare against; the functions here only choose a faster way to compute it on each
device (docs/rl-algorithms/recurrent_iqn.md, "Speed", and `python benchmark/lstm_unroll_speed.py`): one cuDNN call per
stretch between restarts on a GPU, and on a CPU one matmul for the input projection of all steps followed by a loop
that only computes h W_hh^T.

Layer 2 (parts): imports no module of this package.
"""

import numpy as np
import torch
import torch.nn.functional as F


def lstm_step(input_gates, h, c, lstm):
    """One LSTM step given the input's share of the gates (x W_ih^T + b), PyTorch's gate order i, f, g, o."""
    i, f, g, o = (input_gates + h @ lstm.weight_hh_l0.T).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def unroll_lstm(lstm, x, state, keep, bounds, segmented=None):
    """Runs `lstm` over x (T, B, D) from state (h, c), multiplying the state by keep (T, B, 1) before every
    step. keep only changes at `bounds` (steps where some sequence restarts), so on a GPU each stretch
    between them is one cuDNN call; on a CPU one matmul projects the inputs of all steps and only
    h W_hh^T runs per step, which measured faster there (docs page, "Speed")."""
    h, c = state
    outputs = []
    if x.is_cuda if segmented is None else segmented:
        for start, end in zip(bounds[:-1], bounds[1:]):
            out, (h, c) = lstm(x[start:end], ((h * keep[start])[None], (c * keep[start])[None]))
            h, c = h[0], c[0]
            outputs.append(out)
        return torch.cat(outputs), (h, c)
    input_gates = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
    # unbind, not input_gates[t]: the backward then stacks the steps' gradients once rather than adding a zero-filled
    # copy of the whole tensor per step
    restarts = (keep != 1).flatten(1).any(1).tolist()  # a product by one is the state itself: skipped
    for t, gates in enumerate(input_gates.unbind(0)):
        if restarts[t]:
            h, c = h * keep[t], c * keep[t]
        h, c = lstm_step(gates, h, c, lstm)
        outputs.append(h)
    return torch.stack(outputs), (h, c)


def unroll_lstm_merged(lstm, x, state, keep):
    """x (T, B, K, D): the state (B, H) is shared by the K quantile samples of a step (the same as repeating
    it; h W_hh^T is computed once) and merged back by the mean after every step. -> (T, B, K, H), state."""
    h, c = state
    input_gates = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
    outputs = []
    for t, gates in enumerate(input_gates.unbind(0)):
        out, c = lstm_step(gates, (h * keep[t]).unsqueeze(1), (c * keep[t]).unsqueeze(1), lstm)
        h, c = out.mean(1), c.mean(1)
        outputs.append(out)
    return torch.stack(outputs), (h, c)


def segment_bounds(is_first):
    """is_first (T, B) numpy bool -> [0, t1, ..., T]: the steps t > 0 where any sequence restarts."""
    restarts = np.flatnonzero(is_first[1:].any(1)) + 1
    return [0] + restarts.tolist() + [is_first.shape[0]]
