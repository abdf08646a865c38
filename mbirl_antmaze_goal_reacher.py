"""Phase 0 of mbirl_antmaze.py: train the goal-reaching Ant controller that makes its AntMaze expert data.

D4RL made antmaze's data with a planner handing waypoints to an Ant trained to walk to a nearby goal; mbirl_antmaze.py
does the same with the controller in controllers/ (--reacher.path). This script trains such a controller: SAC (the
same learner as HyPER's MuJoCo actor, one update per Ant step) on AntMaze's Ant body on an open plane, rewarded for
progress toward goals 1-6 m away; every evaluation that beats the best so far is written to --reacher.path at once.
    python mbirl_antmaze_goal_reacher.py --run-dir runs/r --reacher.path controllers/mine.pt
    python mbirl_antmaze.py --train-goal-reacher --run-dir runs/r --reacher.path controllers/mine.pt   # the same
    python mbirl_antmaze_goal_reacher.py --run-dir runs/r       # same --run-dir again: resumes
A new run never writes over an existing controller (the shipped one stays). Run dir: args.json, events,
checkpoints/reacher.pt, results.json; the controller and its .json (how it was made) at --reacher.path."""

import dataclasses
import datetime as dt
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import mbirl_antmaze as mb
from mbirl_antmaze import GOAL_RADIUS, REACHER_OBS, SAC, ActorArgs, Buffer, NonFiniteLoss, UsageError, reacher_obs

SCRIPT = "mbirl_antmaze_goal_reacher.py"
ANT_ACT = 8  # joint torques


@dataclass
class ReacherArgs(mb.ReacherArgs):
    """The goal-reaching Ant controller and its SAC training (path: where it is written)."""

    total_timesteps: int = mb.ranged(1_000_000, 1, 1e10)
    """Ant steps of SAC training on the open plane"""
    num_envs: int = mb.ranged(4, 1, 1024)
    """Ant envs stepped together (one batched policy forward); one SAC update per env step"""
    learning_starts: int = mb.ranged(10_000, 0, 1e10)
    """uniformly random steps before the first update"""
    hidden: int = mb.ranged(256, 1, 8192)
    """width of the two hidden layers of actor and critics"""
    lr: float = mb.ranged(3e-4, 1e-12, 1)
    """Adam learning rate of actor, critics and temperature"""
    gamma: float = mb.ranged(0.99, 0, 0.9999)
    """discount factor"""
    batch_size: int = mb.ranged(256, 2, 1e6)
    """SAC minibatch"""
    buffer_size: int = mb.ranged(1_000_000, 1, 1e8)
    """replay capacity (transitions)"""
    goal_min: float = mb.ranged(1.0, 0.46, 100)
    """goals are drawn at a distance U(goal_min, goal_max) m in a uniform direction, again whenever one is reached"""
    goal_max: float = mb.ranged(6.0, 0.46, 100)
    """farthest goal (m); the controller sees goal offsets clipped to this length"""
    episode_steps: int = mb.ranged(1000, 1, 1e7)
    """steps before an episode is cut (bootstrapped); a fall (torso height outside [0.2, 1], or upside down) ends it"""
    progress_scale: float = mb.ranged(10.0, 1e-6, 1000)
    """reward = progress_scale * progress toward the goal (m/s) + 1 while upright - ctrl_cost * |a|^2; 10 as the
    controller behind Minari's antmaze data (turning makes the Ant slower than Ant-v5's forward run)"""
    ctrl_cost: float = mb.ranged(0.5, 0, 100)
    """weight of the control cost (Ant-v5's)"""


@dataclass
class EvalArgs:
    """Evaluation, logging, checkpoints."""

    frequency: int = mb.ranged(10_000, 1, 1e10)
    """evaluate every this many Ant steps (and at the end)"""
    log_frequency: int = mb.ranged(1000, 1, 1e10)
    """TensorBoard scalars every this many Ant steps"""
    episodes: int = mb.ranged(10, 1, 1e4)
    """deterministic evaluation episodes (reset seeds seed + 10000 + i) every --eval.frequency steps and at the end"""


@dataclass
class Args:
    seed: int = mb.ranged(1, 0, 2**31 - 1)
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, CUDA is used when available"""
    track: bool = False
    """if toggled, track with Weights and Biases (needs wandb)"""
    wandb_project_name: str = "cleanRL"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the wandb entity"""
    run_dir: str | None = None
    """run directory; default runs/ant_goal_reacher__{seed}__{unix_time}; an existing one is resumed"""
    torch_threads: int = mb.ranged(0, 0, 1024)
    """CPU threads for torch; 0 = torch's default"""
    checkpoint_every: int = mb.ranged(5000, 1, 1e10)
    """checkpoint every this many Ant steps (and on SIGINT/SIGTERM)"""
    reacher: ReacherArgs = field(default_factory=ReacherArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)


# ----------------------------------------------------------------------------------------------------------------
# The task: AntMaze's Ant body on an open plane, walking to goals
# ----------------------------------------------------------------------------------------------------------------
def upside_down(quat: np.ndarray) -> np.ndarray:
    """The torso's up axis points below the horizon. A flipped Ant lies at a 'healthy' torso height, so Ant-v5's
    height test alone lets a controller learn nothing against flipping (and the flipped Ant never gets up)."""
    _, x, y, _ = np.moveaxis(quat, -1, 0)
    return 1 - 2 * (x * x + y * y) < 0


class GoalReachAnt:
    """num_envs Ant-v5 bodies (the MJCF AntMaze adds its walls to) on an open plane, each walking to a goal
    U(goal_min, goal_max) m away in a uniform direction; a goal reached (within 0.45 m) is replaced by a new one.
    Reward: progress_scale x progress toward the goal in m/s + 1 while upright - ctrl_cost |a|^2. A fall (torso
    height outside [0.2, 1], or upside down) ends the episode; resets face a random heading."""

    def __init__(self, r: ReacherArgs, seed: int, num_envs: int | None = None):
        from gymnasium.envs.mujoco.ant_v5 import AntEnv

        self.r, self.rng, n = r, np.random.default_rng(seed), num_envs or r.num_envs
        self.envs = [
            AntEnv(exclude_current_positions_from_observation=False, include_cfrc_ext_in_observation=False)
            for _ in range(n)
        ]
        self.state, self.goal = np.zeros((n, 29)), np.zeros((n, 2))  # (qpos, qvel), goal (x, y)
        self.t, self.reached, self.finished = np.zeros(n, np.int64), np.zeros(n, np.int64), []
        for i in range(n):
            self.reset(i, seed + i)

    def reset(self, i: int, seed: int | None = None) -> None:
        env = self.envs[i]
        env.reset(seed=seed)
        qpos, qvel, yaw = env.data.qpos.copy(), env.data.qvel.copy(), self.rng.uniform(-np.pi, np.pi)
        qpos[3:7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
        env.set_state(qpos, qvel)
        self.state[i], self.t[i], self.reached[i] = np.concatenate([qpos, qvel]), 0, 0
        self.new_goal(i)

    def new_goal(self, i: int) -> None:
        dist, angle = self.rng.uniform(self.r.goal_min, self.r.goal_max), self.rng.uniform(-np.pi, np.pi)
        self.goal[i] = self.state[i, :2] + dist * np.array([np.cos(angle), np.sin(angle)])

    def obs(self) -> np.ndarray:
        return reacher_obs(self.state[:, 2:], self.state[:, :2], self.goal, self.r.goal_max)

    def step(self, actions: np.ndarray):
        """-> next observations (toward the goals the actions were taken for), rewards, terminated, truncated.
        Ended envs are reset and reached goals replaced afterwards, so obs() is the next input."""
        n = len(self.envs)
        next_obs, reward = np.zeros((n, REACHER_OBS), np.float32), np.zeros(n, np.float32)
        term, trunc = np.zeros(n, bool), np.zeros(n, bool)
        for i, env in enumerate(self.envs):
            before = np.linalg.norm(self.goal[i] - self.state[i, :2])
            state, _, fell, _, _ = env.step(actions[i])
            term[i] = fell or upside_down(state[3:7])
            after = np.linalg.norm(self.goal[i] - state[:2])
            progress = self.r.progress_scale * (before - after) / env.dt
            reward[i] = progress + (not term[i]) - self.r.ctrl_cost * np.square(actions[i]).sum()
            next_obs[i] = reacher_obs(state[2:], state[:2], self.goal[i], self.r.goal_max)
            self.state[i], self.t[i] = state, self.t[i] + 1
            trunc[i] = self.t[i] >= self.r.episode_steps
            if after <= GOAL_RADIUS:
                self.reached[i] += 1
                self.new_goal(i)
            if term[i] or trunc[i]:
                ep = {"env": i, "goals": int(self.reached[i]), "length": int(self.t[i]), "fell": bool(term[i])}
                self.finished.append(ep)
                self.reset(i)
        return next_obs, reward, term, trunc


def evaluate_reacher(actor: mb.GaussianActor, r: ReacherArgs, episodes: int, seed: int) -> dict:
    """One deterministic episode per env, all envs at once: goals reached per episode (episode_steps steps unless
    the Ant falls) and the share of falls."""
    envs, first = GoalReachAnt(r, seed, num_envs=episodes), {}
    while len(first) < episodes:
        envs.step(actor.act(envs.obs()))
        for ep in envs.finished:
            first.setdefault(ep["env"], ep)
    goals = [first[i]["goals"] for i in range(episodes)]
    fell = [first[i]["fell"] for i in range(episodes)]
    return {"goals_per_episode": float(np.mean(goals)), "fall_rate": float(np.mean(fell)), "goals": goals}


# ----------------------------------------------------------------------------------------------------------------
# Training: SAC, one update per Ant step after learning_starts uniformly random ones
# ----------------------------------------------------------------------------------------------------------------
def train_goal_reacher(args: Args, run: "ReacherRun"):
    """SAC on GoalReachAnt; returns (counters, agent), or None when interrupted (after saving a checkpoint)."""
    r, device = args.reacher, run.device
    envs = GoalReachAnt(r, args.seed)
    sac_args = ActorArgs(hidden=r.hidden, lr=r.lr, gamma=r.gamma, grad_clip=0.0, lr_decay=0)
    agent = SAC(REACHER_OBS, ANT_ACT, sac_args, device)
    replay = Buffer(REACHER_OBS, ANT_ACT, r.buffer_size, device, reward=True)
    c = {"step": 0, "history": [], "episodes": [], "commands": []}
    run.load_checkpoint(agent, replay, c)
    c["commands"].append(f"python {Path(sys.argv[0]).name} " + " ".join(sys.argv[1:]))  # first, then each resume
    run.progress_start(r.total_timesteps, c["step"])
    obs, last = envs.obs(), {}
    while c["step"] < r.total_timesteps:
        if run.stop:
            run.save_checkpoint(agent, replay, c)
            return None
        if c["step"] < r.learning_starts:
            action = run.rng.uniform(-1, 1, (len(obs), ANT_ACT)).astype(np.float32)
        else:
            with torch.no_grad():
                action = agent.actor.sample(torch.as_tensor(obs, device=device))[0].cpu().numpy()
        next_obs, reward, term, _ = envs.step(action)
        replay.add(*(torch.as_tensor(x, device=device) for x in (obs, action, next_obs, term, reward)))
        obs = envs.obs()
        c["episodes"] += envs.finished
        envs.finished = []
        if c["step"] >= r.learning_starts:  # one update per Ant step; their minibatches drawn at once (one copy)
            batch, B = replay.sample(len(obs) * r.batch_size, run.generator), r.batch_size
            for u in range(len(obs)):
                last = agent.update(*(x[u * B : (u + 1) * B] for x in batch))
        c["step"] += len(obs)
        run.after_step(c, last, agent, replay)
    run.save_checkpoint(agent, replay, c)
    return c, agent


def main(args: Args) -> None:
    try:
        run = ReacherRun.validate(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except mb.AlreadyFinished as e:
        return print(e)
    run.start()
    try:
        out = train_goal_reacher(args, run)
    except NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(3)
    if out is None:
        print(f"interrupted: checkpoint saved; re-run with --run-dir {run.run_dir} to resume", file=sys.stderr)
        raise SystemExit(130)
    run.finish(*out)


# ---- run management ----
class ReacherRun(mb.RunContext):
    """Validation, checkpoints, logging, evaluation and output of a controller training."""

    @classmethod
    def validate(cls, args: Args) -> "ReacherRun":
        self = cls()
        self.args = args
        mb.check_ranges(args)
        if args.reacher.goal_min > args.reacher.goal_max:
            raise UsageError("--reacher.goal-min must not exceed --reacher.goal-max")
        self.run_dir = Path(args.run_dir or f"runs/ant_goal_reacher__{args.seed}__{int(time.time())}")
        mb.check_run_dir(self.run_dir, SCRIPT, "the Ant", {"checkpoints/reacher.pt": "reacher"}, args)
        out = mb.reacher_file(args.reacher.path)
        if out.exists() and not (self.run_dir / "args.json").exists():  # a new run never replaces a controller
            raise UsageError(f"{out} already holds a controller (the shipped one?); pass another --reacher.path")
        parent = next((p for p in out.parents if p.exists()), Path("/"))
        if not mb.os.access(parent, mb.os.W_OK):
            raise UsageError(f"cannot write {out} ({parent} is not writable); pass another --reacher.path")
        return self

    def start(self) -> None:
        super().start(script=SCRIPT)

    def load_checkpoint(self, agent, replay, c) -> None:
        ckpt = mb.load(self.run_dir / "checkpoints" / "reacher.pt", "reacher", self.device)
        if ckpt is not None:
            agent.load_state_dict(ckpt["agent"])
            replay.load_rows(ckpt["replay"])
            c.update(ckpt["counters"])
            self.set_rng_state(ckpt["rng"])
            print(f"resumed at step {c['step']} (new episodes start from here)", flush=True)

    def save_checkpoint(self, agent, replay, c) -> None:
        mb.save(
            self.run_dir / "checkpoints" / "reacher.pt",
            "reacher",
            agent=agent.state_dict(),
            replay=replay.rows[: replay.size].to("cpu", copy=True),  # (not the whole capacity)
            counters=c,
            rng=self.rng_state(),
        )

    def progress_start(self, total: int, step: int) -> None:
        super().progress_start(total, step, desc="reacher")

    def after_step(self, c, last, agent, replay) -> None:
        e, r, step = self.args.eval, self.args.reacher, c["step"]
        n = r.num_envs
        self.bar.update(n)
        crossed = lambda every: step // every != (step - n) // every  # noqa: E731
        if crossed(e.log_frequency) and last:
            scalars = {k: float(v) for k, v in last.items()}
            if not all(math.isfinite(v) for v in scalars.values()):
                raise NonFiniteLoss(f"goal reacher: non-finite SAC losses at step {step}; lower --reacher.lr")
            for k, v in scalars.items():
                self.writer.add_scalar(f"reacher/{k}", v, step)
            recent = c["episodes"][-20:]
            if recent:
                self.writer.add_scalar("reacher/train_goals", np.mean([ep["goals"] for ep in recent]), step)
                self.writer.add_scalar("reacher/train_fall_rate", np.mean([ep["fell"] for ep in recent]), step)
            self.writer.add_scalar("charts/SPS", (step - self.sps_step) / max(1e-9, time.time() - self.sps_t0), step)
        if crossed(e.frequency) or step >= r.total_timesteps:
            self.evaluate(c, agent)
        if crossed(self.args.checkpoint_every) and step < r.total_timesteps:
            self.save_checkpoint(agent, replay, c)

    def evaluate(self, c, agent) -> None:
        """Evaluate; a new best (more goals, then fewer falls) is written to --reacher.path at once, so a running or
        stopped training always leaves its best controller so far."""
        r = self.args.reacher
        res = {"step": c["step"], **evaluate_reacher(agent.actor, r, self.args.eval.episodes, self.args.seed + 10_000)}
        c["history"].append(res)
        self.writer.add_scalar("charts/goals_per_episode", res["goals_per_episode"], c["step"])
        self.writer.add_scalar("charts/fall_rate", res["fall_rate"], c["step"])
        self.bar.write(
            f"[eval] step {c['step']}: {res['goals_per_episode']:.1f} goals per {r.episode_steps}-step episode, "
            f"falls {res['fall_rate']:.0%}"
        )
        best = c.get("best")
        key = lambda res: (res["goals_per_episode"], -res["fall_rate"])  # noqa: E731
        if best is None or key(res) > key(best):
            c["best"] = res
            out = mb.reacher_file(r.path)
            meta = {
                "script": SCRIPT,
                "made_by": c["commands"],
                "env": "Ant-v5 body (gymnasium's ant.xml, as in AntMaze v5) on an open plane, goals 0.45 m",
                "algorithm": "SAC, one update per env step; the best evaluation so far is kept",
                "eval": res,
                "steps_trained": c["step"],
                "settings": dataclasses.asdict(r),
                "seed": self.args.seed,
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            }
            mb.save_policy(out, agent.actor, "goal-reacher", max_dist=r.goal_max, meta=meta)
            mb.atomic_json(out.with_suffix(".json"), meta)

    def finish(self, c: dict, agent) -> None:
        self.bar.close()
        if not c["history"] or c["history"][-1]["step"] != c["step"]:  # resumed with a smaller total: evaluate now
            self.evaluate(c, agent)
        results = {
            "script": SCRIPT,
            "steps": c["step"],
            "best": c["best"],
            "commands": c["commands"],
            "wall_time_s": time.time() - self.t0,
            "history": c["history"],
        }
        mb.atomic_json(self.run_dir / "results.json", results)
        self.writer.close()
        best, out = c["best"], mb.reacher_file(self.args.reacher.path)
        print(
            f"goal reacher: best {best['goals_per_episode']:.1f} goals per episode (falls {best['fall_rate']:.0%}) "
            f"at step {best['step']} -> {out}"
        )


def cli(argv: list[str] | None = None) -> Args:
    """Parse the command line; an existing --run-dir's args.json gives the defaults (`--run-dir X` resumes)."""
    argv = sys.argv[1:] if argv is None else argv
    mb.refuse_retired_flags(argv)
    args = mb.parse(argv, None, Args)  # (a flag tyro rejects: one line, exit 2)
    saved = Path(args.run_dir) / "args.json" if args.run_dir else None
    if saved is not None and mb.saved_script(argv) == SCRIPT:  # (another script's run: validation says so)
        try:
            old = json.loads(saved.read_text())
            default = Args(
                **{k: v for k, v in old.items() if k in {f.name for f in dataclasses.fields(Args)}}
                | {"reacher": ReacherArgs(**old["reacher"]), "eval": EvalArgs(**old["eval"])}
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            print(f"error: {saved} is not a run's args.json; pass another --run-dir", file=sys.stderr)
            raise SystemExit(2)
        args = mb.parse(argv, default, Args)
    return args


if __name__ == "__main__":
    main(cli())
