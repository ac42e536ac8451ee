#!/usr/bin/env python3
"""The floor of a Lua decision on Redis: what any function library that reads and writes one
key per decision costs the server, measured beside tollgate's own decision and redis-cell.

Usage: redis_floor.py PORT [ROUNDS]. Loads two libraries into the redis-server on PORT
(127.0.0.1): `tollgate_floor` does one GET and one PSETEX per key and nothing else; `tollgate_floor_record`
also unpacks and packs a record of eight doubles and formats the TTL, as tollgate's record
needs. Each FCALL carries 64 keys (as a coalesced call does). Prints Redis's own µs per key
from INFO commandstats (the time of the FCALL, and of the GET and PSETEX inside it). When the
server runs under `valgrind --tool=callgrind`, each library's rounds are dumped on their own
(`callgrind_control -z`, then `-d`): a dump's total over ROUNDS * 64 is its instructions per key.
"""
import socket
import subprocess
import sys

LIBRARY = r"""#!lua name=tollgate_floor
redis.register_function('tollgate_floor', function(keys, args)
  local out = {}
  for i = 1, #keys do
    redis.call('GET', keys[i])
    redis.call('PSETEX', keys[i], 60000, args[i])
    out[i] = 1
  end
  return out
end)
redis.register_function('tollgate_floor_record', function(keys, args)
  local out = {}
  local unpack, pack, fmt = struct.unpack, struct.pack, string.format
  for i = 1, #keys do
    local v = redis.call('GET', keys[i])
    local a, b, c, d, e, f, g, h = 0, 0, 0, 0, 0, 0, 0, 0
    if v and #v == 64 then
      a, b, c, d, e, f, g, h = unpack('<dddddddd', v)
    end
    redis.call('PSETEX', keys[i], fmt('%d', 60000), pack('<dddddddd', a + 1, b, c, d, e, f, g, h))
    out[i] = 1
  end
  return out
end)
"""


def command(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def cli(port, *args, stdin=None):
    return subprocess.run(
        ["redis-cli", "-p", str(port), *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def callgrind(port, flag):
    """`callgrind_control FLAG` on the server at `port`; whether it runs under callgrind."""
    pid = next(
        (l.split(":", 1)[1].strip() for l in cli(port, "info", "server").splitlines() if l.startswith("process_id:")),
        "",
    )
    try:
        done = subprocess.run(["callgrind_control", flag, pid], capture_output=True, text=True)
    except FileNotFoundError:
        return False
    return "OK" in done.stdout


def main():
    port = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    cli(port, "-x", "function", "load", "replace", stdin=LIBRARY)
    conn = socket.create_connection(("127.0.0.1", port))
    per_call = 64
    for name in ["tollgate_floor", "tollgate_floor_record"]:
        keys = [f"floor:{{{i % 1000}}}" for i in range(per_call)]
        request = command("FCALL", name, per_call, *keys, *([b"x" * 64] * per_call))
        profiled = callgrind(port, "-z")
        cli(port, "config", "resetstat")
        for _ in range(rounds):
            conn.sendall(request)
            reply = b""
            while reply.count(b"\r\n") < per_call + 1:
                reply += conn.recv(65536)
                if reply.startswith(b"-"):
                    sys.exit(f"{name}: {reply.decode(errors='replace').strip()}")
        if profiled:
            callgrind(port, "-d")
            print(f"{name}: dumped; divide the total by {rounds * per_call} keys")
        stats = {}
        for line in cli(port, "info", "commandstats").splitlines():
            if line.startswith("cmdstat_"):
                cmd, fields = line[len("cmdstat_"):].split(":", 1)
                stats[cmd] = int(fields.split("usec=")[1].split(",")[0])
        decisions = rounds * per_call
        print(
            f"{name}: {stats.get('fcall', 0) / decisions:.2f} µs per key in FCALL "
            f"(GET {stats.get('get', 0) / decisions:.2f}, PSETEX {stats.get('psetex', 0) / decisions:.2f})"
        )


if __name__ == "__main__":
    main()
