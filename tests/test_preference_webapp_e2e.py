"""End to end: a real browser labels a tiny `preference_ga3c_atari.py --labeler human` run through the web app while
training consumes the labels (comparison page, sort-tree page, tree view), and a run interrupted with a half-labelled
store resumes with every answer kept and its pending queries still pending.

Skipped with the reason when Chromium, chromedriver or selenium is missing, unless the environment variable CI is set.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO_ROOT, subprocess_env
from test_preference_labels import (  # noqa: F401 (browser is a fixture)
    COLOUR_PIXELS,
    browser,
    clip_loaded_size,
    press,
    shown_query,
    wait_for,
)

import preference_labelling_app as labels

SCRIPT = "preference_ga3c_atari.py"
ENV = "PongNoFrameskip-v4"
TINY = (
    f"--env-id {ENV} --total-timesteps 6000 --ga3c.workers 4 --ga3c.min-batch-segments 4 --eval.episodes 1 "
    f"--env.max-episode-frames 800 --labels.pretrain 6 --labels.budget 12 --labels.clip-length 5 "
    f"--reward.pretrain-epochs 2 --reward.batch-size 4 --labels.rate-scale 1000 --reward.labels-per-step "
    f"0.02 --torch-threads 1"
).split()
# How the browser answers, in turn: by click and by key, every answer kind.
ACTIONS = [
    ("click", "answer-left", "left"),
    ("key", "\ue014", "right"),
    ("click", "answer-equal", "equal"),
    ("key", "\ue015", "cant_tell"),
]  # \ue014 = ArrowRight, \ue015 = ArrowDown


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """The training script in a subprocess; its output is collected line by line."""

    def __init__(self, *args):
        cmd = [sys.executable, str(REPO_ROOT / SCRIPT), *map(str, TINY), *map(str, args)]
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def output(self) -> str:
        return "".join(self.lines)

    def app_url(self, timeout: float = 120.0) -> str:
        def url():
            for line in self.lines:
                if line.startswith("labelling app: "):
                    return line.split()[2]
            assert self.proc.poll() is None, f"the run ended before serving the app:\n{self.output()[-3000:]}"

        return wait_for(url, timeout, "the labelling app's address")

    def wait(self, timeout: float = 240.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"the run did not finish in {timeout:.0f}s:\n{self.output()[-3000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def label_in_browser(driver, run: Run, count: int | None = None, timeout: float = 240.0) -> list[tuple[int, str]]:
    """Answer what the page shows, alternating click and key, until `count` answers or the run ends.
    Returns the (query id, answer) pairs given, each after the page moved on (the answer was saved)."""
    from selenium.common.exceptions import WebDriverException

    given: list[tuple[int, str]] = []
    deadline = time.time() + timeout
    while run.proc.poll() is None and (count is None or len(given) < count):
        assert time.time() < deadline, f"labelling took over {timeout:.0f}s:\n{run.output()[-3000:]}"
        query = shown_query(driver)
        if query is None or (given and query == given[-1][0]):
            time.sleep(0.1)
            continue
        how, target, answer = ACTIONS[len(given) % len(ACTIONS)]
        try:
            if how == "click":
                driver.find_element("id", target).click()
            else:
                press(driver, target)
        except WebDriverException:  # the page changed under the click (nothing to label): look again
            continue
        while run.proc.poll() is None and shown_query(driver) == query and time.time() < deadline:
            time.sleep(0.05)
        given.append((query, answer))
    return given


def store_answers(store_dir, experiment: str) -> list[dict]:
    store = labels.LabelStore(store_dir, ENV)
    try:
        return store.answers_after(experiment, 0)
    finally:
        store.close()


@pytest.mark.slow
def test_browser_labels_a_pairwise_training_run(browser, tmp_path):  # noqa: F811
    run_dir, store_dir = tmp_path / "run", tmp_path / "store"
    run = Run(
        "--labeler",
        "human",
        "--feedback",
        "pairwise",
        "--labels.port",
        free_port(),
        "--run-dir",
        run_dir,
        "--labels.store-dir",
        store_dir,
        "--exp-name",
        "e2e-pairwise",
    )
    try:
        browser.get(run.app_url())
        assert browser.current_url.endswith("/experiments/e2e-pairwise/compare")
        # The person sees the game in colour at its own resolution, replayed from what the agents did.
        wait_for(lambda: shown_query(browser), 120, "the first pair")
        wait_for(lambda: clip_loaded_size(browser, "clip-left"), what="the left clip to load")
        assert browser.execute_script(COLOUR_PIXELS, "clip-left")[:2] == [160, 210]
        given = label_in_browser(browser, run)
        rc = run.wait()
    finally:
        run.stop()
    assert rc == 0, run.output()[-3000:]
    stored = store_answers(store_dir, "e2e-pairwise")
    # Every answer the browser gave is in the store once, as given, from the web app; nothing else answered.
    assert [(a["id"], a["answer"]) for a in stored] == given[: len(stored)] and len(given) - len(stored) <= 1
    assert all(a["labeller"].startswith("web:") and a["kind"] == "pair" for a in stored)
    # Every clip asked about (from games after an emulator's first too: 800-frame games) replayed in colour.
    from PIL import Image

    sizes = [Image.open(gif).size for gif in (store_dir / f"{ENV}_clips").glob("*.gif")]
    assert len(sizes) > 6 and set(sizes) == {(160, 210)}  # the grey fallback would be 84x84
    # Training asked beyond the pretraining labels and consumed the answers while the agent learned.
    results = json.loads((run_dir / "results.json").read_text())
    assert len(stored) > 6 and results["labels"] == len(stored) and results["updates"] > 0


# Counts the times the page turns to "nothing to label".
COUNT_EMPTY_PAGES = """
window.emptyPages = 0;
const empty = document.getElementById("empty");
new MutationObserver(() => { if (!empty.hidden) window.emptyPages += 1; })
  .observe(empty, {attributes: true, attributeFilter: ["hidden"]});
"""


@pytest.mark.slow
def test_a_fast_labeller_never_meets_an_empty_page(browser, tmp_path):  # noqa: F811
    """During RL, a person answering every half second, as soon as a pair shows, never sees an empty page:
    the teacher keeps --labels.ahead queries ready and refills between reward-model updates."""
    answers, interval, store_dir = 100, 0.5, tmp_path / "store"
    run = Run(
        *("--labeler", "human", "--feedback", "pairwise", "--labels.port", free_port(), "--exp-name", "fast"),
        *("--run-dir", tmp_path / "run", "--labels.store-dir", store_dir),
        *("--total-timesteps", 10**8, "--labels.budget", 1000, "--labels.rate-scale", 5e6),
    )
    try:
        browser.get(run.app_url())
        label_in_browser(browser, run, count=6)  # the pretraining labels, on random play
        status = browser.find_element("id", "status")
        wait_for(lambda: "training the agent" in status.text, 120, "the RL phase")
        last = wait_for(lambda: shown_query(browser), 30, "the first pair of the RL phase")
        browser.execute_script(COUNT_EMPTY_PAGES)
        store, ready, start = labels.LabelStore(store_dir, ENV), [], time.time()
        try:
            for k in range(answers):
                time.sleep(max(0.0, start + k * interval - time.time()))
                query = wait_for(lambda: shown_query(browser), 30, "a pair")
                assert query != last or k == 0
                ready.append(store.count_pending("fast")["pair"])
                press(browser, "1" if k % 2 else "2")
                wait_for(lambda: shown_query(browser) != query, 30, "the answer to be taken")
                last = query
            took, empty_pages = time.time() - start, browser.execute_script("return window.emptyPages")
            given = store.count_answers("fast")
        finally:
            store.close()
    finally:
        run.stop()
    print(f"fast labeller: {answers} answers in {took:.0f}s, {empty_pages} empty pages, ready min {min(ready)}")
    # ready counts the pair on show: 2 or more means another was already waiting behind it at every answer
    assert empty_pages == 0 and given >= 6 + answers and min(ready) >= 2
    assert took < answers * interval + 30  # no answer waited long for its pair


@pytest.mark.slow
def test_resume_with_a_half_labelled_sort_tree_store(browser, tmp_path):  # noqa: F811
    run_dir, store_dir = tmp_path / "run", tmp_path / "store"
    args = (
        "--labeler",
        "human",
        "--feedback",
        "sort-tree",
        "--run-dir",
        run_dir,
        "--labels.store-dir",
        store_dir,
        "--exp-name",
        "e2e-tree",
    )
    first = Run(*args, "--labels.port", free_port())
    try:
        browser.get(first.app_url())
        assert browser.current_url.endswith("/experiments/e2e-tree/sort")
        before = label_in_browser(browser, first, count=3)
        first.proc.send_signal(signal.SIGTERM)
        assert first.wait() == 130, first.output()[-3000:]
    finally:
        first.stop()
    browser.get("about:blank")  # the app is gone; its page would only poll a closed port
    store = labels.LabelStore(store_dir, ENV)
    half = store.answers_after("e2e-tree", 0)
    pending = [q["id"] for q in store.pending_queries("e2e-tree")]
    store.close()
    assert [(a["id"], a["answer"]) for a in half] == before and pending, "half labelled: some answered, some pending"

    # A fresh port: the first run's closed browser connections sit in TIME_WAIT on its port for up to a minute.
    second = Run(*args, "--labels.port", free_port())
    try:
        url = second.app_url()
        store = labels.LabelStore(store_dir, ENV)
        try:  # the resumed run keeps the pending queries pending (the app is up, the browser has not answered)
            assert set(pending) <= {q["id"] for q in store.pending_queries("e2e-tree")}
        finally:
            store.close()
        browser.get(url)
        wait_for(lambda: shown_query(browser) == pending[0], what="the oldest pending query, asked before the stop")
        after = label_in_browser(browser, second, count=2)
        # The tree view while the app is surely up: 5 of the 6 pretraining labels are in, so the run waits for a
        # person. After the 6th it may finish its tiny budget and close the app at any moment.
        browser.get(url.rstrip("/") + "/experiments/e2e-tree/tree")
        nodes = wait_for(lambda: browser.find_elements("css selector", ".node"), what="the tree view's nodes")
        assert second.proc.poll() is None, second.output()[-3000:]
        browser.get(url.rstrip("/") + "/experiments/e2e-tree/sort")
        after += label_in_browser(browser, second, count=2)
        rc = second.wait()
    finally:
        second.stop()
    assert rc == 0, second.output()[-3000:]
    stored = store_answers(store_dir, "e2e-tree")
    # Nothing lost: the first run's answers keep their ids, answers and order; the pending ones were answered once.
    assert [(a["id"], a["answer"]) for a in stored[: len(before)]] == before
    assert [(a["id"], a["answer"]) for a in stored[len(before) : len(before) + len(after)]] == after
    resumed_ids, n = [a["id"] for a in stored][len(before) :], min(len(pending), len(after))
    assert resumed_ids[:n] == pending[:n]  # the old pending queries came first, oldest first
    assert len({a["id"] for a in stored}) == len(stored)
    assert len(nodes) >= 2
    results = json.loads((run_dir / "results.json").read_text())
    assert results["labels"] >= len(before) + len(after) and results["updates"] > 0, second.output()[-3000:]
