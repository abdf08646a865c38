"""Shared test set-up: CPU only, few threads, fixed seeds, and the subprocess pattern smoke tests use.

Every script's tests use these fixtures:

- ``run_dir``: a fresh path under pytest's tmp dir that does *not* exist yet (scripts create it;
  tests of the "never overwrite a result" rules need to create it themselves).
- ``run_script(script, *args, timeout=...)``: runs ``python <script> <args>`` from the repository
  root in a subprocess, CPU only, and returns ``(returncode, stdout, stderr)``.
- ``slow`` marker: tests over ~30 s on a 2-core CPU. They run in CI; ``-m "not slow"`` skips them.

Below them: generated bad input (issue 15) and the mechanics of the run-contract checks (docs/CONTRACT.md) that
several scripts' tests share; each test still names what it expects, the helpers do the running and comparing.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# Force the CPU and small thread counts before torch is imported anywhere, so results do not
# depend on the machine the tests run on. TESTS_ON_GPU=1 keeps the GPU visible in the test process (not in the
# scripts' subprocesses) for the GPU-only tests: `bash benchmarks/gpu.sh gpu-tests` on a lent GPU.
if os.environ.get("TESTS_ON_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SEED = 0

torch.set_num_threads(1)


def load_benchmark(name: str):
    """benchmarks/<name>.py imported from its file (benchmarks/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def subprocess_env() -> dict[str, str]:
    """Environment for script subprocesses: CPU only, one thread, no display, unbuffered output."""
    env = dict(os.environ)
    env.update(
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        MPLBACKEND="Agg",
        PYTHONUNBUFFERED="1",
        PYTHONHASHSEED="0",
    )
    env.pop("WANDB_API_KEY", None)
    return env


def run_script_subprocess(script: str, *args: str, timeout: float = 300.0, env: dict | None = None):
    """Run ``python <script> *args`` from the repository root; return (returncode, stdout, stderr).

    ``script`` is a path relative to the repository root (e.g. ``"trex_ppo_atari.py"``). On a timeout
    the process is killed and the test fails with the tail of its output, so a hang never eats CI.
    """
    cmd = [sys.executable, str(REPO_ROOT / script), *map(str, args)]
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env if env is not None else subprocess_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        tail = f"--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}"
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout:.0f}s\n{tail}")
    return proc.returncode, proc.stdout, proc.stderr


def pytest_configure(config):
    """Under ``-n 2`` xdist hands out one test at a time (its ``--maxschedchunk``, unless given), and the ``slow``
    tests come first (below): the long ones start early and short ones fill the end, so both workers finish within
    seconds of each other (with xdist's default chunks of ~60 tests one sat idle for the last 13 % of the suite)."""
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order within each group


@pytest.fixture(autouse=True)
def _deterministic_seeds():
    """Every test starts from the same RNG state."""
    random.seed(DEFAULT_SEED)
    np.random.seed(DEFAULT_SEED)
    torch.manual_seed(DEFAULT_SEED)
    yield


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run-directory path that does not exist yet, inside pytest's temporary directory."""
    return tmp_path / "run"


@pytest.fixture
def run_script():
    """The subprocess helper as a fixture: ``rc, out, err = run_script("x.py", "--flag", "1", timeout=120)``."""
    return run_script_subprocess


def interrupt_when_exists(cmd: list[str], path: Path, wait_s: float = 180.0, exit_s: float = 120.0):
    """Start ``cmd`` (CPU only, from the repository root), SIGTERM it once ``path`` exists (a checkpoint, say),
    and return (returncode, stdout, stderr): the pattern of every script's resume test."""
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + wait_s
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=exit_s)
    except subprocess.TimeoutExpired:  # it ignored the signal: kill it, so no orphan eats CI's cores
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not exit within {exit_s:.0f}s of SIGTERM\n{err[-2000:]}")
    return proc.returncode, out, err


# what Minari warns about when a dataset lacks it (the tests' datasets are throwaway, but say so)
MINARI_TEST_METADATA = dict(author="tests", author_email="tests@localhost", code_permalink="tests/conftest.py",
                            description="a throwaway dataset written by the tests")  # fmt: skip


def write_minari_dataset(demos: dict, dataset_id: str) -> None:
    """Store demos (the demos.npz layout) as a local Minari dataset: each episode's T+1 observations and T steps."""
    import gymnasium as gym
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = []
    for e in range(len(demos["returns"])):
        m = demos["episode_ids"] == e
        obs = np.concatenate([demos["observations"][m], demos["next_observations"][m][-1:]]).astype(np.float64)
        steps = {"actions": demos["actions"][m], "rewards": demos["rewards"][m]}
        ends = {"terminations": demos["terminals"][m], "truncations": demos["timeouts"][m]}
        buffers.append(EpisodeBuffer(id=e, observations=obs, **steps, **ends))
    env_id = str(demos["env_id"])
    minari.create_dataset_from_buffers(dataset_id, buffers, env=gym.make(env_id), eval_env=env_id, algorithm_name="PD",
                                       **MINARI_TEST_METADATA)  # fmt: skip


# ---- generated bad input (issue 15): the cases come from the code, so a new flag or key is covered without a test edit
ABSURD_INT, ABSURD_FLOAT = "1000000000000000", "1e30"


def numeric_flag_cases(args_cls, prefix: str = "") -> list[tuple[str, str]]:
    """(flag, value) for every int/float field of a tyro Args dataclass, nested dataclasses as ``--group.field``:
    0, -1, NaN and an absurd value (10**15 for ints, 1e30 for floats). Optional[int]/Optional[float] count; bools,
    strings and lists do not."""
    import dataclasses
    import typing

    cases = []
    hints = typing.get_type_hints(args_cls)
    for f in dataclasses.fields(args_cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            cases += numeric_flag_cases(kind, f"{prefix}{f.name}.")
            continue
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        kind = inner[0] if typing.get_origin(kind) is typing.Union and len(inner) == 1 else kind
        if kind in (int, float):
            flag = "--" + (prefix + f.name).replace("_", "-")
            cases += [(flag, v) for v in ("0", "-1", "nan", ABSURD_INT if kind is int else ABSURD_FLOAT)]
    return cases


def mutated_arrays(valid: dict) -> list[tuple[str, str, dict]]:
    """(key, how, arrays) for every key of a valid dict of arrays (an npz's content): the key dropped, its values as
    strings, a NaN in it, its first axis one shorter, and one more axis (a wrong width)."""
    cases = []
    for key, value in valid.items():
        value = np.asarray(value)
        with_nan = value.astype(np.float64).copy()
        with_nan.flat[0] = np.nan
        mutations = {
            "dropped": None,
            "strings": value.astype(str),
            "nan": with_nan,
            "truncated": value[:-1],
            "wrong width": np.stack([value, value], axis=-1),
        }
        for how, new in mutations.items():
            arrays = {k: v for k, v in valid.items() if k != key}
            if new is not None:
                arrays[key] = new
            cases.append((key, how, arrays))
    return cases


def save_npz(path: Path, demos: dict) -> Path:
    np.savez_compressed(path, **demos)
    return path


def scripted_expert_evaluations(monkeypatch, module, means: list, with_successes: bool) -> list:
    """Replace module.evaluate by one returning [mean] for each expert evaluation in turn (HyPE's also a None for
    successes); returns the list that each call appends the evaluated actor's weights to."""
    scripted, seen = iter(means), []

    def evaluate(actor, *args, **kwargs):
        seen.append({k: v.clone() for k, v in actor.state_dict().items()})
        returns = [next(scripted)]
        return (returns, None) if with_successes else returns

    monkeypatch.setattr(module, "evaluate", evaluate)
    return seen


def check_expert_stops_at_target(monkeypatch, module, with_successes: bool, args, train, demos: dict) -> None:
    """--expert.target-return 8, an evaluation every 100 of 300 steps, scripted to return 5, 9, 3: `train()` (the
    module's train_expert on `args`) stops at step 200, the second evaluation, with that actor; the module's
    write_expert_cache then writes a meta that records 200 SAC steps, the target and the evaluation that chose it."""
    seen = scripted_expert_evaluations(monkeypatch, module, [5.0, 9.0, 3.0], with_successes)
    args.expert.timesteps, args.expert.eval_every, args.expert.target_return = 300, 100, 8.0
    agent, _, best, steps = train()
    assert best == [9.0, 200] and steps == 200 and len(seen) == 2
    assert_actor_is(agent.actor, seen[1])
    module.write_expert_cache(args, agent, demos, best, steps)
    meta = json.loads((Path(args.expert.experts_dir) / args.env_id / "expert_meta.json").read_text())
    assert meta["expert_timesteps"] == 200 and meta["target_return"] == 8.0 and meta["chosen_by_evaluation"] == best


def assert_actor_is(actor, weights: dict, expected: bool = True) -> None:
    """The actor's weights equal (or, expected=False, differ from) a state dict recorded earlier."""
    import torch

    assert all(torch.equal(v, weights[k]) for k, v in actor.state_dict().items()) == expected


def corrupt_file(path: Path, how: str, seed: int = 0) -> None:
    """Damage a file in place: ``truncated`` keeps the first half of its bytes, ``random`` replaces them all by
    random bytes (at least 64)."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(np.random.default_rng(seed).integers(0, 256, max(64, len(data)), dtype=np.uint8).tobytes())


def one_line_exit_2(call) -> str:
    """Run ``call()`` (a script's main on bad input, in-process) and return its stderr line, asserting that it
    exited with code 2 and printed exactly one line without a traceback."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        call()
    text = err.getvalue().strip()
    assert exit_info.value.code == 2, text
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    return text


def apply_flag(args, flag: str, value: str) -> bool:
    """Set ``--group.field value`` on a parsed Args object in place, converting the value to the field's int/float
    type as the parser would; False when it does not convert (then the parser's own exit 2 is what to test). Much
    faster than parsing the whole command line again for each generated case."""
    import typing

    *groups, name = flag.removeprefix("--").replace("-", "_").split(".")
    target = args
    for group in groups:
        target = getattr(target, group)
    kind = typing.get_type_hints(type(target))[name]
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    kind = inner[0] if inner else kind
    try:
        setattr(target, name, kind(value) if kind is float else int(value))
    except ValueError:
        return False
    return True


def check_numeric_flag_cases(defaults, cases, valid, *, main, validate, unparsed, created: Path, aliases=None):
    """The generated numeric-flag test: for each (flag, value) of ``cases``, set it on a copy of the parsed
    ``defaults``; when the value does not even parse (NaN for an int), ``unparsed(flag, value)`` (the command line)
    must exit 2 with one line naming the flag; a documented valid case (in ``valid``) must pass ``validate(args)``;
    any other must make ``main(args)`` exit 2 with one line naming the flag (or its alias in ``aliases``).
    ``created`` (the run dir) must not exist after any case."""
    aliases = aliases or {}
    for flag, value in cases:
        args = copy.deepcopy(defaults)
        if not apply_flag(args, flag, value):
            line = one_line_exit_2(lambda: unparsed(flag, value))
        elif (flag, value) in valid:
            validate(args)
            assert not created.exists(), (flag, value)
            continue
        else:
            line = one_line_exit_2(lambda: main(args))
        assert flag in line or aliases.get(flag, flag) in line, (flag, value, line)
        assert not created.exists(), (flag, value)


# ---- the run contract (docs/CONTRACT.md): mechanics shared by the scripts' tests


def file_bytes(folder: Path) -> dict[Path, bytes]:
    """Every file under ``folder`` with its content: compare before and after a call to see that nothing changed."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def keep_signals(call):
    """Run an in-process main and restore pytest's SIGINT/SIGTERM handlers after it (mains install their own)."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return call()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def quiet_main(call) -> tuple[int, str]:
    """Run ``call()`` (a script's main, in-process) with stdout silenced, stderr captured and pytest's signal handlers
    kept; return (exit code: 0 when it returned, else SystemExit's code; stderr). Any other exception propagates, so
    an unexpected error fails the test with its traceback."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            keep_signals(call)
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


def run_contract_snippet(script, policy_path):
    """The five lines of docs/CONTRACT.md for ``script`` (the imported module), as a user runs them: load the
    policy, make its env, reset with seed 1, act. Returns (policy, envs, actions) for the test's checks."""
    policy = script.load_policy(policy_path)
    envs = script.make_policy_envs(policy, num_envs=1)
    obs, _ = envs.reset(seed=1)
    actions = policy.act(obs)
    return policy, envs, actions


def eval_only_twice(run_eval_only, run_dir: Path) -> list[dict]:
    """Call ``run_eval_only()`` (a ``--eval-only run_dir`` command returning (rc, stdout, stderr)) twice: each must
    exit 0 and write the next numbered record (evaluations/eval_001.json, then eval_002.json), and results.json must
    stay byte for byte the same. Returns the two records for the test's checks."""
    before = (run_dir / "results.json").read_bytes()
    records = []
    for number in (1, 2):
        rc, out, err = run_eval_only()
        assert rc == 0, err[-2000:]
        records.append(json.loads((run_dir / "evaluations" / f"eval_{number:03d}.json").read_text()))
    assert (run_dir / "results.json").read_bytes() == before
    return records


def assert_vp9_video(path: Path, size: int | None = None) -> None:
    """``path`` is a VP9 WebM (opencv's VP90) with at least 2 frames, the first readable and not blank; with
    ``size``, its frames are size x size."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    codec = int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode()
    ok, frame = cap.read()
    assert codec == "VP90" and ok and frame.std() > 0, codec
    assert size is None or frame.shape == (size, size, 3), frame.shape
    assert cap.get(cv2.CAP_PROP_FRAME_COUNT) >= 2


def check_help_groups(call, groups, flags=(), absent=()) -> None:
    """``call()`` prints the help (``--help``) and exits 0; the help shows a "<group> options" section for each of
    ``groups`` (one per phase), each of ``flags``, and none of ``absent`` (derived values that are not flags)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        call()
    text = out.getvalue()
    assert exit_info.value.code == 0, text[-2000:]
    for group in groups:
        assert f"{group} options" in text, group
    for flag in flags:
        assert flag in text, flag
    for flag in absent:
        assert flag not in text, flag


@contextlib.contextmanager
def corrupted(path: Path, how: str = "random"):
    """``path`` damaged by corrupt_file (``how``) inside the with block, and restored byte for byte after it."""
    original = path.read_bytes()
    corrupt_file(path, how)
    try:
        yield path
    finally:
        path.write_bytes(original)


def each_file_corrupted(run_dir: Path, read_on_resume):
    """Yield (path, damage) for every file of ``run_dir``, that file damaged while the caller's loop body runs and
    restored after it: both damages (truncated, random bytes) for the files named in ``read_on_resume``, one of the
    two, alternating, for the others (half the reruns)."""
    for index, path in enumerate(sorted(p for p in run_dir.rglob("*") if p.is_file())):
        for how in ("truncated", "random") if path.name in read_on_resume else [("truncated", "random")[index % 2]]:
            with corrupted(path, how):
                yield path, how


def exit_2_naming_the_file(call, path: Path) -> bool:
    """Run ``call()`` (main on a run dir whose file ``path`` is damaged) through quiet_main: True when it exited 2
    with one stderr line naming the file, False when it finished (exit 0); any other exit fails the test."""
    code, err = quiet_main(call)
    line = err.strip()
    assert code in (0, 2), (path, code, err[-1500:])
    if code == 2:
        assert len(line.splitlines()) == 1 and path.name in line and "Traceback" not in line, line
    return code == 2


def check_foreign_run_dirs_refused(main_on, folder: Path, saved_args) -> None:
    """A run dir that is not this script's run on this env is refused: ``main_on(run_dir)`` exits 2 with one line
    containing the needle for each (args.json content, needle) of ``saved_args`` written into ``folder``, and one
    naming the missing args.json for ``folder`` holding another file but no args.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for saved, needle in saved_args:
        (folder / "args.json").write_text(json.dumps(saved))
        assert needle in one_line_exit_2(lambda: main_on(folder)), (saved, needle)
    (folder / "args.json").unlink()
    (folder / "notes.txt").write_text("mine")
    assert "no args.json" in one_line_exit_2(lambda: main_on(folder))


# ---- the two MuJoCo IRL scripts (filter_irl_mujoco.py, hype_irl_mujoco.py) share their Args groups and contract
MUJOCO_IRL_TINY = [
    "--sac.hidden-dim",
    "32",
    "--sac.batch-size",
    "32",
    "--disc.batch-size",
    "64",
    "--eval.episodes",
    "1",
    "--irl.p-tremble",
    "0",
]  # tiny networks and batches, one evaluation episode, no trembling

MUJOCO_IRL_FINISHED_RUN = ["--irl.total-timesteps", "120", "--sac.learning-starts", "60", "--irl.train-every", "60"]
MUJOCO_IRL_FINISHED_RUN += ["--eval.frequency", "120", "--seed", "3"]
# a tiny run on cached demos: 120 policy steps, SAC and discriminator updates from step 60, every 60 steps, one
# evaluation at the end (the tests of a finished run rely on these numbers)

MUJOCO_ENV_ID_CASES = [
    ("Hoper-v5", "did you mean Hopper-v5"),
    ("hopper-v5", "did you mean Hopper-v5"),
    ("Hopper", "did you mean"),
    ("Hopper-v4", "retired version; use Hopper-v5"),
    ("Walker2d-v3", "use Walker2d-v5"),
    ("ALE/Breakout-v5", "Atari"),
    ("BreakoutNoFrameskip-v4", "Atari"),
    ("CartPole-v1", "not a MuJoCo env"),
    ("Pendulum-v1", "not a MuJoCo env"),
]  # (env id of another family, a retired version or a near miss; what its one-line error must say)

MUJOCO_IRL_DOCUMENTED_VALID = {
    ("--torch-threads", "0"),
    ("--seed", "0"),
    ("--sac.learning-starts", "0"),
    ("--sac.gamma", "0"),
    ("--disc.gp-weight", "0"),
    ("--disc.gp-target", "0"),
    ("--irl.reset-prob", "0"),
    ("--irl.p-tremble", "0"),
    ("--expert.eval-every", "0"),  # the last actor records the demos
    ("--expert.target-return", "0"),  # any return is a target: training stops at the first evaluation reaching it
    ("--expert.target-return", "-1"),
}  # the generated numeric cases that are documented valid values of both scripts


def mujoco_rendering_available(script, env_id: str) -> bool:
    """MuJoCo off-screen rendering (EGL/OSMesa) is a system library: without it the video checks are skipped."""
    try:
        script.check_rendering(env_id)
        return True
    except script.UsageError:
        return False


def mujoco_irl_smoke_flags(env_id: str, experts: Path, run_dir: Path) -> list:
    """The whole pipeline from nothing at tiny budgets: 300 expert SAC steps into ``experts``, 2 demos, then 300 IRL
    policy steps (learning starts and a discriminator update every 100), evaluations at 150 and 300, logs every 50."""
    expert = ["--expert.experts-dir", experts, "--expert.timesteps", 300, "--expert.num-demos", 2]
    irl = ["--sac.learning-starts", 100, "--irl.total-timesteps", 300, "--irl.train-every", 100]
    return ["--env-id", env_id, *expert, *irl, "--eval.frequency", 150, "--log-frequency", 50, "--run-dir", run_dir]


def assert_mujoco_irl_artifacts(run_dir: Path, experts: Path, script_name: str, env_id: str) -> None:
    """What a MuJoCo IRL run from nothing leaves: the expert cache (demos.npz; expert_actor.pt with the actor, its
    sizes, env and budget; expert_meta.json naming 2 demos, the env and the script), args.json naming the script and
    the env, the IRL and expert checkpoints, a learning curve, policy.pt, and no *.tmp file."""
    cache = experts / env_id
    for name in ("demos.npz", "expert_actor.pt", "expert_meta.json"):
        assert (cache / name).is_file(), name
    meta = json.loads((cache / "expert_meta.json").read_text())
    assert meta["num_demos"] == 2 and meta["env_id"] == env_id and meta["script"] == script_name, meta
    actor = torch.load(cache / "expert_actor.pt", weights_only=False)
    assert {"actor", "obs_dim", "act_dim", "hidden", "env_id", "total_timesteps", "mean_return"} <= set(actor)
    saved_args = json.loads((run_dir / "args.json").read_text())
    assert saved_args["script"] == script_name and saved_args["env_id"] == env_id
    assert (run_dir / "checkpoints" / "irl.pt").is_file() and (run_dir / "checkpoints" / "expert.pt").is_file()
    assert (run_dir / "learning_curve.png").stat().st_size > 1000 and (run_dir / "policy.pt").is_file()
    assert not list(run_dir.rglob("*.tmp"))


def assert_same_weights_and_eval_returns(load_policy, first: Path, second: Path) -> None:
    """Two run dirs of the same command hold bit-identical policy weights and the same evaluation returns."""
    a, b = load_policy(first / "policy.pt"), load_policy(second / "policy.pt")
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, b.state_dict()[k], rtol=0, atol=0)
    results = [json.loads((d / "results.json").read_text()) for d in (first, second)]
    assert results[0]["eval_returns"] == results[1]["eval_returns"]


def rerun_with_each_file_corrupted(source: Path, tmp_path: Path, rerun) -> list[tuple[Path, str, int, str, Path]]:
    """For every file of the finished run dir ``source`` and each damage (truncated, random bytes): a copy of the run
    dir with that file damaged and results.json removed (unless it is the damaged file: then the resume path reads
    the artifacts), and ``rerun(copy)`` called through quiet_main. Returns (file, damage, exit code, stderr, copy)."""
    outcomes = []
    for name in sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file()):
        for how in ("truncated", "random"):
            run_dir = tmp_path / f"{name.name}-{how}"
            shutil.copytree(source, run_dir)
            corrupt_file(run_dir / name, how)
            if name != Path("results.json"):
                (run_dir / "results.json").unlink()
            outcomes.append((name, how, *quiet_main(lambda: rerun(run_dir)), run_dir))
    return outcomes


def assert_exit_2_naming_the_file_or_a_clean_redo(outcomes, redone) -> None:
    """Checks rerun_with_each_file_corrupted's outcomes: never a traceback; either exit 2 with one stderr line naming
    the damaged file, or exit 0 with ``redone(copy)`` true (the run finished again)."""
    for name, how, rc, err, run_dir in outcomes:
        assert "Traceback" not in err and rc in (0, 2), (name, how, rc, err[-1500:])
        if rc == 2:
            assert len(err.strip().splitlines()) == 1 and name.name in err, (name, how, err)
        else:
            assert redone(run_dir), (name, how, err[-1500:])


def check_irl_run_files_corrupted(main, source: Path, demos: Path, tmp_path: Path) -> None:
    """FILTER/HyPE: every file of a finished run dir corrupted in turn, the command re-run on the same expert file:
    exit 2 naming the file or a clean redo of the 120-step run; args.json and the IRL checkpoint always exit 2."""
    outcomes = rerun_with_each_file_corrupted(
        source, tmp_path, lambda run_dir: main(["--run-dir", str(run_dir), "--expert.path", str(demos)])
    )
    files = {name for name, *_ in outcomes}
    assert {Path("args.json"), Path("checkpoints/irl.pt"), Path("policy.pt"), Path("results.json")} <= files
    assert_exit_2_naming_the_file_or_a_clean_redo(
        outcomes, lambda run_dir: json.loads((run_dir / "results.json").read_text())["policy_env_steps"] == 120
    )
    assert {(name, rc) for name, _, rc, *_ in outcomes} >= {(Path("args.json"), 2), (Path("checkpoints/irl.pt"), 2)}


def interrupt_when_found(cmd: list, cwd: Path, pattern: str, wait_s: float = 180.0, exit_s: float = 60.0, after_s=0.0):
    """Start ``cmd`` (CPU only) in ``cwd``, SIGTERM it once a file matching the glob ``pattern`` (relative to ``cwd``)
    exists and ``after_s`` more seconds have passed; return (returncode, stdout, stderr, seconds from the signal to
    the exit). For the item-10 resume and the item-9 signal-latency tests (issue 48)."""
    found = lambda _stdout: bool(list(Path(cwd).glob(pattern)))  # noqa: E731
    return _interrupt_when(cmd, cwd, found, signal.SIGTERM, wait_s, exit_s, after_s)


def assert_run_directory_printed_at_start_and_end(out: str, run_dir: Path) -> None:
    """The run directory is the first and the last line a run prints on stdout, worded "run directory: PATH" (issue
    48: one wording in every script)."""
    lines = out.splitlines()
    expected = f"run directory: {run_dir}"
    assert lines[0] == expected and lines[-1] == expected, out[-2000:]


def printed_resume_command(err: str) -> list[str]:
    """The command an interrupted run printed after "resume with: ", ready to run (python -> this interpreter)."""
    line = next(x for x in err.splitlines() if "resume with: " in x)
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[0] == "python", line
    return [sys.executable, *command[1:]]


def check_printed_command_resumes(cmd: list, cwd: Path, resumed) -> None:
    """A run started without --run-dir (its default dir ends in a timestamp) is interrupted once
    runs/*/checkpoints/irl.pt exists; the command its message prints, run exactly as printed, resumes in the
    same run dir: `resumed(step, stdout + stderr)` sees the resume message, and the step counter goes on."""
    import torch

    rc, _, err, _ = interrupt_when_found(cmd, cwd, "runs/*/checkpoints/irl.pt")
    assert rc == 130, err[-2000:]
    (run_dir,) = (cwd / "runs").iterdir()

    def step_of() -> int:
        return torch.load(run_dir / "checkpoints" / "irl.pt", weights_only=False)["progress"]["step"]

    step = step_of()
    resume = printed_resume_command(err)
    assert resume[-2:] == ["--run-dir", str(run_dir.relative_to(cwd))], resume
    for events in run_dir.glob("events.out.tfevents*"):  # its next one shows the resumed run has started
        events.unlink()
    rc, out, err, _ = interrupt_when_found(resume, cwd, "runs/*/events.out.tfevents*", after_s=2)
    assert rc == 130 and resumed(step, out + err), err[-2000:]
    assert list((cwd / "runs").iterdir()) == [run_dir]  # no new run dir
    assert step_of() > step


def interrupt_when_printed(cmd: list, cwd: Path, text: str, signum=signal.SIGTERM, wait_s: float = 180.0, exit_s=60.0):
    """Start ``cmd`` (CPU only) in ``cwd``, send ``signum`` once its stdout holds ``text`` (a phase that writes no
    file, such as --eval-only, announces itself there); return (returncode, stdout, stderr, seconds from the signal
    to the exit)."""
    return _interrupt_when(cmd, cwd, lambda stdout: text in stdout.read_text(), signum, wait_s, exit_s, 0.0)


def _interrupt_when(cmd: list, cwd: Path, ready, signum, wait_s: float, exit_s: float, after_s: float):
    """Start ``cmd`` in ``cwd``, wait until ``ready(stdout_path)`` (or ``wait_s``), then ``after_s``, send ``signum``,
    and time the exit. Output goes to files, so a chatty process never blocks on a full pipe; one that ignores the
    signal for ``exit_s`` is killed and the test fails."""
    import tempfile

    with tempfile.TemporaryDirectory() as logs:
        out_path, err_path = Path(logs) / "stdout", Path(logs) / "stderr"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, cwd=cwd, env=subprocess_env(), stdout=out, stderr=err, text=True)
            deadline = time.time() + wait_s
            while time.time() < deadline and proc.poll() is None and not ready(out_path):
                time.sleep(0.1)
            time.sleep(after_s)
            sent = time.monotonic()
            proc.send_signal(signum)
            try:
                proc.wait(timeout=exit_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            seconds = time.monotonic() - sent
        stdout, stderr = out_path.read_text(), err_path.read_text()
    if seconds >= exit_s:
        pytest.fail(f"{' '.join(map(str, cmd))} did not exit within {exit_s:.0f}s of signal {signum}\n{stderr[-2000:]}")
    return proc.returncode, stdout, stderr, seconds


# ---- the MuJoCo IRL scripts' contract tests written once (filter_irl_mujoco.py, hype_irl_mujoco.py)
def check_eval_only_signal_writes_nothing(script: str, finished_run_dir: Path, tmp_path: Path, signum) -> None:
    """Issue 48: --eval-only answers SIGINT/SIGTERM as training does: exit 130 within 10 s, one line saying nothing
    was written, and the run dir byte for byte as before (no evaluation file, whole or half, no .tmp)."""
    run_dir = tmp_path / "copy"
    shutil.copytree(finished_run_dir, run_dir)
    before = file_bytes(run_dir)
    cmd = [sys.executable, str(REPO_ROOT / script), "--eval-only", str(run_dir), "--eval.episodes", "100000"]
    rc, _, err, seconds = interrupt_when_printed(cmd, tmp_path, "evaluating ", signum)
    assert rc == 130 and seconds < 10, (rc, seconds, err[-2000:])
    assert "interrupted during --eval-only: no evaluation written" in err and "Traceback" not in err, err[-2000:]
    assert file_bytes(run_dir) == before


def check_video_signal_leaves_no_file(module, tmp_path: Path) -> None:
    """A signal during VP9 encoding (slow on a busy CPU) stops it within a frame and removes the partial file."""
    frames = [np.zeros((64, 64, 3), np.uint8)] * 5
    module.STOP.set()
    try:
        with pytest.raises(module.Interrupted):
            module.write_video(tmp_path / "videos" / "v.webm", frames, fps=30)
    finally:
        module.STOP.clear()
    assert list((tmp_path / "videos").iterdir()) == []


def whole_and_killed_then_resumed(script: str, root: Path, flags: list, resumed_at: str) -> tuple[Path, Path]:
    """The same tiny run twice on the CPU: uninterrupted (root/whole), and killed (SIGTERM) once its first IRL
    checkpoint exists, then resumed with its own command (root/killed); `resumed_at` is the resume line with {step}."""
    rc, _, err = run_script_subprocess(script, *flags, "--run-dir", root / "whole")
    assert rc == 0, err[-2000:]
    killed = root / "killed"
    cmd = [sys.executable, str(REPO_ROOT / script), *map(str, flags), "--run-dir", str(killed)]
    rc, _, err = interrupt_when_exists(cmd, killed / "checkpoints" / "irl.pt")
    assert rc == 130, err[-2000:]
    step = torch.load(killed / "checkpoints" / "irl.pt", weights_only=False)["progress"]["step"]
    assert 100 <= step < 1000 and not (killed / "results.json").exists()
    rc, out, err = run_script_subprocess(script, *flags, "--run-dir", killed)
    assert rc == 0 and resumed_at.format(step=step) in out + err, err[-2000:]
    return root / "whole", killed


def assert_counters_of_1000_steps(runs: tuple[Path, Path], history_key: str) -> None:
    """Both runs of ``whole_and_killed_then_resumed`` (1,000 policy steps, an outer iteration every 100, evaluations
    every 250) end with the same counters: 1,000 policy steps, 10 discriminator updates, 4 evaluations."""
    for res in (json.loads((d / "results.json").read_text()) for d in runs):
        assert (res["policy_env_steps"], res["outer_iterations"]) == (1000, 10), res
        assert [h[history_key] for h in res["history"]] == [250, 500, 750, 1000]


def whole_and_killed_in_the_expert_phase(script: str, root: Path, flags: list, horizon: int, resumed_at: str):
    """The same run from nothing (expert phase first) twice on the CPU, each with its own expert cache: uninterrupted
    (root/whole), and killed (SIGTERM) once its first expert checkpoint exists, then resumed with its own command
    (root/killed). The kill lands inside an episode (asserted: the env's episodes run ``horizon`` steps without
    terminating, e.g. HalfCheetah-v5's, and the checkpoint interval is no multiple of it); ``resumed_at`` is the
    resume line with {step}. Returns [(run dir, expert cache {experts_dir}/{env_id})] of the two."""
    env_id = flags[flags.index("--env-id") + 1]
    runs = []
    for name in ("whole", "killed"):
        run_dir, experts = root / name, root / f"{name}_experts"
        args = [*flags, "--expert.experts-dir", experts, "--run-dir", run_dir]
        if name == "killed":
            cmd = [sys.executable, str(REPO_ROOT / script), *map(str, args)]
            rc, _, err = interrupt_when_exists(cmd, run_dir / "checkpoints" / "expert.pt")
            assert rc == 130, err[-2000:]
            step = torch.load(run_dir / "checkpoints" / "expert.pt", weights_only=False)["progress"]["step"]
            assert step % horizon != 0 and not (experts / env_id / "demos.npz").exists(), step
        rc, out, err = run_script_subprocess(script, *args, timeout=600)
        assert rc == 0, err[-2000:]
        assert name == "whole" or resumed_at.format(step=step) in out + err, (out + err)[-2000:]
        runs.append((run_dir, experts / env_id))
    return runs


def assert_same_expert_phase(runs) -> None:
    """Both runs of ``whole_and_killed_in_the_expert_phase`` end their expert phase alike: the same step, episode
    count and learning curve in checkpoints/expert.pt, bit-identical expert weights and demos in their caches."""
    (first, first_cache), (second, second_cache) = runs
    progress = [torch.load(d / "checkpoints" / "expert.pt", weights_only=False)["progress"] for d in (first, second)]
    counters = [(p["step"], p["episodes"], p["curve"]) for p in progress]
    assert counters[0] == counters[1], counters
    actors = [torch.load(c / "expert_actor.pt", weights_only=False)["actor"] for c in (first_cache, second_cache)]
    for k, v in actors[0].items():
        torch.testing.assert_close(v, actors[1][k], rtol=0, atol=0)
    with np.load(first_cache / "demos.npz") as a, np.load(second_cache / "demos.npz") as b:
        assert a.files == b.files
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def assert_long_paths_refused(main, cwd: Path, flags: tuple[str, ...]) -> None:
    """Each path flag given a name the file system cannot hold (300 bytes), and --exp-name making such a default run
    dir: ``main(argv)`` exits 2 with one line naming the flag and the limit, and nothing is created in ``cwd`` (the
    test's working directory)."""
    long_path = str(cwd / ("b" * 300))
    for flag, value in [(f, long_path) for f in flags] + [("--exp-name", "a" * 300)]:
        line = one_line_exit_2(lambda: main([flag, value]))
        assert flag in line and "too long for the file system" in line, line
    assert not any(cwd.iterdir()), sorted(cwd.iterdir())


def assert_exp_names_and_long_paths_refused(run, cwd: Path, env_id: str) -> None:
    """An --exp-name that is not one folder name ('../..', 'a/b', empty) or makes a default run dir the file system
    cannot hold, a --run-dir with a 300-byte name or over 4095 bytes, and an --eval-only with a 300-byte name:
    ``run(argv)`` (the script's main on those flags) exits 2 with one line, and nothing is created in ``cwd`` (the
    test's working directory), with or without a runs/ folder there."""
    long, slash = "a" * 300, "--exp-name must be a non-empty name without '/'"
    cases = [
        (["--exp-name", "../../escape"], slash),
        (["--exp-name", "a/b"], slash),
        (["--exp-name", ""], slash),
        (["--exp-name", long], f"--exp-name: runs/{env_id}__aaa"),
        (["--run-dir", str(cwd / long / "run")], "--run-dir: "),
        (["--run-dir", "x/" * 2100], "--run-dir: "),  # a path over 4095 bytes
        (["--eval-only", str(cwd / long)], "--eval-only: "),
    ]
    for runs_exists in (False, True):
        if runs_exists:
            (cwd / "runs").mkdir()
        for argv, needle in cases:
            line = one_line_exit_2(lambda: run(argv))
            assert needle in line and ("too long" in line or "'/'" in line), (argv, line)
        assert sorted(p.name for p in cwd.rglob("*")) == (["runs"] if runs_exists else [])


def assert_bad_policy_file_refused_by_eval_only(run, run_dir: Path, how: str, script: str, env_id: str) -> None:
    """--eval-only on a run dir of ``script`` whose policy.pt is not a policy (``how``: "tensor", "foreign dict",
    "empty", "random bytes"), or on a folder without args.json ("no args.json"): ``run(argv)`` exits 2 with one line
    naming the file or the flag, and nothing in the folder changes. (Mark the test filterwarnings("error") so that
    a warning printed before the line fails it.)"""
    import torch

    run_dir.mkdir()
    if how != "no args.json":
        (run_dir / "args.json").write_text(json.dumps({"script": script, "env_id": env_id}))
    write = {
        "tensor": lambda p: torch.save(torch.zeros(3), p),
        "foreign dict": lambda p: torch.save({"a": 1}, p),
        "empty": lambda p: p.write_bytes(b""),
        "random bytes": lambda p: p.write_bytes(np.random.default_rng(0).bytes(3000)),
    }
    write.get(how, write["tensor"])(run_dir / "policy.pt")
    before = file_bytes(run_dir)
    line = one_line_exit_2(lambda: run(["--eval-only", str(run_dir)]))
    assert ("no args.json there" if how == "no args.json" else "policy.pt is not a readable policy") in line, line
    assert file_bytes(run_dir) == before


def irl_resume_flags(demos, tiny: list) -> list:
    """FILTER's and HyPE's kill-and-resume run: InvertedPendulum on the given demos, 1,000 policy steps, an outer
    iteration and a checkpoint every 100, an evaluation every 250, one torch thread, plus the test file's ``tiny``."""
    flags = ["--env-id", "InvertedPendulum-v5", "--expert.path", demos, "--irl.total-timesteps", 1000]
    flags += ["--sac.learning-starts", 50, "--irl.train-every", 100, "--checkpoint-every", 100]
    return flags + ["--eval.frequency", 250, "--torch-threads", 1, *tiny]
