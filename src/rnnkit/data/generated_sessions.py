"""Generated machine sessions with exact labels: a small grammar and planted anomalies.

Login, blocks of file / network / stat / sudo events, logout; ``generate_sessions`` plants
anomalies of :data:`ANOMALY_KINDS` and labels them 1. The ``events`` task, its tests,
benchmarks and the default demonstration use it (nothing is downloaded).
"""

from __future__ import annotations

import numpy as np

from rnnkit.data.events import Session

__all__ = ["ANOMALY_KINDS", "generate_sessions"]

#: The kinds of anomaly :func:`generate_sessions` plants.
ANOMALY_KINDS = ("rare", "order", "privilege", "truncated")


def _blocks(rng: np.random.Generator, admin: bool) -> list[list[str]]:
    kinds = ["file", "file", "net", "stat", "sudo"] if admin else ["file", "file", "net", "stat"]
    blocks = []
    for _ in range(int(rng.integers(3, 8))):
        kind = rng.choice(kinds)
        if kind == "file":
            blocks.append(["open", *["read"] * int(rng.integers(1, 5)), "close"])
        elif kind == "net":
            blocks.append(["connect", "send", *["recv"] * int(rng.integers(1, 4)), "close_sock"])
        elif kind == "stat":
            blocks.append(["stat"])
        else:
            blocks.append(["sudo", "write_cfg"])
    return blocks


def _session(admin: bool, blocks: list[list[str]]) -> list[str]:
    return ["login:admin" if admin else "login:user", *(e for b in blocks for e in b), "logout"]


def _normal_events(rng: np.random.Generator) -> list[str]:
    admin = bool(rng.random() < 0.3)
    return _session(admin, _blocks(rng, admin))


def _planted_events(kind: str, rng: np.random.Generator) -> list[str]:
    if kind == "privilege":
        # A well-formed sudo block between two blocks of a *user* session: every trigram
        # of it occurs in admin sessions, only the first event tells it is wrong.
        blocks = _blocks(rng, admin=False)
        blocks.insert(
            int(rng.integers(len(blocks) // 2 + 1, len(blocks) + 1)), ["sudo", "write_cfg"]
        )
        return _session(False, blocks)
    events = _normal_events(rng)
    if kind == "rare":
        events.insert(int(rng.integers(1, len(events))), "exec_shell")
    elif kind == "order":  # a file is read before it is opened
        events.insert(int(rng.integers(1, len(events))), "read")
        where = int(rng.integers(1, len(events)))
        events[where:where] = ["close", "open"]
    else:  # truncated: the session stops before its logout
        events = events[: int(rng.integers(2, len(events) - 1))]
    return events


def generate_sessions(
    n: int, *, anomalies: int = 0, seed: int = 0, prefix: str = "s"
) -> list[Session]:
    """Sessions of a small grammar (login, file/network/stat/sudo blocks, logout), with
    ``anomalies`` of them (label 1) broken in one of :data:`ANOMALY_KINDS` ways, in turn:
    a never-seen event, a read before its open, a user session that escalates (a
    well-formed ``sudo`` block, normal in admin sessions: only the first event, many
    events back, tells it is wrong), a session cut off.

    For tests, benchmarks and demonstrations: normal sessions are labelled 0.

    >>> s = generate_sessions(3, anomalies=1, seed=1)
    >>> [x.label for x in s], s[0].events[0], s[0].events[-1]
    ([0, 0, 1], 'login:user', 'logout')
    """
    rng = np.random.default_rng(seed)
    out = [Session(f"{prefix}{i}", _normal_events(rng), 0) for i in range(n - anomalies)]
    for j in range(anomalies):
        kind = ANOMALY_KINDS[j % len(ANOMALY_KINDS)]
        events = _planted_events(kind, rng)
        out.append(Session(f"{prefix}{n - anomalies + j}", events, 1))
    return out
