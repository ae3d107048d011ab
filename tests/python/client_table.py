#!/usr/bin/env python3
"""CLIENT LIST and INFO clients through ackproxy, compared with a plain
redis-server, for the same population of redis-py clients: the same fields,
in the same order, in the same formats, and the same values where the
clients' states make them equal (name, database, flags, subscriptions,
MULTI, protocol, last command, user), and the same connected and blocked
counts.

Usage: python3 tests/python/client_table.py [--proxy PATH/TO/ackproxy]
(default: $CARGO_TARGET_DIR/release/ackproxy, or target/release/ackproxy).
Exits 0 when everything matches; skips (exit 0, with a message) without
redis-py. CLIENT_TABLE_DEBUG=1 prints both lists.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

try:
    import redis
except ImportError:
    print("skipped: redis-py not installed (pip install redis)")
    sys.exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, what):
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited early ({proc.returncode})")
        try:
            if redis.Redis(port=port, socket_timeout=2).ping():
                return
        except redis.RedisError:
            time.sleep(0.05)
    sys.exit(f"{what} on port {port} never became ready")


def start_redis(tmp):
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, proc, "redis-server")
    return port, proc


def start_proxy(binary, upstream):
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{upstream}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, proc, "ackproxy")
    return port, proc


def populate(port):
    """The same clients, in the same states, on `port`; returns them (to
    keep them open) and the observer that lists them."""
    def client(name, **kw):
        return redis.Redis(port=port, client_name=name, single_connection_client=True,
                           socket_timeout=30, protocol=kw.pop("protocol", 2), **kw)

    keep = []
    plain = client("plain")
    plain.get("k")
    keep.append(plain)

    resp3 = client("resp3", protocol=3)
    resp3.set("k", "v")
    keep.append(resp3)

    db5 = client("db5", db=5)
    db5.get("k")
    keep.append(db5)

    in_multi = client("inmulti")
    conn = in_multi.connection
    conn.send_command("MULTI")
    assert conn.read_response() in (b"OK", "OK")
    conn.send_command("GET", "k")
    assert conn.read_response() in (b"QUEUED", "QUEUED")
    keep.append(in_multi)

    subscriber = client("subscriber")
    pubsub = subscriber.pubsub()
    pubsub.subscribe("news", "weather")
    pubsub.psubscribe("sport.*")
    for _ in range(3):
        pubsub.get_message(timeout=10)
    keep.append((subscriber, pubsub))

    blocked = client("blocked")
    blocked.connection.send_command("BLPOP", "nothing", "0")
    keep.append(blocked)

    observer = client("observer")
    # The blocked client's BLPOP has reached the server.
    deadline = time.time() + 20
    while observer.info("clients")["blocked_clients"] != 1:
        assert time.time() < deadline, "the BLPOP never blocked"
        time.sleep(0.02)
    return keep, observer


# Connections populate() opens: seven clients (one with a pub/sub
# connection besides its own) and the observer.
POPULATION = 8

# Fields whose values must be equal for clients in equal states.
SAME_VALUE = ["name", "db", "flags", "sub", "psub", "ssub", "multi", "obl", "oll",
              "omem", "events", "cmd", "user", "redir", "resp"]


def shape(value):
    """The format of a value: digits, an address, or free text."""
    if re.fullmatch(r"-?\d+", value):
        return "integer"
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+:\d+", value):
        return "address"
    return "text"


def raw_list(observer):
    text = observer.execute_command("CLIENT", "LIST")
    if isinstance(text, bytes):
        text = text.decode()
    lines = [line for line in text.split("\n") if line]
    parsed = []
    for line in lines:
        fields = [f.split("=", 1) for f in line.split(" ")]
        parsed.append([(k, v) for k, v in fields])
    return parsed


def main():
    parser = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    parser.add_argument("--proxy", default=os.path.join(target, "release", "ackproxy"))
    binary = parser.parse_args().proxy
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: build it first (cargo build --release)")

    procs = []
    failures = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            direct_port, p = start_redis(tmp)
            procs.append(p)
            upstream_port, p = start_redis(tmp)
            procs.append(p)
            proxy_port, p = start_proxy(binary, upstream_port)
            procs.append(p)

            lists, infos, keep = {}, {}, []
            for label, port in [("direct", direct_port), ("proxy", proxy_port)]:
                clients, observer = populate(port)
                keep.append((clients, observer))
                # The start-up check's connection may be listed for a moment.
                deadline = time.time() + 20
                while len(raw_list(observer)) != POPULATION and time.time() < deadline:
                    time.sleep(0.02)
                lists[label] = raw_list(observer)
                infos[label] = observer.info("clients")

            # The same number of clients, each with the same fields in order.
            direct, proxied = lists["direct"], lists["proxy"]
            if os.environ.get("CLIENT_TABLE_DEBUG"):
                for label, lines in lists.items():
                    print(label, *[" ".join(f"{k}={v}" for k, v in line) for line in lines], sep="\n")
            if len(direct) != len(proxied):
                failures.append(f"{len(proxied)} clients listed through the proxy, "
                                f"{len(direct)} directly")
            want_keys = [k for k, _ in direct[0]]
            for line in direct + proxied:
                keys = [k for k, _ in line]
                if keys != want_keys:
                    failures.append(f"fields {keys} differ from Redis's {want_keys}")

            by_name = {label: {dict(line)["name"]: dict(line) for line in lines}
                       for label, lines in lists.items()}
            for name, d in by_name["direct"].items():
                p = by_name["proxy"].get(name)
                if p is None:
                    failures.append(f"client {name!r} missing through the proxy")
                    continue
                for key in want_keys:
                    if shape(p[key]) != shape(d[key]):
                        failures.append(f"{name}: {key}={p[key]!r} is not in the form of "
                                        f"Redis's {d[key]!r}")
                for key in SAME_VALUE:
                    if p[key] != d[key]:
                        failures.append(f"{name}: {key}={p[key]!r}, Redis says {d[key]!r}")
                if p["laddr"] != f"127.0.0.1:{proxy_port}":
                    failures.append(f"{name}: laddr={p['laddr']} is not the proxy's address")

            for key in ["connected_clients", "blocked_clients"]:
                if infos["proxy"][key] != infos["direct"][key]:
                    failures.append(f"INFO clients {key}: {infos['proxy'][key]} through the "
                                    f"proxy, {infos['direct'][key]} directly")
            if sorted(infos["proxy"]) != sorted(infos["direct"]):
                failures.append(f"INFO clients fields {sorted(infos['proxy'])} differ from "
                                f"{sorted(infos['direct'])}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()

    if failures:
        print("client_table.py: FAILED")
        for f in failures:
            print("  " + f)
        sys.exit(1)
    print("client_table.py: CLIENT LIST and INFO clients match Redis's "
          f"({len(lists['proxy'])} clients)")


if __name__ == "__main__":
    main()
