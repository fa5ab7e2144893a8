"""The report in a real browser: headless Chromium opens it with no network, and it loads
without an error (no script error, no console or CSP error, no failed or outside request)
and every image decodes.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages on file descriptors 3 and 4, NUL-terminated), so nothing but the standard
library is needed and no port is opened. The session fixture finds Debian's ``chromium``
or installs it (``apt-get install -y chromium``, as root, with a timeout); where that is
impossible the test is skipped and the reason says why.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import random
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from rnnkit.app.config import TrainConfig
from rnnkit.app.report import write_report
from rnnkit.app.tasks.lm import train_lm

INSTALL_TIMEOUT_S = 900
BROWSER_TIMEOUT_S = 60
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def apt(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        ["apt-get", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium executable, installed with apt-get when absent (root only)."""
    found = find_chromium()
    if found:
        return found
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("Chromium is not installed and installing it needs root (apt-get)")
    if not shutil.which("apt-get"):
        pytest.skip("Chromium is not installed and there is no apt-get to install it")
    deadline = time.monotonic() + INSTALL_TIMEOUT_S
    install = ("install", "-y", "-q", "--no-install-recommends", "chromium")
    try:
        done = apt(*install, timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0:  # package lists missing or stale: update once, retry
            apt("update", "-q", timeout=max(1.0, deadline - time.monotonic()))
            done = apt(*install, timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.skip(f"installing Chromium took over {INSTALL_TIMEOUT_S} s (apt-get timed out)")
    found = find_chromium()
    if not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"Chromium could not be installed (apt-get exit {done.returncode}: {tail[0]})")
    return found


class DevTools:
    """A minimal DevTools-protocol client over ``--remote-debugging-pipe``."""

    def __init__(self, executable: str, profile: Path, log: Path) -> None:
        flags = [
            "--headless",
            "--no-sandbox",  # root in a container: the sandbox cannot start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-default-apps",
            "--no-first-run",
            "--no-default-browser-check",
            "--mute-audio",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "about:blank",
        ]
        self.log = log
        self.stderr = open(log, "wb")  # noqa: SIM115 (closed in close())
        # The pipe protocol reads commands on fd 3 and writes replies on fd 4.
        script = 'exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2'
        self.proc = subprocess.Popen(
            ["sh", "-c", script, executable, *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(AssertionError, OSError):
                self.send("Browser.close", timeout=5)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            stream.close()

    def log_tail(self) -> str:
        self.stderr.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])

    def _read(self, deadline: float) -> dict[str, Any]:
        fd = self.proc.stdout.fileno()
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"no reply from Chromium in time; its log:\n{self.log_tail()}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                assert chunk, f"Chromium closed the pipe; its log:\n{self.log_tail()}"
                self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, session: str | None = None, timeout: float = 30, **params):
        """Send a command and wait for its result; events meanwhile are kept."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.proc.stdin.write(json.dumps(message).encode() + b"\0")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._read(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event


CHECK_IMAGES = """
(async () => {
  const images = Array.from(document.images);
  const results = await Promise.all(images.map(async (img) => {
    try { await img.decode(); } catch (e) { return {ok: false, error: String(e)}; }
    return {ok: img.complete && img.naturalWidth > 0 && img.naturalHeight > 0,
            width: img.naturalWidth, height: img.naturalHeight,
            declared: [Number(img.getAttribute("width")),
                       Number(img.getAttribute("height"))]};
  }));
  return JSON.stringify({images: results, title: document.title,
                         sections: document.querySelectorAll("section").length,
                         ready: document.readyState});
})()
"""


def corpus(lines: int, seed: int) -> str:
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "red", "hat"]
    return "".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) + "\n" for _ in range(lines)
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    (root / "train.txt").write_text(corpus(100, 0), encoding="utf-8")
    (root / "valid.txt").write_text(corpus(20, 1), encoding="utf-8")
    cfg = TrainConfig(
        task="lm",
        train=str(root / "train.txt"),
        valid=str(root / "valid.txt"),
        out=str(root / "run"),
        cell="gru",
        hidden=10,
        embedding=8,
        batch_size=4,
        bptt="segment:16",
        steps=60,
        eval_every=30,
        ngram_order=3,
    ).validate()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_lm(cfg, quiet=True)
        return write_report(root / "run")
    finally:
        torch.set_num_threads(before)


def visit(chromium: str, page: Path, tmp: Path) -> tuple[dict[str, Any], list, bytes]:
    """Open ``page`` in a fresh headless Chromium: (what the page script saw, the
    DevTools events of the load, a screenshot)."""
    browser = DevTools(chromium, tmp / "profile", tmp / "chromium.log")
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        attached = browser.send("Target.attachToTarget", targetId=target, flatten=True)
        session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session)
        browser.send("Page.navigate", session, url=page.resolve().as_uri())
        browser.wait_for("Page.loadEventFired", timeout=BROWSER_TIMEOUT_S)
        result = browser.send(
            "Runtime.evaluate",
            session,
            timeout=BROWSER_TIMEOUT_S,
            expression=CHECK_IMAGES,
            awaitPromise=True,
            returnByValue=True,
        )
        assert "exceptionDetails" not in result, result
        seen = json.loads(result["result"]["value"])
        shot = browser.send("Page.captureScreenshot", session, format="png")["data"]
        return seen, list(browser.events), base64.b64decode(shot)
    finally:
        browser.close()


def problems(seen: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """Everything that went wrong while loading, one line each."""

    def of(method: str) -> list[dict[str, Any]]:
        return [e["params"] for e in events if e.get("method") == method]

    out = []
    for i, image in enumerate(seen["images"]):
        if not image["ok"]:
            out.append(f"image {i} does not decode: {image}")
        elif [image["width"], image["height"]] != image["declared"]:
            out.append(f"image {i} is not the size its tag says: {image}")
    out += [f"script error: {e['exceptionDetails']}" for e in of("Runtime.exceptionThrown")]
    # CSP violations and failed loads are logged as errors here.
    out += [
        f"log: {e['entry']['text']}" for e in of("Log.entryAdded") if e["entry"]["level"] == "error"
    ]
    out += [
        f"console: {e['args']}"
        for e in of("Runtime.consoleAPICalled")
        if e["type"] in ("error", "assert")
    ]
    out += [f"failed request: {e}" for e in of("Network.loadingFailed")]
    out += [
        f"outside request: {e['request']['url']}"
        for e in of("Network.requestWillBeSent")
        if not e["request"]["url"].startswith(("file:", "data:"))
    ]
    return out


def test_report_loads_in_chromium_and_every_image_decodes(chromium, report, tmp_path):
    seen, events, shot = visit(chromium, report, tmp_path)
    assert seen["ready"] == "complete"
    assert seen["title"].startswith("rnnkit report")
    assert seen["sections"] >= 6
    assert len(seen["images"]) == 7
    assert problems(seen, events) == []
    with Image.open(io.BytesIO(shot)) as im:
        im.load()
        assert len(im.getcolors(1 << 16) or range(2)) > 1  # something was drawn


def test_the_browser_check_catches_a_broken_image_and_an_outside_request(
    chromium, report, tmp_path
):
    """The same check on a doctored copy: a corrupt PNG and an image from the web."""
    text = report.read_text(encoding="utf-8")
    start = text.index("data:image/png;base64,") + len("data:image/png;base64,")
    end = text.index('"', start)
    doctored = text[:start] + base64.b64encode(b"not a png").decode() + text[end:]
    doctored = doctored.replace(
        "</body>", '<img src="https://example.invalid/x.png" alt="x" width="1" height="1"></body>'
    )
    page = tmp_path / "doctored.html"
    page.write_text(doctored, encoding="utf-8")
    seen, events, _ = visit(chromium, page, tmp_path)
    found = problems(seen, events)
    assert any(p.startswith("image 0 does not decode") for p in found), found
    assert any("example.invalid" in p for p in found), found


def test_events_report_with_its_detection_figures_loads_in_chromium(chromium, tmp_path):
    from rnnkit.app.tasks.events import train as train_events
    from rnnkit.data.events import write_sessions
    from rnnkit.data.generated_sessions import generate_sessions

    write_sessions(tmp_path / "train.jsonl", generate_sessions(40, seed=1))
    write_sessions(tmp_path / "valid.jsonl", generate_sessions(30, anomalies=6, seed=2))
    cfg = TrainConfig(
        task="events",
        train=str(tmp_path / "train.jsonl"),
        valid=str(tmp_path / "valid.jsonl"),
        out=str(tmp_path / "run"),
        hidden=8,
        embedding=4,
        epochs=1,
        ngram_order=3,
    ).validate()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_events(cfg, quiet=True)
    finally:
        torch.set_num_threads(before)
    seen, events, _ = visit(chromium, write_report(tmp_path / "run"), tmp_path)
    assert seen["ready"] == "complete"
    # Loss curves, gradient norms, then the ROC/PR curves and the score histograms.
    assert len(seen["images"]) >= 3
    assert problems(seen, events) == []
