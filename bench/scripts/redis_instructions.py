#!/usr/bin/env python3
"""Instructions Redis executes per pop+ACK pair: seed 000's two scripts
called directly (EVALSHA) against ackproxy's queue functions (FCALL), both
on a redis-server run under valgrind's callgrind, which counts
instructions rather than time, so the figures repeat whatever else the
machine is doing.

The calls are the ones ackproxy itself sends: a real proxy (ACKPROXY_BIN,
default target/release/ackproxy) is started on a plain redis-server with
a `json:id` rule, one message is popped and acknowledged through it while
MONITOR records the calls (each a function of the library, FCALL, or a
script of lua/scripts, EVALSHA: take.lua for a pop of one when nothing
is due, release.lua for an ACK of a lease the proxy handed out itself),
its function library is copied with FUNCTION DUMP / RESTORE and the
scripts loaded with SCRIPT LOAD. Then, for each side on a fresh callgrind Redis:
N messages of 128 B `{"id":"<12 digits>","body":"x…"}` are pushed, 100
pairs warm it up, the counters are zeroed, and the remaining pairs are
sent pipelined (100 requests per write) from this process.

With REDIS_INSTR_MORE=1 it also counts, the same way, a BRPOPLPUSH +
LREM pair (take_move.lua and lrem_ack.lua, the LREM removing the copy
the pop moved into a processing list that holds ten others) and a
next-pop pop that acknowledges the one before (take_owned.lua), each
against the RPOP + ACK pair.

REDIS_INSTR_OUTSTANDING=k keeps k leases outstanding, as k workers would:
each ACK (LREM) acknowledges the message popped k - 1 pairs before, and
the next-pop pops take turns over k connections. Redis keeps a sorted set
of up to 128 small members as a listpack, searched from one end, so what
a lease index costs grows with k.

Usage: python3 bench/scripts/redis_instructions.py [N]   (default 3000)
REDIS_INSTR_KEEP=<dir> keeps each side's callgrind file there, for
callgrind_annotate.
Needs: redis-server, valgrind (callgrind_control), python3.
"""
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
OUT = max(1, int(os.environ.get("REDIS_INSTR_OUTSTANDING", "1")))
WARM = 100


def enc(args):
    args = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk
        i = self.buf.index(b"\r\n")
        line, self.buf = self.buf[:i], self.buf[i + 2:]
        return line

    def read(self):
        line = self._line()
        t = line[:1]
        if t in b"+-:":
            return line
        if t == b"$":
            n = int(line[1:])
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(1 << 20)
            d, self.buf = self.buf[:n], self.buf[n + 2:]
            return d
        if t == b"*":
            n = int(line[1:])
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError(line)

    def cmd(self, *args):
        self.s.sendall(enc(args))
        return self.read()

    def pipe(self, reqs, chunk=100):
        out = []
        for i in range(0, len(reqs), chunk):
            part = reqs[i:i + chunk]
            self.s.sendall(b"".join(enc(r) for r in part))
            out.extend(self.read() for _ in part)
        return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_conn(port, proc):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"process on port {port} exited")
        try:
            c = Conn(port)
            if c.cmd("PING") == b"+PONG":
                return c
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"nothing answers on port {port}")


def message(i):
    return b'{"id":"%012d","body":"%s"}' % (i, b"x" * (128 - 31))


def proxy_calls(tmp):
    """The pop and ACK FCALLs ackproxy sends, and its library."""
    binary = os.environ.get("ACKPROXY_BIN", os.path.join(HERE, "..", "..", "target", "release", "ackproxy"))
    rport, pport = free_port(), free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [redis]
    try:
        direct = wait_conn(rport, redis)
        cfg = os.path.join(tmp, "ackproxy.toml")
        with open(cfg, "w") as f:
            f.write(f'listen = "127.0.0.1:{pport}"\nupstream = "127.0.0.1:{rport}"\n'
                    '[[queue]]\npattern = "jobs"\nack_id = "json:id"\n'
                    '[[queue]]\npattern = "np"\nack_id = "json:id"\nack = "next-pop"\n')
        proxy = subprocess.Popen([binary, "--config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proxy)
        p = wait_conn(pport, proxy)
        p.cmd("LPUSH", "jobs", message(0))
        p.cmd("RPOP", "jobs")  # loads the library
        p.cmd("ACK", "jobs", b"%012d" % 0)
        mon = Conn(rport)
        mon.s.sendall(enc(["MONITOR"]))
        mon.read()
        p.cmd("LPUSH", "jobs", message(1))
        p.cmd("RPOP", "jobs")
        p.cmd("ACK", "jobs", b"%012d" % 1)
        calls = []
        while len(calls) < 2:
            line = mon.read()
            if b"[0 lua]" in line:
                continue
            body = line[line.index(b"] ") + 2:].decode("latin1")
            args = [eval('b"' + a + '"') for a in re.findall(r'"((?:[^"\\]|\\.)*)"', body)]
            name = args[1] if len(args) > 1 else b""
            # The pop, then the ACK: each a function of the library, or a
            # script of lua/scripts (EVALSHA): take.lua's 2 keys and 3
            # arguments, release.lua's 1 and 1, without the totals that a
            # call carries once per 100 calls or per second.
            if args[0].upper() == b"EVALSHA":
                base = (2, 3) if not calls else (1, 1)
                n = int(args[2])
                calls.append(args[:2] + [b"%d" % base[0]] + args[3:3 + base[0]]
                             + args[3 + n:3 + n + base[1]])
            elif args[0].upper() == b"FCALL" and name.startswith(b"ackq_pop1_" if not calls else b"ackq_ack_"):
                calls.append(args)
        more = {}
        if os.environ.get("REDIS_INSTR_MORE"):
            more = more_calls(p, mon)
        dump = direct.cmd("FUNCTION", "DUMP")
        return calls[0], calls[1], dump, more
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def evalsha_calls(mon, n):
    """The next n EVALSHA calls MONITOR shows, without the totals a call
    carries once per 100 calls or per second (their stats key and three
    arguments)."""
    calls = []
    while len(calls) < n:
        line = mon.read()
        if b"[0 lua]" in line:
            continue
        body = line[line.index(b"] ") + 2:].decode("latin1")
        args = [eval('b"' + a + '"') for a in re.findall(r'"((?:[^"\\]|\\.)*)"', body)]
        if args[0].upper() == b"EVALSHA":
            calls.append(args)
    return calls


def strip_totals(call, keys, argv):
    n = int(call[2])
    if n == keys:
        return call
    return call[:2] + [b"%d" % keys] + call[3:3 + keys] + call[3 + n:3 + n + argv]


def more_calls(p, mon):
    """take_move.lua's and lrem_ack.lua's calls for a BRPOPLPUSH and its
    LREM, and take_owned.lua's for a next-pop pop that acknowledges."""
    p.cmd("LPUSH", "jobs", message(2))
    p.cmd("BRPOPLPUSH", "jobs", "doing:jobs", "1")
    p.cmd("LREM", "doing:jobs", "1", message(2))
    take_move, lrem = evalsha_calls(mon, 2)
    p.cmd("LPUSH", "np", message(3), message(4))
    p.cmd("RPOP", "np")
    p.cmd("RPOP", "np")
    _, owned = evalsha_calls(mon, 2)
    return {"take_move": strip_totals(take_move, 3, 5), "lrem": strip_totals(lrem, 2, 5),
            "owned": strip_totals(owned, 2, 6)}


# One take call in this many makes the lease set a skiplist, as the
# proxy's SKIPLIST_EVERY (src/queue/rules.rs) asks.
SKIPLIST_EVERY = 64


def skiplist_mark():
    """The literal src/queue/library/script.rs puts for SKIPLIST_MARK."""
    with open(os.path.join(HERE, "..", "..", "src", "queue", "library", "script.rs"), "rb") as f:
        return re.search(rb'const SKIPLIST_MARK: &str =\s*"([^"]*)";', f.read()).group(1)


def with_turns(call):
    """A take call (EVALSHA) as the proxy makes it the i-th time, i from 0:
    its end letter lower case, asking for a skiplist, once every
    SKIPLIST_EVERY calls."""
    at = 3 + int(call[2])
    count = iter(range(10 ** 9))

    def nth(_e=None):
        turn = next(count) % SKIPLIST_EVERY == 0
        end = call[at].lower() if turn else call[at].upper()
        return call[:at] + [end] + call[at + 1:]
    return nth


def script_texts():
    """The scripts of lua/scripts as src/queue/library/script.rs makes
    them."""
    lua = os.path.join(HERE, "..", "..", "lua")
    read = lambda *p: open(os.path.join(lua, *p), "rb").read()
    mark = skiplist_mark()
    core = (b"(function()\n" + read("lease_core.lua")
            + b"\nreturn { ack_id = ack_id, id_key = id_key, claim = claim, "
            b"move_leases = move_leases, drop = drop }\nend)()")
    out = []
    for name in ("take.lua", "take_move.lua", "lrem_ack.lua", "take_owned.lua"):
        text = read("scripts", name).replace(b"\nTAKE_TOKEN\n", b"\n" + read("scripts", "token.lua"))
        text = text.replace(b"\nTAKE_DEADLINE\n", b"\n" + read("scripts", "deadline.lua"))
        out.append(text.replace(b"SKIPLIST_MARK", mark).replace(b"LEASE_CORE", core))
    out.append(read("scripts", "release.lua"))
    return out


def instructions(label, tmp, setup, pop_of, ack_of, queue="jobs"):
    port = free_port()
    out = os.path.join(tmp, f"callgrind.{label}")
    redis = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
                              "redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = wait_conn(port, redis)
        env = setup(c)
        for i in range(0, N, 1000):
            c.cmd("LPUSH", queue, *[message(j) for j in range(i, min(N, i + 1000))])
        reqs = []
        for i in range(N):
            reqs.append(pop_of(env))  # RPOP takes message i: LPUSH put them in that order
            reqs.append(ack_of(env, b"%012d" % i))
        c.pipe(reqs[:2 * WARM])
        subprocess.run(["callgrind_control", "-z", str(redis.pid)], stdout=subprocess.DEVNULL, check=True)
        replies = c.pipe(reqs[2 * WARM:])
        subprocess.run(["callgrind_control", "-d", str(redis.pid)], stdout=subprocess.DEVNULL, check=True)
        time.sleep(0.5)
        files = sorted(glob.glob(out + ".*"), key=os.path.getmtime)
        if os.environ.get("REDIS_INSTR_KEEP"):
            # For callgrind_annotate: where the instructions go.
            os.makedirs(os.environ["REDIS_INSTR_KEEP"], exist_ok=True)
            shutil.copy(files[-1], os.path.join(os.environ["REDIS_INSTR_KEEP"], f"callgrind.{label}"))
        total = 0
        with open(files[-1], errors="replace") as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
        errors = sum(1 for r in replies if isinstance(r, bytes) and r.startswith(b"-"))
        return total / (N - WARM), errors
    finally:
        redis.kill()
        redis.wait()


def main():
    for tool in ("redis-server", "valgrind", "callgrind_control"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing")
    with open(os.path.join(HERE, "..", "seed000_pop.lua"), "rb") as f:
        seed_pop = f.read()
    with open(os.path.join(HERE, "..", "seed000_ack.lua"), "rb") as f:
        seed_ack = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        pop, ack, dump, more = proxy_calls(tmp)

        def seed_setup(c):
            return (c.cmd("SCRIPT", "LOAD", seed_pop), c.cmd("SCRIPT", "LOAD", seed_ack))

        def ours_setup(c):
            c.cmd("FUNCTION", "RESTORE", dump)
            texts = script_texts()
            for text in texts[:1] + texts[-1:]:
                c.cmd("SCRIPT", "LOAD", text)
            return None

        def all_setup(c):
            # Every script in the heap, as the proxy has them.
            c.cmd("FUNCTION", "RESTORE", dump)
            for text in script_texts():
                c.cmd("SCRIPT", "LOAD", text)
            # The processing list of a loop with other jobs in progress:
            # the LREM's copy never its last.
            c.cmd("RPUSH", "doing:jobs", *[b"other%d" % i for i in range(10)])
            return None

        def back(i):
            """The id of the message popped OUT - 1 pairs before pair i."""
            j = int(i) - OUT + 1
            return b"%012d" % j if j >= 0 else None

        def ours_ack(e, i):
            # release.lua takes the id's lease token ('j' and a short id).
            i = back(i)
            if i is None:
                return ["PING"]
            return ack[:-1] + [b"j" + i if ack[0].upper() == b"EVALSHA" else i]

        seed, seed_err = instructions(
            "seed", tmp, seed_setup,
            lambda e: ["EVALSHA", e[0], "0", "jobs", "0", "60000"],
            lambda e, i: ["EVALSHA", e[1], "0", back(i), "jobs"] if back(i) else ["PING"])
        # A take script's pop: its end letter asks for a skiplist now and
        # then, as the proxy's; the library's pop1 has none.
        take = (lambda: with_turns(pop)) if pop[0].upper() == b"EVALSHA" else (lambda: lambda e: pop)
        ours, ours_err = instructions("ours", tmp, ours_setup, take(), ours_ack)
        if more:
            # lrem_ack.lua's payload, lease token and the record's text
            # between end letter and payload are the message's.
            plain, _ = instructions("plain", tmp, all_setup, take(), ours_ack)
            lrem = more["lrem"]
            dest_part = lrem[-1][:-len(b"12|%012d" % 2)]

            def lrem_of(e, i):
                i = back(i)
                if i is None:
                    return ["PING"]
                return lrem[:-4] + [message(int(i)), lrem[-3], b"j" + i, dest_part + b"12|" + i]
            moved, moved_err = instructions("moved", tmp, all_setup, with_turns(more["take_move"]), lrem_of)
            # Each pop acknowledges the lease its connection took with the
            # pop before; the ACK slot of the pair is a PING, whose cost is
            # taken off.
            owned_call, pops = more["owned"], iter(range(N))
            owner = owned_call[-3]
            turned = with_turns(owned_call)

            def owned_pop(e):
                i = next(pops)
                held = b"j%012d" % (i - OUT) if i >= OUT else b""
                return turned()[:-3] + [owner + b"%x" % (i % OUT), owned_call[-2], held]
            owned_pair, owned_err = instructions("owned", tmp, all_setup, owned_pop, lambda e, i: ["PING"], "np")
            ping, _ = instructions("ping", tmp, all_setup, lambda e: ["PING"], lambda e, i: ["PING"])
            owned = owned_pair - ping / 2
    print(f"pairs measured: {N - WARM} (pipelined, 100 per write), 128 B JSON messages, "
          f"{OUT} lease(s) outstanding")
    print(f"seed 000 scripts (EVALSHA): {seed:10,.0f} instructions per pair  ({seed_err} error replies)")
    print(f"ackproxy (pop {pop[0].decode()}, ACK {ack[0].decode()}): {ours:10,.0f} instructions per pair  ({ours_err} error replies)")
    print(f"ratio ackproxy / seed: {ours / seed:.2f}")
    print(f"pop call: {pop[1].decode()} with {len(pop) - 3} keys+args; ack call: {len(ack) - 3} keys+args")
    if more:
        print(f"with every script loaded and ten other jobs in the processing list: RPOP + ACK {plain:,.0f}")
        print(f"BRPOPLPUSH + LREM: {moved:10,.0f} instructions per pair  ({moved_err} error replies), "
              f"{moved / plain:.2f}x RPOP + ACK")
        print(f"next-pop pop:      {owned:10,.0f} instructions per pair  ({owned_err} error replies), "
              f"{owned / plain:.2f}x RPOP + ACK")


if __name__ == "__main__":
    main()
