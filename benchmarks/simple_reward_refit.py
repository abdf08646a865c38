"""Would a reward loss weighted toward the rare rewarded steps let SimPLe's policy learn? A probe on a finished run.

    python benchmarks/simple_reward_refit.py RUN_DIR [--power P] [--unrewarded N] [--fit-steps N] [--iterations N]
        [--head refit|trained] [--eval-episodes N] [--eval-seed S] [--max-windows N] [--seed S] [--out FILE]
        [--policy-out FILE]

The CPU Pong run's reward head predicts 0 everywhere (about 2 % of real steps are rewarded), so PPO inside its
world model never saw a reward; a fresh linear head on the same frozen features separates the rewarded steps
(benchmarks/simple_reward_probe.py). This asks the next question, cheaply, before a whole run with a weighted loss:

1. refit: a fresh reward head of the run's shape (its 2-layer MLP) is trained on the frozen world model's
   features (eval mode, the prior's bits, as the simulated env computes them) with a cross-entropy
   whose class c weighs (n_0 / n_c) ** P (n_c: training-env steps of class c; P = 0 is the paper's unweighted
   loss, P = 1 balances the classes). It sees every rewarded training-env window and N random unrewarded ones;
   the unrewarded ones count 1 / (the fraction drawn), so the loss is the one over all training windows. Scored
   on the held-out windows (env 0 of every collection) like the probe: confusion of the argmax, AUC of reward != 0.
2. PPO inside the world model with that head, from the run's own final policy, `--iterations` iterations of the
   run's PPO settings (16 simulated envs x 50 steps from real starts of the latest collection), the script's
   own rollout and update functions. With --head trained, the same with the run's head: the control.
3. The start policy and the new one in the real game, the same `--eval-episodes` games each (the run's
   evaluation settings; --eval-seed 1 is the seed of the run's random baseline, pong-cpu-random).

One JSON line per step, printed and appended to --out. Not resumable: a probe of about an hour on one thread.
"""

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import simple_reward_probe as probe_lib  # noqa: E402

import simple_worldmodel_atari as simple  # noqa: E402


def class_weights(counts: np.ndarray, power: float) -> np.ndarray:
    """(n_0 / n_c) ** power per reward class (-1, 0, +1), n_0 the count of unrewarded steps; 0 for a class with
    no step (it has nothing to weigh)."""
    counts = np.asarray(counts, dtype=np.float64)
    out = np.zeros(3)
    seen = counts > 0
    out[seen] = (counts[1] / counts[seen]) ** power
    return out


def refit_head(head, features: torch.Tensor, classes: torch.Tensor, example_weight: torch.Tensor, steps: int):
    """Full-batch Adam on the weighted cross-entropy (each example's weight: its class weight / its draw rate), on
    standardised features; the standardisation is then folded into the head's first layer, so that the head reads
    the raw features as the world model gives them. Returns the first and last loss."""
    mean, std = features.mean(0), features.std(0) + 1e-6
    x = (features - mean) / std
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        ce = torch.nn.functional.cross_entropy(head(x), classes, reduction="none")
        loss = (ce * example_weight).sum() / example_weight.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    first = head[0]
    with torch.no_grad():  # W (x - m) / s + b = (W / s) x + (b - (W / s) m)
        first.weight /= std
        first.bias -= first.weight @ mean
    return losses[0], losses[-1]


def training_features(model, data, args) -> tuple:
    """Every rewarded training-env window and args.unrewarded random unrewarded ones: their reward-head inputs
    (eval mode, prior bits), classes and per-example draw weights, plus the class counts over all training windows."""
    train = data.windows(1, held_out=False)
    rewards = np.array([data.collections[c]["rewards"][t, e] for c, e, t in train])
    counts = np.array([(rewards < 0).sum(), (rewards == 0).sum(), (rewards > 0).sum()])
    quiet = np.flatnonzero(rewards == 0)
    drawn = np.random.default_rng(args.seed).choice(quiet, min(args.unrewarded, len(quiet)), replace=False)
    picks = np.concatenate([np.flatnonzero(rewards != 0), drawn])
    features: list = []
    probe_lib.probe(model, data, train[picks], args.batch_size, "prior", features)
    classes = np.sign(rewards[picks]).astype(np.int64) + 1
    draw_rate = np.where(classes == 1, len(drawn) / max(1, len(quiet)), 1.0)
    return torch.as_tensor(np.concatenate(features)), torch.as_tensor(classes), draw_rate, counts


def ppo_in_model(policy, model, data, ppo_cfg, iterations: int, seed: int) -> list[float]:
    """The script's PPO inside the world model (its rollout and update functions), with a fresh optimizer as the
    script makes it; returns each iteration's mean simulated return."""
    optimizer = torch.optim.Adam(policy.parameters(), lr=ppo_cfg.learning_rate, betas=(0.85, 0.997), eps=1e-6)
    sim = simple.SimulatedEnv(model, model.cfg.pixel_temperature, model.cfg.latent_temperature)
    rng, returns, t0 = np.random.default_rng(seed), [], time.time()
    model.eval()
    for i in range(iterations):
        obs = sim.reset(data.start_stacks(ppo_cfg.num_envs, rng))
        _, rollout, _ = simple.rollout_and_update(policy, optimizer, sim.step, obs, ppo_cfg, ppo_cfg.num_steps)
        returns.append(rollout["rewards"].sum(0).mean().item())
        if (i + 1) % 5 == 0 or i + 1 == iterations:
            recent = np.mean(returns[-5:])
            print(
                f"PPO in the model: {i + 1}/{iterations}, sim_return (last 5) {recent:.2f}, {time.time() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return returns


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--power", type=float, default=0.5, help="class weight (n_0 / n_c) ** power; 0: unweighted")
    parser.add_argument("--unrewarded", type=int, default=6000, help="unrewarded training windows drawn for the fit")
    parser.add_argument("--fit-steps", type=int, default=1500, help="full-batch Adam steps of the refit")
    parser.add_argument("--head", choices=("refit", "trained"), default="refit", help="trained: the control")
    parser.add_argument("--iterations", type=int, default=60, help="PPO iterations inside the model")
    parser.add_argument("--eval-episodes", type=int, default=32)
    parser.add_argument("--eval-seed", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-windows", type=int, default=0, help="held-out windows scored (0: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="append the JSON lines to this file too")
    parser.add_argument("--policy-out", type=Path, default=None, help="save the new policy here (policy.pt format)")
    args = parser.parse_args(argv)
    counts = (args.power, args.iterations, args.eval_episodes, args.max_windows)
    if min(counts) < 0 or min(args.unrewarded, args.fit_steps, args.batch_size) < 1:
        raise simple.UsageError(
            "--power, --iterations, --eval-episodes and --max-windows must be >= 0, --unrewarded, --fit-steps and "
            "--batch-size >= 1"
        )
    for flag, path in (("--out", args.out), ("--policy-out", args.policy_out)):
        if path is not None and not path.parent.is_dir():
            raise simple.UsageError(f"{flag} {path}: its folder does not exist; create it or give another path")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = probe_lib.load_world_model(args.run_dir / "world_model.pt")
    if not (args.run_dir / "args.json").is_file():
        raise simple.UsageError(f"no args.json in {args.run_dir}: pass a run dir of simple_worldmodel_atari.py")
    saved = json.loads((args.run_dir / "args.json").read_text())
    policy = simple.load_policy(args.run_dir / "policy.pt")
    data = simple.load_collections(args.run_dir)
    lines = []

    def emit(line: dict):
        line = {"run_dir": str(args.run_dir), "head": args.head, "power": args.power, **line}
        print(json.dumps(line), flush=True)
        lines.append(line)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(line) + "\n")

    held_out = data.windows(1, held_out=True)
    if args.max_windows and len(held_out) > args.max_windows:
        held_out = held_out[np.random.default_rng(args.seed).choice(len(held_out), args.max_windows, replace=False)]
    if args.head == "refit":
        x, y, draw_rate, counts = training_features(model, data, args)
        weights = class_weights(counts, args.power)
        example_weight = torch.as_tensor(weights[y.numpy()] / draw_rate, dtype=torch.float32)
        torch.manual_seed(args.seed)
        head = torch.nn.Sequential(*(copy.deepcopy(m) for m in model.reward_head))
        for layer in head:  # a fresh head of the same shape (the trained one had settled on a constant)
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
        first, last = refit_head(head, x, y, example_weight, args.fit_steps)
        model.reward_head.load_state_dict(head.state_dict())
        fit = {
            "class_counts": counts.tolist(),
            "class_weights": weights.tolist(),
            "fit_windows": len(y),
            "fit_loss_first": first,
            "fit_loss_last": last,
        }
        emit({"step": "refit", **fit, **probe_lib.probe(model, data, held_out, args.batch_size, "prior")})
    else:
        emit({"step": "trained head", **probe_lib.probe(model, data, held_out, args.batch_size, "prior")})
    start = copy.deepcopy(policy)
    cfg = simple.PPOArgs(**saved["ppo"])
    returns = ppo_in_model(policy, model, data, cfg, args.iterations, args.seed)
    tail = returns[-10:]
    emit(
        {
            "step": "ppo",
            "iterations": args.iterations,
            "sim_return_first10": float(np.mean(returns[:10] or [0])),
            "sim_return_last10": float(np.mean(tail or [0])),
            "sim_returns": returns,
        }
    )
    if args.policy_out:
        simple.save(args.policy_out, "policy", **policy.to_file())
    ev = saved["eval"]
    for name, p in (("start policy", start), ("after PPO", policy)):
        if args.eval_episodes:
            result = simple.evaluate_policy(
                p, ev["num_envs"], args.eval_episodes, ev["temperature"], ev["noop_max"], args.eval_seed
            )
            emit({"step": f"real game: {name}", "seed": args.eval_seed, **result})
    return lines


if __name__ == "__main__":
    try:
        main()
    except simple.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
