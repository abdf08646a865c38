"""The model-training step of mbirl_antmaze.py (the 7-member Gaussian ensemble, 4 x 200 SiLU, batch 256 per member,
Adam on the cosine learning-rate schedule) two ways, in one process on one device:

  eager    one Python-dispatched minibatch after another (the script on a CPU)
  graphs   each minibatch replayed as a CUDA graph (the script on a GPU since 2026-11-27; CUDA only)

It first checks that the graphed training computes what the eager one does (same weights, data and bootstrap draws:
the largest parameter difference after EPOCHS epochs), then times each way over EPOCHS epochs on ROWS training rows,
alternating twice. Random data of AntMaze's shapes (31-D observations with the 2-D goal, 8-D actions: 39 inputs, 29
outputs); the rates do not depend on the values. Run it alone:
    python benchmarks/mbirl_ensemble_step.py            # or: python3 ... on the GPU machine (benchmarks/gpu.sh)
Prints one JSON line per measurement (minibatches per second, the device, the torch version).
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import mbirl_antmaze as mb  # noqa: E402

ROWS, EPOCHS = int(os.environ.get("ROWS", 100_000)), int(os.environ.get("EPOCHS", 3))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
args = mb.ModelArgs(max_epochs=EPOCHS, patience=EPOCHS + 1)  # the maze defaults but hidden (set below), fixed epochs
g = torch.Generator().manual_seed(0)
inputs = torch.randn(ROWS + ROWS // 4, 39, generator=g).to(device)
targets = (0.1 * torch.randn(len(inputs), 29, generator=g)).to(device)
train_idx, val_idx = torch.arange(ROWS), torch.arange(ROWS, len(inputs))


real_graphs = mb.CudaGraphs


def eager_graphs(fn, enabled):  # stands in for CudaGraphs: every call eager, as on a CPU
    return real_graphs(fn, enabled=False)


def train(graphs: bool) -> tuple[mb.GaussianEnsemble, float, int]:
    torch.manual_seed(1)
    model = mb.GaussianEnsemble(39, 29, args.ensemble_size, 200, args.layers).to(device)
    real = mb.CudaGraphs
    mb.CudaGraphs = real if graphs else eager_graphs
    try:
        sync()
        t0 = time.perf_counter()
        _, info = mb.train_ensemble(model, inputs, targets, train_idx, val_idx, args, torch.Generator().manual_seed(2),
                                    cosine_from=0)  # fmt: skip
        sync()
        return model, time.perf_counter() - t0, info["batches"]
    finally:
        mb.CudaGraphs = real


def sync() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "rows": ROWS, "epochs": EPOCHS}  # fmt: skip
ways = {"eager": False} | ({"graphs": True} if device.type == "cuda" else {})
if device.type == "cuda":
    (eager, _, _), (graphed, _, _) = train(False), train(True)
    diff = max(float((a - b).abs().max()) for a, b in zip(eager.parameters(), graphed.parameters()))
    print(json.dumps({"check": f"graphed vs eager, max |param diff| after {EPOCHS} epochs", "value": diff} | info))
for repeat in range(2):
    for name, graphs in ways.items():
        _, seconds, batches = train(graphs)  # includes the validation passes and, for graphs, warm-up and captures
        print(json.dumps({"way": name, "repeat": repeat, "minibatches_per_s": round(batches / seconds, 1)} | info))
