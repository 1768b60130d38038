#!/usr/bin/env python3
"""A CPU training loop on PyTorch with a known Python call chain, for benches/torch_stacks.sh.

    python torch_train.py [--seconds S] [--hidden N] [--batch B] [--threads T] [--model mlp|conv]

The chain of every step is main() → train_epoch() → train_step(), which runs a small MLP's
forward, backward and optimizer step; the Linear layers are large enough that the BLAS sgemm
(MKL/oneDNN in the PyPI wheel) takes most of the time. Prints, flushed, one `key=value` line each:

    import_torch_s=1.234          time `import torch` took, measured around the import
    torch=2.x threads=2 ...       configuration
    warm t=… steps=…              once the first 3 steps are done (the driver waits for it)
    progress t=… steps=…          every second (t is time.time(), for steps/s over any window)
    done steps=… seconds=… steps_per_s=…   at the end (after S seconds, or on SIGTERM/SIGINT)

With --seconds 0 (the default) it runs until killed.
"""
import argparse
import signal
import sys
import time

_t0 = time.perf_counter()
import torch  # noqa: E402  (timed on purpose)

IMPORT_S = time.perf_counter() - _t0
print(f"import_torch_s={IMPORT_S:.3f}", flush=True)


class Stop(Exception):
    pass


def _stop(signum, frame):
    raise Stop()


def make_conv_model(hidden):
    # Convolutions go to oneDNN, whose kernels are JIT code (xbyak) in anonymous memory.
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(8),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 8 * 8, 1024),
    )


def make_model(hidden):
    return torch.nn.Sequential(
        torch.nn.Linear(1024, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1024),
    )


def train_step(model, opt, loss_fn, x, y):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def train_epoch(model, opt, loss_fn, x, y, state, deadline):
    for _ in range(20):
        train_step(model, opt, loss_fn, x, y)
        state["steps"] += 1
        now = time.time()
        if state["steps"] == 3:
            print(f"warm t={now:.3f} steps={state['steps']}", flush=True)
        if now >= state["next_report"]:
            print(f"progress t={now:.3f} steps={state['steps']}", flush=True)
            state["next_report"] = now + 1.0
        if deadline and now >= deadline:
            return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=0.0, help="run this long (0: until killed)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--model", choices=["mlp", "conv"], default="mlp", help="mlp: sgemm (MKL); conv: convolutions (oneDNN)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    torch.manual_seed(0)
    model = make_conv_model(args.hidden) if args.model == "conv" else make_model(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    x = torch.randn(args.batch, 3, 64, 64) if args.model == "conv" else torch.randn(args.batch, 1024)
    y = torch.randn(args.batch, 1024)
    print(f"torch={torch.__version__} threads={torch.get_num_threads()} model={args.model} hidden={args.hidden} batch={args.batch}", flush=True)
    start = time.time()
    deadline = start + args.seconds if args.seconds > 0 else 0.0
    state = {"steps": 0, "next_report": start + 1.0}
    try:
        while train_epoch(model, opt, loss_fn, x, y, state, deadline):
            pass
    except Stop:
        pass
    elapsed = time.time() - start
    print(f"done steps={state['steps']} seconds={elapsed:.3f} steps_per_s={state['steps'] / max(elapsed, 1e-9):.2f}", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
