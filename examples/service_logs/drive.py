"""Record a real PostgreSQL server's log under normal client sessions and under faults.

Starts a throwaway PostgreSQL cluster in a temporary directory (Unix socket only, no TCP),
creates a small shop database (items, orders), and runs client sessions through ``psql``,
each with its own ``application_name`` (the session id in every log line it causes):

- **normal** sessions: 2-8 actions of a shop client (look up an item, list items under a
  price, an item's order count, buy: a transaction that updates the stock and inserts
  an order, a sales report), on random items, several clients at once;
- **lock_wait**: a normal session whose purchase meets a row lock held by a stuck
  transaction (the injector holds it 0.4 s): its UPDATE waits, the key sequence is normal;
- **slow_scan**: a normal session with order-history look-ups while the index on
  ``orders(item_id)`` has been dropped (a bad migration): each look-up scans the table;
- **dup_key**: a purchase that inserts an order with an id that exists (a client bug):
  ERROR, DETAIL, STATEMENT lines and an aborted transaction;
- **missing_table**: a client querying a table that a migration renamed (``item``).

The server logs every statement with its duration (``log_min_duration_statement = 0``),
connections, disconnections, lock waits and errors, with the prefix
``%m [%p] %a`` (time, pid, application name). Writes ``OUT/postgres.log`` (the server's own
log, unedited) and ``OUT/labels.tsv`` (session id, kind). The injector's and the set-up's
sessions (``inj…``, ``setup``) are in the log but not in the labels.

    python3 examples/service_logs/drive.py --out runs/service_logs/recording [--normal 400]

Standard library only; needs PostgreSQL's server binaries (``record.sh`` installs them)."""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ITEMS = 500
ORDERS = 300_000
PORT = 54329


def _bin(name: str) -> str:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1:]
    if not found:
        sys.exit(f"{name} not found: install PostgreSQL (examples/service_logs/record.sh)")
    return found if isinstance(found, str) else found[0]


def _as_server_user() -> tuple[list[str], int | None, int | None]:
    """The server may not run as root: as root, run it as the ``postgres`` user."""
    if os.geteuid() != 0:
        return [], None, None
    user = pwd.getpwnam("postgres")
    return (["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"],
            user.pw_uid, user.pw_gid)  # fmt: skip


class Server:
    def __init__(self, root: Path, log: Path) -> None:
        self.root, self.log = root, log
        self.wrap, uid, gid = _as_server_user()
        self.data = root / "data"
        root.chmod(0o755)
        if uid is not None:
            os.chown(root, uid, gid)
            log.touch()
            os.chown(log, uid, gid)
        subprocess.run([*self.wrap, _bin("initdb"), "-D", str(self.data), "-A", "trust", "-U",
                        "postgres", "--no-sync", "-E", "UTF8", "--locale", "C"],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        settings = {
            "listen_addresses": "''",  # Unix socket only
            "unix_socket_directories": f"'{root}'",
            "port": str(PORT),
            "log_min_duration_statement": "0",
            "log_connections": "on",
            "log_disconnections": "on",
            "log_lock_waits": "on",
            "log_line_prefix": "'%m [%p] %a '",
            "log_timezone": "UTC",
            "lc_messages": "C",
            "fsync": "off",
            "synchronous_commit": "off",
        }
        options = " ".join(f"-c {k}={v}" for k, v in settings.items())
        subprocess.run([*self.wrap, _bin("pg_ctl"), "-D", str(self.data), "-l", str(log), "-w",
                        "-o", options, "start"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip

    def stop(self) -> None:
        subprocess.run([*self.wrap, _bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                        "stop"], check=False, stdout=subprocess.DEVNULL)  # fmt: skip

    def psql(self, app: str, script: str, database: str = "shop") -> None:
        env = {**os.environ, "PGAPPNAME": app, "PGHOST": str(self.root), "PGPORT": str(PORT),
               "PGUSER": "postgres", "PGDATABASE": database}  # fmt: skip
        subprocess.run([_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=0", "-f", "-"],
                       input=script, text=True, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False, timeout=60)  # fmt: skip


# One statement per line: the server logs a statement as written, and a statement over
# several lines would continue a log line without the prefix.
SETUP = "\n".join([
    "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(8,2), stock int);",
    "INSERT INTO items SELECT i, 'item ' || i, round((1 + (i * 7919 % 1000) / 10.0)::numeric, 2),"
    f" 1000000 FROM generate_series(1, {ITEMS}) i;",
    "CREATE TABLE orders (id serial PRIMARY KEY, item_id int NOT NULL, qty int NOT NULL,"
    " created timestamptz NOT NULL DEFAULT now());",
    f"INSERT INTO orders (item_id, qty, created) SELECT 1 + (i::bigint * 104729 % {ITEMS}),"
    " 1 + i % 5, now() - (i % 86400) * interval '1 second'"
    f" FROM generate_series(1, {ORDERS}) i;",
    "CREATE INDEX orders_item_idx ON orders (item_id);",
    "CREATE INDEX orders_created_idx ON orders (created);",
    "ANALYZE;",
]) + "\n"  # fmt: skip


def action(rng: random.Random, kind: str, item: int | None = None) -> list[str]:
    i = item or rng.randint(1, ITEMS)
    if kind == "browse":
        return [f"SELECT id, name, price, stock FROM items WHERE id = {i};"]
    if kind == "list":
        return [f"SELECT id, name, price FROM items WHERE price < {rng.randint(5, 100)} "
                f"ORDER BY price LIMIT {rng.choice([10, 20, 50])};"]  # fmt: skip
    if kind == "history":
        return [f"SELECT count(*), sum(qty), max(created) FROM orders WHERE item_id = {i};"]
    if kind == "buy":
        q = rng.randint(1, 3)
        return ["BEGIN;", f"UPDATE items SET stock = stock - {q} WHERE id = {i};",
                f"INSERT INTO orders (item_id, qty) VALUES ({i}, {q});", "COMMIT;"]  # fmt: skip
    if kind == "report":
        return ["SELECT count(*), sum(qty) FROM orders WHERE created > now() - interval "
                f"'{rng.choice([5, 10, 30])} minutes';"]  # fmt: skip
    raise ValueError(kind)


KINDS = ["browse", "list", "history", "buy", "report"]
WEIGHTS = [5, 2, 3, 2, 1]


def normal_script(rng: random.Random, must: str | None = None, item: int | None = None) -> str:
    acts = rng.choices(KINDS, WEIGHTS, k=rng.randint(2, 8))
    if must is not None and must not in acts:
        acts[rng.randrange(len(acts))] = must
    lines = []
    for a in acts:
        lines += action(rng, a, item if a == must else None)
    return "\n".join(lines) + "\n"


def dup_key_script(rng: random.Random) -> str:
    acts = rng.choices(KINDS, WEIGHTS, k=rng.randint(1, 4))
    lines = [s for a in acts for s in action(rng, a)]
    i, q = rng.randint(1, ITEMS), rng.randint(1, 3)
    bad = ["BEGIN;", f"UPDATE items SET stock = stock - {q} WHERE id = {i};",
           f"INSERT INTO orders (id, item_id, qty) VALUES ({rng.randint(1, ORDERS)}, {i}, {q});",
           "COMMIT;"]  # fmt: skip
    cut = rng.randint(0, len(lines))
    return "\n".join(lines[:cut] + bad + lines[cut:]) + "\n"


def missing_table_script(rng: random.Random) -> str:
    acts = rng.choices(KINDS, WEIGHTS, k=rng.randint(1, 4))
    lines = [s for a in acts for s in action(rng, a)]
    bad = f"SELECT id, name, price, stock FROM item WHERE id = {rng.randint(1, ITEMS)};"
    lines.insert(rng.randint(0, len(lines)), bad)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/service_logs/recording", type=Path)
    p.add_argument("--normal", type=int, default=400, help="normal sessions (default 400)")
    p.add_argument("--faults", type=int, default=25, help="sessions per fault kind (25)")
    p.add_argument("--clients", type=int, default=4, help="normal clients at once (4)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "postgres.log"
    log.unlink(missing_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rnnkit-pg-"))
    started = time.time()
    server = Server(root, log)
    labels: list[tuple[str, str]] = []
    ids = iter(rng.sample(range(10_000, 100_000), args.normal + 4 * args.faults))
    try:
        server.psql("setup", "CREATE DATABASE shop;", database="postgres")
        server.psql("setup", SETUP)
        # Normal traffic: several clients at once, as a service sees it.
        jobs = []
        for _ in range(args.normal):
            sid = f"s{next(ids)}"
            jobs.append((sid, normal_script(rng)))
            labels.append((sid, "normal"))
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(lambda job: server.psql(*job), jobs))
        # lock_wait: a stuck transaction holds the row the victim buys.
        for n in range(args.faults):
            sid, item = f"s{next(ids)}", rng.randint(1, ITEMS)
            holder = threading.Thread(target=server.psql, args=(
                f"inj{n}", f"BEGIN;\nUPDATE items SET stock = stock WHERE id = {item};\n"
                "SELECT pg_sleep(0.4);\nCOMMIT;\n"))  # fmt: skip
            holder.start()
            time.sleep(0.1)
            server.psql(sid, normal_script(rng, must="buy", item=item))
            holder.join()
            labels.append((sid, "lock_wait"))
        # slow_scan: the index the history look-ups use is gone for a while.
        server.psql("injector", "DROP INDEX orders_item_idx;")
        jobs = [(f"s{next(ids)}", normal_script(rng, must="history")) for _ in range(args.faults)]
        for sid, script in jobs:
            server.psql(sid, script)
            labels.append((sid, "slow_scan"))
        server.psql("injector", "CREATE INDEX orders_item_idx ON orders (item_id);")
        for kind, make in (("dup_key", dup_key_script), ("missing_table", missing_table_script)):
            for _ in range(args.faults):
                sid = f"s{next(ids)}"
                server.psql(sid, make(rng))
                labels.append((sid, kind))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    rng.shuffle(labels)
    (args.out / "labels.tsv").write_text("".join(f"{s}\t{k}\n" for s, k in labels))
    lines = len(log.read_text(encoding="utf-8", errors="replace").splitlines())
    print(f"recorded {len(labels)} client sessions ({lines} log lines) in "
          f"{time.time() - started:.0f} s: {log}, {args.out / 'labels.tsv'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
