"""Does a SimPLe run's reward head see the rewards of real play? One step from real frames, held-out games only.

    python benchmarks/simple_reward_probe.py RUN_DIR [--max-windows N] [--batch-size B] [--seed S] [--out FILE]

For every held-out window of the run's real collections (env 0 of each collection, never trained on), the world
model (RUN_DIR/world_model.pt, the last epoch's) predicts the reward of one step from the real 4-frame stack and
the real action, two ways: "prior", as the simulated env does for PPO (eval mode, the LSTM prior's bits), and
"posterior", with the bits the inference net reads from the true next frame (as in training, but with no dropout,
bit noise or prior sampling). Printed and written as one JSON line per way (to --out too, when given):

- the confusion counts: true class (-1, 0, +1) against the predicted class (the argmax the simulated env uses);
- the mean predicted probability of each non-zero class on the steps that had it and on those that did not, and
  the AUC of P(reward != 0) for telling the rewarded steps from the others (0.5: no signal; 1: perfect).

A head whose argmax never leaves 0 can still carry the signal below the threshold (AUC well above 0.5); an AUC
near 0.5 with the posterior's bits says the head has not learned where rewards come from at all; a high AUC with
the posterior's bits and a low one with the prior's says the prior is what loses them.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import simple_worldmodel_atari as simple  # noqa: E402


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Probability that a random positive scores above a random negative (ties count half): Mann-Whitney U."""
    pos, neg = scores[positive], scores[~positive]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    i = 0
    while i < len(values):  # average ranks over ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--max-windows", type=int, default=0, help="0: every held-out window")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="append the JSON line to this file too")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = simple.world_model_from(torch.load(args.run_dir / "world_model.pt", map_location="cpu", weights_only=False))
    data = simple.load_collections(args.run_dir)
    windows = data.windows(1, held_out=True)
    if args.max_windows and len(windows) > args.max_windows:
        windows = windows[np.random.default_rng(args.seed).choice(len(windows), args.max_windows, replace=False)]
    lines = [probe(model, data, windows, args.batch_size, latent) for latent in ("prior", "posterior")]
    for out in lines:
        out["run_dir"] = str(args.run_dir)
        print(json.dumps(out))
    if args.out:
        with open(args.out, "a") as f:
            f.write("".join(json.dumps(out) + "\n" for out in lines))
    return lines


def probe(model, data, windows: np.ndarray, batch_size: int, latent: str) -> dict:
    """One step's reward prediction on each window, with the prior's or the posterior's bits."""
    if latent == "posterior":  # training's forward pass with nothing random left: posterior bits, hard, always used
        cfg = model.cfg
        cfg.dropout = cfg.residual_dropout = cfg.bit_noise = cfg.bit_flip = cfg.prior_max_sampling = 0.0
        cfg.latent_use_max = 1.0
        model.train()
    else:
        model.eval()
    truth, probs = [], []
    with torch.no_grad():
        for i in range(0, len(windows), batch_size):
            frames, actions, classes = data.sequences(windows[i : i + batch_size], 1)
            target = frames[:, simple.STACK] if latent == "posterior" else None
            _, reward_logits, _ = model(frames[:, : simple.STACK], actions[:, 0], target=target, step=10**9)
            probs.append(torch.softmax(reward_logits, -1).numpy())
            truth.append(classes[:, 0].numpy())
    truth, probs = np.concatenate(truth), np.concatenate(probs)
    predicted = probs.argmax(-1)
    confusion = {
        f"true {c - 1:+d}": {f"pred {p - 1:+d}": int(((truth == c) & (predicted == p)).sum()) for p in range(3)}
        for c in range(3)
    }
    out = {
        "latent": latent,
        "collections": len(data.collections),
        "held_out_steps": len(truth),
        "rewarded_steps": int((truth != 1).sum()),
        "confusion": confusion,
        "auc_nonzero": auc(1 - probs[:, 1], truth != 1),
    }
    for c, name in ((0, "minus"), (2, "plus")):
        has = truth == c
        out[f"p_{name}_when_{name}"] = float(probs[has, c].mean()) if has.any() else None
        out[f"p_{name}_otherwise"] = float(probs[~has, c].mean())
    return out


if __name__ == "__main__":
    main()
