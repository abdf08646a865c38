"""The labelling app of preference_ga3c_atari.py (--labeler human): the label store, its pages and web server.

A person answers the teacher's queries in a browser while the agent trains: the teacher adds clips and queries to the
store, the page shows them, the teacher reads the answers in order. Sections: the label store (one SQLite file per
env, clips shared by the env's experiments as in rl-teacher-atari, each replayed in colour at the game's resolution
and rendered once as a looping GIF), the pages (their HTML, CSS and JavaScript are static files in the folder
preference_labelling_app_pages/ beside this file), the HTTP server. Not part of the algorithm: the synthetic and rl
labellers never import it; the reward model only ever sees the agent's grey 84x84 frames.
Only the person's own browser can answer (Host, Origin, a token signed per browser and bound to its leases; beyond
loopback an access token printed at start-up), and a client's mistakes get a JSON 4xx, never a 5xx.
"""

import hmac
import html
import io
import json
import os
import re
import secrets
import sqlite3
import sys
import threading
import time
import traceback
import urllib.parse
from contextlib import contextmanager, suppress
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

ANSWERS = ("left", "right", "equal", "cant_tell")


# ---- the label store -----------------------------------------------------------------------------------------------
QUERY_KINDS = ("pair", "tree")
CLIP_FPS = 15.0  # Atari with frameskip 4: 60 / 4 agent steps per second, the speed a person sees the game at
CLIP_HOLD_LAST_MS = 300  # the last frame is held so the loop's seam is visible
SCHEMA_VERSION = 1
QUERY_COLUMNS = "id, kind, left_clip, right_clip, node, created"
QUERY_KEYS = ("id", "kind", "left", "right", "node", "created")


class UnknownQuery(Exception):
    """No query with this id (for this experiment). The app answers 404."""

    status = 404


class StaleQuery(Exception):
    """The query exists but is no longer pending (answered, or cancelled). The app answers 409."""

    status = 409


def render_clip_gif(frames: np.ndarray, fps: float = CLIP_FPS) -> tuple[bytes, bytes]:
    """A looping animated GIF of uint8 frames, grey (T, H, W) or colour (T, H, W, 3), and a PNG of its first frame.

    Why GIF: it plays in every current browser with no plugin and no codec (an `<img>`, looping by itself), and its
    256-colour palette stores a grey frame, or an Atari frame (at most 128 colours), losslessly: the few-pixel Pong
    ball stays sharp, where a low-bitrate WebM would smear it. Real Atari clips are a few KB (Pillow stores only the
    changed rectangle of each frame). Upscaling is left to the browser (CSS `image-rendering: pixelated`, the same
    nearest-neighbour pixels on screen): encoding 4x larger frames cost 5x the time and 3x the bytes.
    """
    from PIL import Image

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim not in (3, 4) or len(frames) == 0 or frames.shape[3:] not in ((), (3,)):
        raise ValueError(f"frames must be uint8 (T, H, W) or (T, H, W, 3), T >= 1; got {frames.dtype} {frames.shape}")
    if frames.ndim == 3:
        images = [Image.fromarray(f, "L") for f in frames]
    else:  # one palette of the clip's colours, each pixel its index: exact, unlike Pillow's own quantisation
        codes = frames.astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], np.uint32)
        colours = np.unique(codes)  # then each pixel's index by search: 7x faster than np.unique's return_inverse
        if len(colours) > 256:
            raise ValueError(f"a colour clip needs at most 256 colours for GIF, this one has {len(colours)}")
        palette = np.stack([colours >> 16, colours >> 8 & 255, colours & 255], 1).astype(np.uint8).ravel().tolist()
        images = [Image.fromarray(i.astype(np.uint8), "P") for i in np.searchsorted(colours, codes)]
        for image in images:
            image.putpalette(palette)
    # GIF stores durations in centiseconds: round the cumulative time so the average rate is exactly `fps`.
    ends_cs = np.round(np.arange(1, len(frames) + 1) * 100.0 / fps).astype(int)
    durations = (np.diff(ends_cs, prepend=0) * 10).tolist()
    durations[-1] += CLIP_HOLD_LAST_MS
    gif = io.BytesIO()
    images[0].save(gif, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0)
    poster = io.BytesIO()
    images[0].save(poster, format="PNG")
    return gif.getvalue(), poster.getvalue()


def noop_count(seed: int, game: int, noop_max: int) -> int:
    """The no-ops AtariVectorEnv's emulator `seed` made at the start of its `game`-th game (0 = the seeded reset's):
    each reset draws one number in [0, noop_max - 1] from C++'s std::mt19937(seed) through libstdc++'s
    uniform_int_distribution (Lemire's multiply-and-reject); numpy's legacy MT19937 gives the same raw draws."""
    span, draws, out = max(1, noop_max), iter(()), []
    rng = np.random.RandomState(seed)
    while len(out) <= game:
        draw = next(draws, None)
        if draw is None:  # a rejection needs one more draw than numbers wanted: draw in chunks
            draws = iter(rng.randint(0, 2**32, size=game + 8, dtype=np.uint64).tolist())
            continue
        if (draw * span) % 2**32 < (2**32 - span) % span:
            continue  # rejected, as libstdc++ does
        out.append(draw * span >> 32)
    return out[game]


_EMULATORS = threading.local()  # per thread: {(rom, seed, sticky): (ALEInterface, its state just after loading)}


def _emulator(rom: str, seed: int, sticky: float):
    """An emulator as a fresh ALEInterface(seed, sticky) with `rom` loaded: a kept one, put back to its state just
    after loading (its random state included). Loading a ROM takes 85 ms, two thirds of a short clip's replay."""
    from ale_py import ALEInterface, LoggerMode, roms

    kept = _EMULATORS.__dict__.setdefault("kept", {})
    if (rom, seed, sticky) not in kept:
        if len(kept) >= 64:  # one per env of a run is the most it needs; a few hundred KB each
            del kept[next(iter(kept))]
        ALEInterface.setLoggerMode(LoggerMode.Error)
        ale = ALEInterface()
        ale.setInt("random_seed", seed)
        ale.setFloat("repeat_action_probability", sticky)
        ale.loadROM(roms.get_rom_path(rom))
        kept[rom, seed, sticky] = (ale, ale.cloneState(include_rng=True))
    ale, loaded = kept[rom, seed, sticky]
    ale.restoreState(loaded)
    return ale


def replay_clip(replay: dict, frames: np.ndarray, stack: int) -> np.ndarray | None:
    """The clip in colour, (T, 210, 160, 3): the game's actions replayed in one emulator set up as the training
    script's AtariVectorEnv (its ROM, seed, sticky actions; FIRE and the same hidden no-ops at reset, frameskip 4, the
    last two frames' maximum shrunk to 84x84), each step shown as its last frame. None when the replay's grey frames
    differ from the clip's recorded `frames` (T + stack - 1), and at once with sticky actions in a game after an
    emulator's first: its random state carries over from the games before, which are not kept (2 of 192 matched)."""
    import cv2
    from ale_py import Action

    if replay["sticky"] > 0 and replay["game"] > 0:
        return None
    ale = _emulator(replay["rom"], int(replay["seed"]), float(replay["sticky"]))
    action_set, actions = ale.getMinimalActionSet(), np.asarray(replay["actions"])
    fire = Action.FIRE in action_set
    ale.reset_game()
    if fire:
        ale.act(Action.FIRE)
    for _ in range(noop_count(replay["seed"], replay["game"], replay["noop_max"]) - fire):
        ale.act(Action.NOOP)
        if ale.game_over():
            ale.reset_game()

    def shrink(screen):
        return cv2.resize(screen, (84, 84), interpolation=cv2.INTER_AREA)

    grey = [np.zeros((84, 84), np.uint8)] * (stack - 1) + [shrink(ale.getScreenGrayscale())]
    colour, first = [ale.getScreenRGB()], len(actions) - len(frames)  # steps before `first` need no screens
    for i, action in enumerate(actions.tolist()):
        pair = []
        for skip in range(4, 0, -1):
            ale.act(action_set[action])
            if ale.game_over():  # a clip ends before its game does
                return None
            if skip <= 2 and i >= first:
                pair.append(ale.getScreenGrayscale())
        if i >= first:
            grey.append(shrink(np.maximum(*pair)))
            colour.append(ale.getScreenRGB())
    t = len(frames) - stack + 1
    if len(grey) < len(frames) or not np.array_equal(np.stack(grey[-len(frames) :]), frames):
        return None
    return np.stack(colour[-t:])


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _json_or_none(text):
    return None if text is None else json.loads(text)


def _of_kind(sql: str, kind: str | None) -> tuple[str, tuple]:
    """`sql` and its extra parameters, narrowed to one query kind unless kind is None."""
    return (sql, ()) if kind is None else (sql + " AND kind=?", (kind,))


# the columns each table of a store must have (the LabelStore below creates them)
STORE_COLUMNS = {
    "meta": {"key", "value"},
    "clips": {"id", "name", "length", "stack", "true_return", "source", "created", "lives_lost"},
    "queries": {"id", "experiment", "kind", "left_clip", "right_clip", "node", "status", "created", "lease_client"}
    | {"lease_until", "answer", "labeller", "answered_at", "seq"},
    "experiments": {"name", "status", "tree"},
}


def check_store(root: str | Path, env_id: str, raises: bool = True) -> str | None:
    """Check an existing label store read-only (nothing is created or changed): an SQLite file that passes
    SQLite's quick check, with the tables and columns of this app and the env's id. Raises ValueError naming the file
    and the problem (or returns the problem when `raises` is False); None when it is fine or absent."""
    path = Path(root) / f"{env_id.replace('/', '_')}.sqlite"
    if not path.exists():
        return None
    problem = None
    try:
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise sqlite3.DatabaseError("not an SQLite file")
        # no -wal file: no writer has it open, so immutable (which leaves no -shm/-wal behind) reads it all
        flags = "mode=ro" if path.with_name(path.name + "-wal").exists() else "mode=ro&immutable=1"
        db = sqlite3.connect(f"{path.resolve().as_uri()}?{flags}", uri=True)
        try:
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("damaged (SQLite's quick check failed)")
            for table, columns in STORE_COLUMNS.items():
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if not columns <= have:
                    raise sqlite3.DatabaseError(f"table {table} lacks {sorted(columns - have)}")
            row = db.execute("SELECT value FROM meta WHERE key='env_id'").fetchone()
            if row is not None and row[0] != env_id:
                problem = f"label store {path} holds clips of env {row[0]!r}, not {env_id!r}"
        finally:
            db.close()
    except sqlite3.Error as e:
        problem = f"label store {path} cannot be read ({e})"
    except OSError as e:
        problem = f"label store {path} cannot be read ({e.strerror})"
    if problem is not None and raises:
        raise ValueError(problem)
    return problem


class LabelStore:
    """SQLite store of one env's clips (shared by all experiments of that env) and of each experiment's queries,
    answers, sort tree and status. Thread-safe: one sqlite3 connection (check_same_thread=False) behind one lock,
    WAL mode, parameterised SQL, every write in one transaction. Several processes may open the same file (two
    experiments of one env): SQLite's file locks and a busy timeout serialise their writes.

    Files: root/"{env_slug}.sqlite" and root/"{env_slug}_clips/" holding, per clip, "<name>.npz" (frames, actions,
    true rewards, stack), "<name>.gif" (what people watch) and "<name>.png" (its first frame). Each clip's name is
    random, so a name is never reused (not even after delete_clips) and browsers may cache clips forever.
    Query ids and clip ids are never reused either (AUTOINCREMENT); answer sequence numbers only grow.
    """

    def __init__(self, root: str | Path, env_id: str):
        self.env_id, self.root, slug = env_id, Path(root), env_id.replace("/", "_")
        self.path, self.clips_dir = self.root / f"{slug}.sqlite", self.root / f"{slug}_clips"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._create_schema()  # executescript commits by itself, so it runs outside _write
            with self._write():
                row = self._db.execute("SELECT value FROM meta WHERE key='env_id'").fetchone()
                if row is None:
                    meta = [("env_id", env_id), ("schema", str(SCHEMA_VERSION)), ("answer_seq", "0")]
                    self._db.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", meta)
                elif row[0] != env_id:
                    raise ValueError(
                        f"label store {self.path} holds clips of env {row[0]!r}, not {env_id!r}: "
                        f"use another directory for {env_id!r}"
                    )
        except BaseException:
            self._db.close()
            raise
        self.clips_dir.mkdir(exist_ok=True)
        self._remove_stale_tmp()

    # ---- plumbing ----
    def _create_schema(self) -> None:
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS clips (
                id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, length INTEGER NOT NULL,
                stack INTEGER NOT NULL, true_return REAL NOT NULL, source TEXT NOT NULL, created REAL NOT NULL,
                lives_lost INTEGER NOT NULL DEFAULT 0);
            CREATE TABLE IF NOT EXISTS queries (
                id INTEGER PRIMARY KEY AUTOINCREMENT, experiment TEXT NOT NULL, kind TEXT NOT NULL,
                left_clip INTEGER NOT NULL REFERENCES clips(id), right_clip INTEGER NOT NULL REFERENCES clips(id),
                node INTEGER, status TEXT NOT NULL DEFAULT 'pending', created REAL NOT NULL,
                lease_client TEXT, lease_until REAL, answer TEXT, labeller TEXT, answered_at REAL, seq INTEGER);
            CREATE INDEX IF NOT EXISTS queries_open ON queries(experiment, status, kind, id);
            CREATE UNIQUE INDEX IF NOT EXISTS queries_seq ON queries(experiment, seq) WHERE seq IS NOT NULL;
            CREATE TABLE IF NOT EXISTS experiments (name TEXT PRIMARY KEY, status TEXT, tree TEXT);
            """
        )
        if "lives_lost" not in [row[1] for row in self._db.execute("PRAGMA table_info(clips)")]:  # an older store
            self._db.execute("ALTER TABLE clips ADD COLUMN lives_lost INTEGER NOT NULL DEFAULT 0")

    @contextmanager
    def _write(self):
        """One write transaction, taken up front (BEGIN IMMEDIATE) so concurrent writers queue, never deadlock."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, params=()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def _remove_stale_tmp(self) -> None:
        """A killed write leaves name.tmp; files older than a minute are no other process's write in flight."""
        cutoff = time.time() - 60.0
        for tmp in self.clips_dir.glob("*.tmp"):
            with suppress(FileNotFoundError):  # another process removed it meanwhile
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()

    # ---- clips ----
    def add_clip(self, frames, actions, true_rewards, stack: int, source: str, lives_lost=0, replay=None) -> int:
        """Save a clip's arrays and its rendered GIF, then record it; returns the clip id.

        frames: uint8 (T + stack - 1, H, W) single grey frames (step t sees frames[t:t+stack]); actions (T,);
        true_rewards (T,), the game's score change per step; stack frames per observation (0 = none, like 1);
        lives_lost: lives the player lost during the clip (the synthetic labeller's penalty); replay: how to replay
        the clip's game (see replay_clip) to show it in colour at the game's resolution, else the GIF shows `frames`.
        """
        frames, actions, true_rewards = np.asarray(frames), np.asarray(actions), np.asarray(true_rewards)
        stack = max(1, int(stack)) if int(stack) >= 0 else int(stack)  # 0 = no stacking = 1 frame per observation
        if stack < 1:
            raise ValueError(f"stack must be >= 0 frames per observation (0 = no stacking), got {stack}")
        if frames.dtype != np.uint8 or frames.ndim != 3:
            raise ValueError(f"frames must be uint8 (T + stack - 1, H, W), got {frames.dtype} {frames.shape}")
        t = len(actions)
        if t < 1 or actions.shape != (t,) or true_rewards.shape != (t,) or len(frames) != t + stack - 1:
            raise ValueError(
                f"a clip of T steps needs actions (T,), true_rewards (T,) and T + stack - 1 frames; got actions "
                f"{actions.shape}, true_rewards {true_rewards.shape}, frames {frames.shape} with stack {stack}"
            )
        if not np.all(np.isfinite(true_rewards)):
            raise ValueError("true_rewards must be finite")
        name = f"clip_{secrets.token_hex(8)}"
        arrays = io.BytesIO()
        rewards = true_rewards.astype(np.float32)  # Atari frames compress about tenfold
        np.savez_compressed(arrays, frames=frames, actions=actions.astype(np.int64), true_rewards=rewards, stack=stack)
        colour = None if replay is None else replay_clip(replay, frames, stack)
        gif, poster = render_clip_gif(frames[stack - 1 :] if colour is None else colour)
        _write_atomic(self.clips_dir / f"{name}.npz", arrays.getvalue())
        _write_atomic(self.clips_dir / f"{name}.png", poster)
        _write_atomic(self.clips_dir / f"{name}.gif", gif)
        true_return = float(true_rewards.astype(np.float64).sum())
        sql = "INSERT INTO clips(name, length, stack, true_return, source, created, lives_lost) VALUES (?,?,?,?,?,?,?)"
        with self._write() as db:
            row = (name, t, stack, true_return, str(source), time.time(), int(lives_lost))
            return int(db.execute(sql, row).lastrowid)

    def _clip_name(self, clip_id: int) -> str:
        rows = self._read("SELECT name FROM clips WHERE id=?", (int(clip_id),))
        if not rows:
            raise KeyError(f"no clip {clip_id} in {self.path}")
        return rows[0][0]

    def clip_arrays(self, clip_id: int) -> dict:
        """{"frames", "actions", "true_rewards", "stack"} of a clip (KeyError if there is no such clip)."""
        with np.load(self.clips_dir / f"{self._clip_name(clip_id)}.npz") as z:
            return {key: z[key] for key in ("frames", "actions", "true_rewards")} | {"stack": int(z["stack"])}

    def clip_info(self, clip_id: int) -> dict:
        """{"id", "length", "true_return", "lives_lost", "source", "media"}; media: the GIF's file name in clips_dir."""
        sql = "SELECT id, length, true_return, lives_lost, source, name FROM clips WHERE id=?"
        rows = self._read(sql, (int(clip_id),))
        if not rows:
            raise KeyError(f"no clip {clip_id} in {self.path}")
        keys = ("id", "length", "true_return", "lives_lost", "source")
        return dict(zip(keys, rows[0])) | {"media": f"{rows[0][-1]}.gif"}

    def clip_ids(self) -> list[int]:
        return [r[0] for r in self._read("SELECT id FROM clips ORDER BY id")]

    def clip_media(self, clip_ids) -> dict[int, dict]:
        """{clip id: {"media": GIF file name, "poster": PNG file name, "length"}} for the ids that exist."""
        ids = sorted({int(i) for i in clip_ids})
        out = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for i, name, length in self._read(f"SELECT id, name, length FROM clips WHERE id IN ({marks})", chunk):
                out[i] = {"media": f"{name}.gif", "poster": f"{name}.png", "length": length}
        return out

    # ---- queries and answers ----
    def add_query(self, experiment: str, kind: str, left: int, right: int, node: int | None = None) -> int:
        """A pending query: kind "pair" (is left or right better?) or "tree" (left = the clip being inserted into
        the sort tree, right = a clip bound to tree node `node`). Returns its id."""
        if kind not in QUERY_KINDS:
            raise ValueError(f"query kind must be one of {QUERY_KINDS}, got {kind!r}")
        if kind == "tree" and node is None:
            raise ValueError("a tree query needs the tree node it compares against")
        with self._write() as db:
            found = db.execute("SELECT COUNT(*) FROM clips WHERE id IN (?, ?)", (int(left), int(right))).fetchone()[0]
            if found != len({int(left), int(right)}):
                raise KeyError(f"query on clips {left}, {right}: not both are in {self.path}")
            cur = db.execute(
                "INSERT INTO queries(experiment, kind, left_clip, right_clip, node, created) VALUES (?, ?, ?, ?, ?, ?)",
                (experiment, kind, int(left), int(right), None if node is None else int(node), time.time()),
            )
            return int(cur.lastrowid)

    def pending_queries(self, experiment: str, kind: str | None = None) -> list[dict]:
        """Pending queries, oldest first: {"id", "kind", "left", "right", "node", "created"}."""
        sql, params = _of_kind(f"SELECT {QUERY_COLUMNS} FROM queries WHERE experiment=? AND status='pending'", kind)
        return [dict(zip(QUERY_KEYS, r)) for r in self._read(sql + " ORDER BY id", (experiment, *params))]

    def next_queries(self, experiment: str, kind: str, client: str, count: int = 1, lease_s: float = 30.0) -> list:
        """The `count` oldest pending queries of `kind` not leased to another client within lease_s, leased to
        `client` (the web app shows one and preloads the next; two people labelling at once see different ones)."""
        now = time.time()
        with self._write() as db:
            rows = db.execute(
                f"SELECT {QUERY_COLUMNS} FROM queries WHERE experiment=? AND status='pending' AND kind=? "
                "AND (lease_client IS NULL OR lease_client=? OR lease_until < ?) ORDER BY id LIMIT ?",
                (experiment, kind, client, now, int(count)),
            ).fetchall()
            leases = [(client, now + lease_s, r[0]) for r in rows]
            db.executemany("UPDATE queries SET lease_client=?, lease_until=? WHERE id=?", leases)
        return [dict(zip(QUERY_KEYS, r)) for r in rows]

    def renew_leases(self, experiment: str, query_ids, client: str, lease_s: float = 30.0) -> list[int]:
        """Extend `client`'s leases on these pending queries (taking any whose lease lapsed); returns the ids held."""
        now = time.time()
        held = []
        with self._write() as db:
            for qid in query_ids:
                cur = db.execute(
                    "UPDATE queries SET lease_client=?, lease_until=? WHERE id=? AND experiment=? AND status='pending' "
                    "AND (lease_client IS NULL OR lease_client=? OR lease_until < ?)",
                    (client, now + lease_s, int(qid), experiment, client, now),
                )
                if cur.rowcount:
                    held.append(int(qid))
        return held

    def _raise_not_pending(self, db, experiment: str, query_id: int) -> None:
        row = db.execute("SELECT status FROM queries WHERE id=? AND experiment=?", (query_id, experiment)).fetchone()
        if row is None:
            raise UnknownQuery(f"no query {query_id} in experiment {experiment!r}")
        if row[0] == "pending":
            raise StaleQuery(f"query {query_id} of experiment {experiment!r} is leased to another labeller")
        raise StaleQuery(f"query {query_id} of experiment {experiment!r} is {row[0]}, no longer pending")

    def answer(self, experiment: str, query_id: int, answer: str, labeller: str, client: str | None = None) -> None:
        """Record the answer ("left", "right", "equal", "cant_tell") to a pending query, with the next answer
        sequence number. Unknown id -> UnknownQuery; not pending, or (with `client`) leased to another client
        -> StaleQuery; bad answer -> ValueError."""
        if answer not in ANSWERS:
            raise ValueError(f"answer must be one of {ANSWERS}, got {answer!r}")
        query_id, now = int(query_id), time.time()
        sql = (
            "UPDATE queries SET status='answered', answer=?, labeller=?, answered_at=?, seq=?, lease_client=NULL, "
            "lease_until=NULL WHERE id=? AND experiment=? AND status='pending'"
        )
        if client is not None:  # not a pair another browser holds
            sql += " AND (lease_client IS NULL OR lease_client=? OR lease_until < ?)"
        with self._write() as db:
            seq = int(db.execute("SELECT value FROM meta WHERE key='answer_seq'").fetchone()[0]) + 1
            params = (answer, str(labeller), now, seq, query_id, experiment)
            cur = db.execute(sql, params + (() if client is None else (client, now)))
            if cur.rowcount != 1:
                self._raise_not_pending(db, experiment, query_id)
            db.execute("UPDATE meta SET value=? WHERE key='answer_seq'", (str(seq),))

    def answers_after(self, experiment: str, seq: int) -> list[dict]:
        """Answered queries with answer sequence number > seq, in answer order: {"seq", "id", "kind", "left",
        "right", "node", "answer", "labeller", "answered_at"}."""
        sql = "SELECT seq, id, kind, left_clip, right_clip, node, answer, labeller, answered_at FROM queries "
        rows = self._read(sql + "WHERE experiment=? AND seq > ? ORDER BY seq", (experiment, int(seq)))
        keys = ("seq", "id", "kind", "left", "right", "node", "answer", "labeller", "answered_at")
        return [dict(zip(keys, r)) for r in rows]

    def cancel_query(self, experiment: str, query_id: int) -> None:
        """Pending -> "cancelled" (an answer to it is then stale). Unknown id -> UnknownQuery; already answered or
        cancelled -> StaleQuery (an answer that raced the cancel is kept and shows up in answers_after)."""
        query_id = int(query_id)
        with self._write() as db:
            sql = "UPDATE queries SET status='cancelled', lease_client=NULL, lease_until=NULL "
            cur = db.execute(sql + "WHERE id=? AND experiment=? AND status='pending'", (query_id, experiment))
            if cur.rowcount != 1:
                self._raise_not_pending(db, experiment, query_id)

    def count_answers(self, experiment: str, kind: str | None = None) -> int:
        sql, params = _of_kind("SELECT COUNT(*) FROM queries WHERE experiment=? AND status='answered'", kind)
        return int(self._read(sql, (experiment, *params))[0][0])

    def count_pending(self, experiment: str) -> dict[str, int]:
        """{"pair": n, "tree": m}: pending queries of each kind."""
        sql = "SELECT kind, COUNT(*) FROM queries WHERE experiment=? AND status='pending' GROUP BY kind"
        rows = self._read(sql, (experiment,))
        return {kind: 0 for kind in QUERY_KINDS} | {k: int(n) for k, n in rows}

    # ---- per-experiment tree and status ----
    def _set_experiment(self, experiment: str, column: str, value: dict) -> None:
        sql = f"INSERT INTO experiments(name, {column}) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET {column}="
        with self._write() as db:
            db.execute(sql + f"excluded.{column}", (experiment, json.dumps(value)))

    def save_tree(self, experiment: str, tree: dict) -> None:
        self._set_experiment(experiment, "tree", tree)

    def load_tree(self, experiment: str) -> dict | None:
        rows = self._read("SELECT tree FROM experiments WHERE name=?", (experiment,))
        return _json_or_none(rows[0][0]) if rows else None

    def set_status(self, experiment: str, status: dict) -> None:
        self._set_experiment(experiment, "status", status)

    def get_status(self, experiment: str) -> dict:
        rows = self._read("SELECT status FROM experiments WHERE name=?", (experiment,))
        return (_json_or_none(rows[0][0]) if rows else None) or {}

    def experiments(self) -> list[str]:
        rows = self._read("SELECT name FROM experiments UNION SELECT DISTINCT experiment FROM queries ORDER BY 1")
        return [r[0] for r in rows]

    # ---- deletion ----
    def delete_labels(self, experiment: str) -> dict:
        """Delete the experiment's queries (pending, answered, cancelled) and its sort tree; keeps its status line.
        Returns {"queries", "answers", "trees"} deleted."""
        with self._write() as db:
            sql = "SELECT COUNT(*) FROM queries WHERE experiment=? AND status='answered'"
            answers = db.execute(sql, (experiment,)).fetchone()[0]
            queries = db.execute("DELETE FROM queries WHERE experiment=?", (experiment,)).rowcount
            sql = "UPDATE experiments SET tree=NULL WHERE name=? AND tree IS NOT NULL"
            trees = db.execute(sql, (experiment,)).rowcount
        return {"queries": int(queries), "answers": int(answers), "trees": int(trees)}

    def delete_clips(self) -> dict:
        """Delete every clip of the env (rows and files) and every experiment's queries and sort tree.
        Returns {"clips", "queries", "answers", "trees"} deleted."""
        with self._write() as db:
            answers = db.execute("SELECT COUNT(*) FROM queries WHERE status='answered'").fetchone()[0]
            queries = db.execute("DELETE FROM queries").rowcount
            trees = db.execute("UPDATE experiments SET tree=NULL WHERE tree IS NOT NULL").rowcount
            clips = db.execute("DELETE FROM clips").rowcount
        for f in self.clips_dir.iterdir():
            if f.is_file() and f.name.startswith("clip_"):
                f.unlink(missing_ok=True)
        return {"clips": int(clips), "queries": int(queries), "answers": int(answers), "trees": int(trees)}

    def close(self) -> None:
        with self._lock:
            self._db.close()


# ---- the labelling web app ----
# The pages' HTML, CSS and JavaScript are static files in preference_labelling_app_pages/ beside this file: label.html
# (the comparison and sort-tree pages), tree.html (the tree view), common.js (requests, the status line, why a page is
# empty) and page.css. Each server fills in their __PLACEHOLDERS__ once (_page_html); the data comes from the JSON API.
PAGES_DIR = Path(__file__).resolve().with_name("preference_labelling_app_pages")
PAGE_FILES = ("label.html", "tree.html", "common.js", "page.css")


def _read_pages() -> dict[str, str]:
    try:
        return {name: (PAGES_DIR / name).read_text(encoding="utf-8") for name in PAGE_FILES}
    except OSError as e:  # the file was copied without its folder: main's validation reports this ImportError
        raise ImportError(f"{e.filename}: {e.strerror}") from e


PAGES = _read_pages()
PAGE_WORDS = {  # the comparison page's words, then the sort-tree page's
    "__HEADING__": ("Which clip shows the better behaviour?", "Where does the new clip belong?"),
    "__HINT__": (
        "Watch both looping clips and pick the one closer to what you want the agent to do.",
        "Is the clip being sorted in better or worse than the clip from the tree?",
    ),
    "__LEFT_CAPTION__": ("Left", "The clip being sorted in"),
    "__RIGHT_CAPTION__": ("Right", "A clip already in the tree"),
    "__LEFT_BUTTON__": ("Left is better", "New clip is better"),
    "__RIGHT_BUTTON__": ("Right is better", "Tree clip is better"),
}
CLIP_FILE = re.compile(r"^clip_[0-9a-f]{16}\.(gif|png)$")
CLIENT_ID = re.compile(r"^[0-9a-f]{16}$")  # what the pages' cookie holds
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_BODY = 4096  # an answer is about 40 bytes, a lease of 10 ids about 150
MAX_BRACKETS = 8  # bounds the body's nesting (json.loads recurses per level)
MAX_ID = 2**63 - 1  # SQLite's largest integer


def _number(text: str, low: int, high: int, what: str) -> int:
    """A decimal number of ASCII digits within [low, high] (`"²".isdigit()` is true, but int() refuses it)."""
    if not re.fullmatch(r"[0-9]{1,19}", text) or not low <= int(text) <= high:
        raise HttpError(400, f"{what} must be a whole number from {low} to {high}, got {text[:20]!r}")
    return int(text)


def _id(value) -> bool:
    return type(value) is int and 1 <= value <= MAX_ID


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())  # bytes: compare_digest refuses non-ASCII text


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _page_html(experiment: str, view: str, lease_s: float) -> bytes:
    """The HTML of one page ("compare", "sort" or "tree"); built once per server, the data comes from the API."""
    base = "/experiments/" + urllib.parse.quote(experiment, safe="")
    links = [("compare", "Compare pairs"), ("sort", "Sort clips into the tree"), ("tree", "Tree view")]
    nav = "".join(f'<a href="{base}/{v}" class="{"here" if v == view else ""}">{t}</a>' for v, t in links)
    nav += f'<span class="experiment">experiment {html.escape(experiment)}</span>'
    text, config = PAGES["tree.html"], {"experiment": experiment, "token": "__LABELLER_TOKEN__"}
    if view != "tree":
        words = {key: pair[view == "sort"] for key, pair in PAGE_WORDS.items()}
        text = PAGES["label.html"]
        for key, value in words.items():
            text = text.replace(key, value)
        config |= {"kind": "pair" if view == "compare" else "tree", "leaseSeconds": lease_s}
        config |= {"leftButton": words["__LEFT_BUTTON__"].lower(), "rightButton": words["__RIGHT_BUTTON__"].lower()}
    text = text.replace("__CONFIG__", json.dumps(config).replace("</", "<\\/"))
    text = text.replace("__TITLE__", f"{html.escape(experiment)}: labelling").replace("__NAV__", nav)
    return text.replace("__COMMON_JS__", PAGES["common.js"]).replace("__CSS__", PAGES["page.css"]).encode()


class LabellingServer(ThreadingHTTPServer):
    """The app's HTTP server: one thread per connection; `shutdown()` stops it and frees the port."""

    daemon_threads = True
    request_queue_size = 128  # socketserver's default backlog of 5 resets connections when 20 people open pages

    def __init__(self, address, store: LabelStore, experiment: str, feedback: str, lease_s: float):
        self.store, self.experiment, self.feedback, self.lease_s = store, experiment, feedback, lease_s
        self.stopped, self.secret = False, secrets.token_bytes(16)
        self.pages = {view: _page_html(experiment, view, lease_s) for view in ("compare", "sort", "tree")}
        super().__init__(address, LabellingHandler)
        # Loopback: only requests addressed to this machine by name (no DNS rebinding). Beyond it: any name,
        # but every request carries the access token printed at start-up (its cookie, set by /?token=...).
        port, local = self.server_address[1], address[0] in LOOPBACK
        self.hosts = {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")} if local else None
        self.access_token = None if local else secrets.token_urlsafe(16)

    def client_token(self, client: str) -> str:
        """The token a page sends with each API request: its client id, signed (only this server's pages know it,
        and another origin cannot read them)."""
        return client + "." + hmac.new(self.secret, client.encode(), "sha256").hexdigest()[:32]

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a browser went away: no traceback
            return
        super().handle_error(request, client_address)

    def shutdown(self) -> None:
        self.stopped = True  # browsers keep connections open: their next request is refused, not served
        super().shutdown()
        self.server_close()


class LabellingHandler(BaseHTTPRequestHandler):
    """Routes: / (redirect), /experiments/<name>/{compare,sort,tree} (pages), /clips/<file> (rendered clips), and
    /api/experiments/<name>/{next,answer,lease,status,tree} (JSON). Client errors get a JSON 4xx, never a 500."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: Nagle + delayed ACK cost 40 ms each
    server_version = "preference-labels/1"
    timeout = 60  # an idle keep-alive connection frees its thread after a minute

    def log_message(self, format, *args):  # a request log line per clip would drown the training log
        pass

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (a malformed request, an unknown method: PUT, HEAD, ...) as the
        app's JSON errors; an unknown method is 405, not 501."""
        self.close_connection = True
        code = 405 if code == HTTPStatus.NOT_IMPLEMENTED else code
        message = f"{self.command} is not allowed: use GET or POST" if code == 405 else message
        self._send_json(code, {"error": message or HTTPStatus(code).phrase}, {"Allow": "GET, POST"})

    def _dispatch(self, method: str) -> None:
        if self.server.stopped:
            self.close_connection = True
            self._send_json(503, {"error": "the labelling app has stopped"})
            return
        try:
            self._route(method)
        except (HttpError, UnknownQuery, StaleQuery) as e:
            # a refused POST's body may be unread: it must not be taken for the next request
            self.close_connection = self.close_connection or method == "POST"
            self._send_json(e.status, {"error": str(e)})
        except sqlite3.OperationalError as e:  # the database is locked by another process for too long
            self._send_json(503, {"error": f"label store busy ({e}); try again"})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug: say so in JSON and keep serving
            traceback.print_exc()
            self._send_json(500, {"error": f"internal error: {type(e).__name__}"})

    def _route(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
        server: LabellingServer = self.server
        self._check_caller(parts, url.query)
        if parts and parts[0] == "api":
            if len(parts) != 4 or parts[1] != "experiments":
                raise HttpError(404, f"no such endpoint: {url.path}")
            self._check_experiment(parts[2])
            self._api(method, parts[3], urllib.parse.parse_qs(url.query))
            return
        if method != "GET":
            raise HttpError(405, f"{method} is not allowed on {url.path}")
        if not parts:
            view = "compare" if server.feedback == "pairwise" else "sort"
            where = f"/experiments/{urllib.parse.quote(server.experiment, safe='')}/{view}"
            headers = {"Location": where}
            if server.access_token:  # the address printed at start-up: remember its token
                headers["Set-Cookie"] = f"pl_access={server.access_token}; Path=/; SameSite=Strict; HttpOnly"
            self._send(302, b"", "text/plain", headers)
        elif parts == ["favicon.ico"]:
            self._send(204, b"", "image/x-icon")
        elif len(parts) == 2 and parts[0] == "clips":
            self._clip(parts[1])
        elif len(parts) == 3 and parts[0] == "experiments" and parts[2] in server.pages:
            self._check_experiment(parts[1])
            headers, client = {"Cache-Control": "no-store"}, self._cookie("pl_client")
            if client is None or not CLIENT_ID.match(client):  # a new browser
                client = secrets.token_hex(8)
                headers["Set-Cookie"] = f"pl_client={client}; Path=/; SameSite=Strict; HttpOnly"
            page = server.pages[parts[2]].replace(b"__LABELLER_TOKEN__", server.client_token(client).encode())
            self._send(200, page, "text/html; charset=utf-8", headers)
        else:
            raise HttpError(404, f"no such page: {url.path}")

    def _api(self, method: str, endpoint: str, params: dict) -> None:
        server: LabellingServer = self.server
        store, experiment = server.store, server.experiment
        posts = {"answer", "lease"}
        if endpoint not in posts | {"next", "status", "tree"}:
            raise HttpError(404, f"no such endpoint: {endpoint}")
        if (method == "POST") != (endpoint in posts):
            raise HttpError(405, f"{method} is not allowed on {endpoint}")
        client = self._client()
        if endpoint == "next":
            kind = params.get("kind", ["pair" if server.feedback == "pairwise" else "tree"])[0]
            count = params.get("count", ["1"])[0]
            if kind not in QUERY_KINDS:
                raise HttpError(400, f"next takes kind in {QUERY_KINDS}, got {kind[:20]!r}")
            count = _number(count, 1, 5, "count")
            queries = store.next_queries(experiment, kind, client, count, server.lease_s)
            media = store.clip_media([c for q in queries for c in (q["left"], q["right"])])

            def clip(cid):
                found = media.get(cid, {})
                return {"id": cid, "media": "/clips/" + found.get("media", "missing"), "length": found.get("length")}

            sides = ("left", "right")
            out = [{k: q[k] for k in ("id", "kind", "node")} | {s: clip(q[s]) for s in sides} for q in queries]
            self._send_json(200, {"queries": out, "lease_s": server.lease_s})
        elif endpoint == "answer":
            body = self._json_body()
            query_id, answer = body.get("query_id"), body.get("answer")
            if not _id(query_id):
                raise HttpError(400, f'the body needs "query_id": an integer from 1 to {MAX_ID}')
            if answer not in ANSWERS:
                raise HttpError(400, f'the body needs "answer": one of {list(ANSWERS)}')
            store.answer(experiment, query_id, answer, f"web:{client}", client)
            self._send_json(200, {"ok": True, "query_id": query_id, "answer": answer})
        elif endpoint == "lease":
            ids = self._json_body().get("query_ids")
            if not isinstance(ids, list) or len(ids) > 10 or not all(_id(i) for i in ids):
                raise HttpError(400, f'the body needs "query_ids": at most 10 integers from 1 to {MAX_ID}')
            held = store.renew_leases(experiment, ids, client, server.lease_s)
            self._send_json(200, {"held": held})
        elif endpoint == "status":
            status, pending = store.get_status(experiment), store.count_pending(experiment)
            answers = store.count_answers(experiment)
            kind = "pair" if server.feedback == "pairwise" else "tree"
            out = {"experiment": experiment, "feedback": server.feedback, "kind": kind, "status": status}
            self._send_json(200, out | {"pending": pending, "answers": answers, "now": time.time()})
        else:
            tree = store.load_tree(experiment)
            nodes = (tree.get("nodes") or {}).values() if isinstance(tree, dict) else []
            media = store.clip_media([c for node in nodes for c in node.get("clips", []) if type(c) is int])
            clips = {str(i): {k: "/clips/" + m[k] for k in ("media", "poster")} for i, m in media.items()}
            self._send_json(200, {"tree": tree, "clips": clips})

    def _check_experiment(self, name: str) -> None:
        if name != self.server.experiment:
            raise HttpError(404, f"unknown experiment {name!r}: this server labels {self.server.experiment!r}")

    def _cookie(self, name: str) -> str | None:
        for part in self.headers.get("Cookie", "").split(";"):
            key, _, value = part.strip().partition("=")
            if key == name:
                return value
        return None

    def _check_caller(self, parts: list, query: str) -> None:
        """Only the person's own browser: requests addressed to this server (Host), from its own pages (Origin),
        and beyond loopback, with the access token printed at start-up."""
        server, host = self.server, self.headers.get("Host", "")
        if server.hosts is not None and host not in server.hosts:
            raise HttpError(403, f"this app answers at {min(server.hosts)}, not at {host!r}")
        origin = self.headers.get("Origin")
        if origin is not None and origin != f"http://{host}":
            raise HttpError(403, f"requests from the pages of {origin} are refused")
        if server.access_token is None:
            return
        given = (self._cookie("pl_access") or "", urllib.parse.parse_qs(query).get("token", [""])[0])
        if not any(_same(token, server.access_token) for token in given):
            raise HttpError(403, "open the address the training script printed at start-up (it holds the token)")

    def _client(self) -> str:
        """The browser's id, from the signed token its page sends in X-Labeller (leases are bound to it)."""
        token = self.headers.get("X-Labeller", "")
        client = token.partition(".")[0]
        if not CLIENT_ID.match(client) or not _same(token, self.server.client_token(client)):
            raise HttpError(403, "no valid X-Labeller token: reload the page")
        return client

    def _json_body(self) -> dict:
        if self.headers.get_content_type() != "application/json":
            raise HttpError(415, "send the body as application/json")
        length = self.headers.get("Content-Length")
        if length is None:
            raise HttpError(411, "send a JSON body with a Content-Length")
        length = _number(length, 0, 2**62, "Content-Length")
        if length > MAX_BODY:
            raise HttpError(413, f"the body is over {MAX_BODY} bytes")
        raw = self.rfile.read(length)
        if raw.count(b"[") + raw.count(b"{") > MAX_BRACKETS:
            raise HttpError(400, f"the body nests more than {MAX_BRACKETS} brackets")
        try:
            body = json.loads(raw)
        except ValueError:  # not JSON, not UTF-8, or a number of over 4,300 digits
            raise HttpError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the body must be a JSON object")
        return body

    def _clip(self, name: str) -> None:
        """A rendered clip: a unique, never reused name, so browsers may keep it for a year without asking again."""
        if not CLIP_FILE.match(name):
            raise HttpError(404, f"no clip {name!r}")
        etag = f'"{name}"'
        headers = {"Cache-Control": "public, max-age=31536000, immutable", "ETag": etag}
        if self.headers.get("If-None-Match") == etag:
            self._send(304, b"", None, headers)
            return
        try:
            data = (self.server.store.clips_dir / name).read_bytes()
        except FileNotFoundError:
            raise HttpError(404, f"no clip {name!r}") from None
        self._send(200, data, "image/gif" if name.endswith(".gif") else "image/png", headers)

    def _send_json(self, status: int, payload: dict, headers: dict | None = None) -> None:
        headers = {"Cache-Control": "no-store"} | (headers or {})
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _send(self, status: int, body: bytes, content_type: str | None, headers: dict | None = None) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and status != 304:
            self.wfile.write(body)


def serve_labelling_app(
    store: LabelStore, experiment: str, feedback: str, host: str = "127.0.0.1", port: int = 8000, lease_s: float = 30.0
) -> LabellingServer:
    """Serve the labelling app for one experiment in a daemon thread; returns the server (`.server_address`,
    `.shutdown()`, `.access_token`: None on loopback, else the token the address printed at start-up must carry).
    feedback "pairwise" or "sort-tree" picks the page "/" opens. A port in use raises OSError."""
    if feedback not in ("pairwise", "sort-tree"):
        raise ValueError(f"feedback must be 'pairwise' or 'sort-tree', got {feedback!r}")
    server = LabellingServer((host, port), store, experiment, feedback, lease_s)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="labelling").start()
    return server
