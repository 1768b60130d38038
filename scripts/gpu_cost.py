"""The workloads of scripts/gpu-cost.sh: what gpuflame costs a CUDA program, measured inside one
process where it can be (a second process of the same program differs from the first by more than
the cost being measured: the launch-bound loop ran at 6.7 to 9.7 us a launch from one process to
the next on the H200).

    python3 gpu_cost.py ticks launches|train SECONDS [--device cuda|cpu]
        The launch-bound loop (tiny elementwise kernels) or a training step, for SECONDS, printing
        `tick TIME_NS DONE` every 50 ms (TIME_NS: CLOCK_REALTIME, DONE: launches or steps so
        far), so that the windows in which gpuflame was attached can be told apart afterwards.
    python3 gpu_cost.py decode SECONDS [--device cuda|cpu] [--kernels]
        A small transformer's decode step (8 layers, d_model 1024, a KV cache of 512 positions),
        at batch 1 and 32, eager and as a CUDA graph (cuda only), each for SECONDS: prints
        `decode_tokens_per_s.MODE.bBATCH=…`. --kernels counts the kernels of one step with
        torch.profiler instead (a CUPTI subscriber: not under gpu-time).

Prints key=value lines; --device cpu runs the same code on the CPU (to try the script where there
is no GPU: no graphs, no synchronisation)."""
import math
import statistics
import sys
import time

import torch

DEVICE = "cuda"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def ticker(seconds):
    """Calls back `tick(done)` every 50 ms of wall time; False when the time is up."""
    end = time.time() + seconds
    state = {"next": 0.0}

    def tick(done):
        now = time.time()
        if now >= state["next"]:
            print(f"tick {time.time_ns()} {done}", flush=True)
            state["next"] = now + 0.05
        return now < end

    return tick


def launches(seconds):
    x = torch.zeros(1024, device=DEVICE)
    sync()
    tick = ticker(seconds)
    done = 0
    while True:
        for _ in range(200):
            x.add_(1)
        done += 200
        if not tick(done):
            break
    sync()
    print(f"launches={done}")


def train(seconds):
    width = 4096 if DEVICE == "cuda" else 512
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, width, device=DEVICE)
    y = torch.randn(512, width, device=DEVICE)
    tick = ticker(seconds)
    done = 0
    while True:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sync()
        done += 1
        if not tick(done):
            break
    print(f"steps={done}")


class Decoder(torch.nn.Module):
    """A GPT-shaped decoder that takes one token per sequence per step, with a static KV cache so
    that a step can be captured as a CUDA graph (the position is a tensor, not a Python int)."""

    def __init__(self, batch, layers=8, dim=1024, heads=16, context=512, vocab=32000):
        super().__init__()
        self.heads, self.head_dim, self.context = heads, dim // heads, context
        self.embed = torch.nn.Embedding(vocab, dim)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(dim) for _ in range(2 * layers))
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))
        self.up = torch.nn.ModuleList(torch.nn.Linear(dim, 4 * dim) for _ in range(layers))
        self.down = torch.nn.ModuleList(torch.nn.Linear(4 * dim, dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)
        shape = (layers, batch, heads, context, self.head_dim)
        self.register_buffer("keys", torch.zeros(shape))
        self.register_buffer("values", torch.zeros(shape))

    def forward(self, tokens, pos):
        b = tokens.shape[0]
        h = self.embed(tokens)  # [b, dim]
        visible = (torch.arange(self.context, device=tokens.device) <= pos).view(1, 1, 1, -1)
        for i, (qkv, out, up, down) in enumerate(zip(self.qkv, self.out, self.up, self.down)):
            q, k, v = qkv(self.norms[2 * i](h)).view(b, 3, self.heads, 1, self.head_dim).unbind(1)
            self.keys[i].index_copy_(2, pos.view(1), k)
            self.values[i].index_copy_(2, pos.view(1), v)
            scores = (q @ self.keys[i].transpose(-1, -2)) / math.sqrt(self.head_dim)
            attn = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ self.values[i]
            h = h + out(attn.reshape(b, -1))
            h = h + down(torch.nn.functional.gelu(up(self.norms[2 * i + 1](h))))
        return self.head(h).argmax(-1)


def decode(seconds, count_kernels):
    torch.manual_seed(0)
    for batch in (1, 32):
        model = Decoder(batch).to(DEVICE).eval()
        tokens = torch.zeros(batch, dtype=torch.long, device=DEVICE)
        pos = torch.zeros((), dtype=torch.long, device=DEVICE)
        modes = ["eager"] + (["graph"] if DEVICE == "cuda" else [])
        with torch.inference_mode():
            for mode in modes:
                step = lambda: model(tokens, pos)  # noqa: E731
                if mode == "graph":
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for _ in range(3):
                            model(tokens, pos)
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        static_next = model(tokens, pos)
                    step = lambda: (graph.replay(), static_next)[1]  # noqa: E731
                if count_kernels:
                    print(f"decode_kernels_per_step.{mode}.b{batch}={kernels_of(step)}")
                    continue
                for _ in range(10):
                    step()
                sync()
                made, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    tokens.copy_(step())
                    pos.copy_((pos + 1) % model.context)
                    made += 1
                    if made % 16 == 0:
                        sync()
                sync()
                rate = made * batch / (time.perf_counter() - start)
                print(f"decode_tokens_per_s.{mode}.b{batch}={rate:.1f}", flush=True)
        del model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def kernels_of(step):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")))


def main():
    global DEVICE
    args = sys.argv[1:]
    if "--device" in args:
        i = args.index("--device")
        DEVICE = args[i + 1]
        del args[i : i + 2]
    count_kernels = "--kernels" in args
    args = [a for a in args if a != "--kernels"]
    if DEVICE == "cuda":
        torch.cuda.init()
        torch.zeros(1, device="cuda")
    if args[0] == "ticks":
        {"launches": launches, "train": train}[args[1]](float(args[2]))
    elif args[0] == "decode":
        decode(float(args[1]), count_kernels)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
