"""A KV-cache event subscriber with pyzmq and msgpack, for tests/kv_events_pyzmq.rs.

Usage: kv_subscriber.py ENDPOINT -- connects a SUB socket (all topics) to
ENDPOINT and prints one JSON line per message:

  {"topic": str, "seq": n, "roundtrip": bool, "batch": decoded}

`roundtrip` tells whether msgpack.packb(unpackb(payload)) gives the payload back byte
for byte (so the publisher encodes as a canonical msgpack encoder does); bytes in the
decoded batch are given as hex strings. Stops after the message whose seq equals the
number read from stdin (or after 30 s).
"""

import json
import select
import sys
import time

import msgpack
import zmq


def jsonable(v):
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    return v


def main():
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(sys.argv[1])
    last = None
    seen = -1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if last is None and select.select([sys.stdin], [], [], 0)[0]:
            line = sys.stdin.readline()
            last = int(line) if line.strip() else -1
        if last is not None and seen >= last:
            return 0
        if not sub.poll(10):
            continue
        topic, seq_bytes, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        batch = msgpack.unpackb(payload, raw=False)
        sys.stdout.write(json.dumps({
            "topic": topic.decode(),
            "seq": seq,
            "roundtrip": msgpack.packb(batch, use_bin_type=True) == payload,
            "batch": jsonable(batch),
        }) + "\n")
        sys.stdout.flush()
        seen = max(seen, seq)
    return 1


if __name__ == "__main__":
    sys.exit(main())
