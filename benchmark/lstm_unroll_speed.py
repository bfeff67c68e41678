"""Forward + backward time of the masked LSTM unroll of recurrent_iqn_atari.py's learner, four ways.

    python benchmark/lstm_unroll_speed.py              # the Atari sizes: 32 sequences x 22 steps, LSTM 512
    python benchmark/lstm_unroll_speed.py --cuda

The recurrent state is multiplied by (1 - is_first) before every step. All four unrolls compute the same
function (checked here against the first); the script uses the third on a CPU and the fourth on a GPU.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cleanrl_q_utils.lstm_unroll import segment_bounds, unroll_lstm  # noqa: E402


def cell_loop(lstm, cell, x, state, keep):
    h, c = state
    outputs = []
    for t in range(x.shape[0]):
        h, c = cell(x[t], (h * keep[t], c * keep[t]))
        outputs.append(h)
    return torch.stack(outputs)


def lstm_per_step(lstm, cell, x, state, keep):
    h, c = state
    outputs = []
    for t in range(x.shape[0]):
        out, (h, c) = lstm(x[t : t + 1], ((h * keep[t])[None], (c * keep[t])[None]))
        h, c = h[0], c[0]
        outputs.append(out[0])
    return torch.stack(outputs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=22, help="unrolled steps (seq_len 20 + n_step 2)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input", type=int, default=3142, help="3,136 CNN features + 4 actions + reward + timestep")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cuda", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if args.cuda else "cpu")
    torch.manual_seed(0)
    lstm = nn.LSTM(args.input, args.hidden).to(device)
    cell = nn.LSTMCell(args.input, args.hidden).to(device)
    cell.load_state_dict({k[:-3]: v for k, v in lstm.state_dict().items()})
    x = torch.randn(args.steps, args.batch, args.input, device=device, requires_grad=True)
    state = (torch.zeros(args.batch, args.hidden, device=device),) * 2
    is_first = np.zeros((args.steps, args.batch), dtype=bool)
    is_first[[args.steps // 3, 2 * args.steps // 3], [0, args.batch - 1]] = True  # two episodes begin inside
    keep = torch.as_tensor(~is_first, device=device).float().unsqueeze(-1)
    bounds = segment_bounds(is_first)
    variants = {
        "LSTMCell step loop, state masked every step": lambda: cell_loop(lstm, cell, x, state, keep),
        "nn.LSTM called once per step": lambda: lstm_per_step(lstm, cell, x, state, keep),
        "input projection of all steps in one matmul, then a step loop (scripts, CPU)": lambda: unroll_lstm(
            lstm, x, state, keep, bounds, segmented=False
        )[0],
        "nn.LSTM once per stretch between restarts (scripts, GPU)": lambda: unroll_lstm(
            lstm, x, state, keep, bounds, segmented=True
        )[0],
    }
    reference = None
    print(
        f"{args.batch} sequences x {args.steps} steps, input {args.input}, LSTM {args.hidden}, {device}, "
        f"{torch.get_num_threads()} threads; forward + backward, best of {args.repeats}"
    )
    for name, run in variants.items():
        out = run()
        if reference is None:
            reference = out.detach()
        assert torch.allclose(out.detach(), reference, atol=1e-4), name
        times = []
        for _ in range(args.repeats):
            if args.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            run().sum().backward()
            if args.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        print(f"{1000 * min(times):10.1f} ms  {name}")


if __name__ == "__main__":
    main()
