"""World-model training and inference time per step, fp32 vs bf16 autocast (--precision), on this machine.

Two models: the CPU quick configuration of benchmarks/simple_worldmodel_atari.sh (stochastic discrete, hidden 16)
and the paper's deterministic model (hidden 64, 105x80 RGB). Random frames: only the time is measured. Each
configuration runs twice, interleaved (fp32, bf16, fp32, bf16), so drift of the machine shows. Nothing else may run.
    python benchmarks/simple_world_model_precision.py [--threads 2]
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import simple_worldmodel_atari as sw  # noqa: E402


def bench(cfg: sw.WorldModelArgs, bf16: bool, batch: int, targets: int, reps: int) -> tuple[float, float]:
    torch.manual_seed(0)
    model = sw.WorldModel(6, sw.FRAME_SHAPE, cfg).train()
    model.bf16 = bf16
    opt = sw.make_wm_optimizer(model, cfg)
    frames = torch.randint(0, 256, (batch, sw.STACK + targets, *sw.FRAME_SHAPE), dtype=torch.uint8)
    actions, rewards = torch.randint(0, 6, (batch, targets)), torch.ones(batch, targets, dtype=torch.long)

    def step():
        loss, _ = sw.world_model_loss(model, frames, actions, rewards, cfg, 10**6)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # warm-up
    t = time.perf_counter()
    for _ in range(reps):
        step()
    train = (time.perf_counter() - t) / reps
    model.eval()
    model.predict(frames[:, : sw.STACK], actions[:, 0])
    t = time.perf_counter()
    for _ in range(reps):
        model.predict(frames[:, : sw.STACK], actions[:, 0])
    return train, (time.perf_counter() - t) / reps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    torch.set_num_threads(parser.parse_args().threads)
    quick = sw.WorldModelArgs(hidden_size=16, compress_steps=4, filter_double_steps=2, bits=32, lstm_size=32,
                              inference_filters=16, target_frames=2, batch_size=4, optimizer="adam")  # fmt: skip
    paper_det = sw.WorldModelArgs(model="deterministic", target_frames=1, optimizer="adam")
    for name, cfg, batch, targets, reps in (("quick", quick, 4, 2, 5), ("paper deterministic", paper_det, 16, 1, 2)):
        for bf16 in (False, True, False, True):
            train, infer = bench(cfg, bf16, batch, targets, reps)
            print(f"{name:20s} {'bf16' if bf16 else 'fp32'} batch {batch} x {targets} targets: train step "
                  f"{train * 1e3:6.0f} ms, predict batch {batch} {infer * 1e3:6.0f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
