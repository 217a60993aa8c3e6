"""A KV-cache event publisher in vLLM's exact wire layout, for tests/kv_events_pyzmq.rs.

Independent of Rolter's code: pyzmq for the sockets, msgpack (use_bin_type=True) for the
payloads. It binds a PUB socket and a ROUTER replay socket on loopback and talks to the
test over stdin/stdout, one JSON object or one word per line:

  -> {"pub": ep, "replay": ep, "topic": t, "fixture_packb_matches": bool,
      "batches": [{"seq": n, "label": s, "payload": hex}, ...]}
  publishes probes (topic b"kv@probe", seq 0, empty payload) until it reads "go";
  then publishes, in order: a message on another topic (to be filtered out), two
  malformed messages (2 frames; a 4-byte seq), and the batches with seqs 0, 1, ...
  -> {"published": n}
  serves replay requests until it reads "quit" (or after 60 s).

Replay follows vLLM's ZmqEventPublisher: the request is [identity, b"", start_seq_be8];
the answer is [identity, b"", seq_be8, payload] per buffered seq >= start, then
[identity, b"", 0xff * 8, b""].
"""

import json
import select
import sys
import time

import msgpack
import zmq

TOPIC = b"kv@127.0.0.1:8000@mock-model"
END_SEQ = (2**64 - 1).to_bytes(8, "big")

# The example payload of the KV-event reference (133 bytes): ts=1718000000.5, two
# blocks stored, one removed, then a clear; data_parallel_rank 0.
FIXTURE = bytes.fromhex(
    "93cb41d999a6602000009398ab426c6f636b53746f72656492cf2ceabcfae6d332ea"
    "cf26470bbec927f5bfc0dc00200102030405060708090a0b0c0d0e0f101112131415"
    "161718191a1b1c1d1e1f2010c0a3475055c093ac426c6f636b52656d6f76656491cf"
    "26470bbec927f5bfa347505591b0416c6c426c6f636b73436c656172656400"
)

H0 = 3236607068019569386  # low 64 bits of sha256_cbor block 0 (seed "0")
H1 = 2758186210834249151  # block 1
BIG = 0xFEDCBA9876543210  # >= 2**63: uint64 (0xcf)
TOKENS = list(range(1, 33))


def packb(obj):
    return msgpack.packb(obj, use_bin_type=True)


def batches():
    """(label, payload) in publication order."""
    ts = 1718000000.5
    out = [("fixture", FIXTURE)]
    # v0.9: EventBatch without the rank; BlockStored through lora_id (6 fields);
    # BlockRemoved without medium.
    out.append(("v0.9", packb([ts, [
        ["BlockStored", [H0, H1], None, TOKENS, 16, None],
        ["BlockRemoved", [H1]],
        ["AllBlocksCleared"],
    ]])))
    # v0.10: adds medium (7 fields) and the rank.
    out.append(("v0.10", packb([ts, [
        ["BlockStored", [H0, H1], None, TOKENS, 16, None, "GPU"],
        ["BlockRemoved", [H1], "GPU"],
    ], 0])))
    # Current: 8 fields (lora_name), parent set, a hash >= 2**63.
    out.append(("current", packb([ts + 1, [
        ["BlockStored", [BIG], H1, TOKENS[:16], 16, None, "GPU", None],
    ], 0])))
    # Current with a LoRA adapter and the optional trailing fields (extra_keys,
    # group_idx), offloaded to CPU, from data-parallel rank 1.
    out.append(("current-lora-extra-rank1", packb([ts + 2, [
        ["BlockStored", [H0], None, TOKENS[:16], 16, 1, "CPU", "sql-lora",
         [["mm-hash-0"]], 0],
        ["BlockRemoved", [H0], "CPU", 0],
    ], 1])))
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: 32-byte bin hashes.
    d0 = bytes.fromhex("202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea")
    d1 = bytes.fromhex("4a0a393805c6d2f0ed831000d41bb65980336c4c04895d5e26470bbec927f5bf")
    out.append(("current-bin-hashes", packb([ts + 3, [
        ["BlockStored", [d0, d1], None, TOKENS, 16, None, "GPU", None],
        ["BlockRemoved", [d1], "GPU"],
    ], 0])))
    return out


def fixture_packb():
    """The fixture's batch, encoded here by msgpack (cross-checks the fixture bytes)."""
    return packb([1718000000.5, [
        ["BlockStored", [H0, H1], None, TOKENS, 16, None, "GPU", None],
        ["BlockRemoved", [H1], "GPU"],
        ["AllBlocksCleared"],
    ], 0])


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def stdin_line(timeout):
    r, _, _ = select.select([sys.stdin], [], [], timeout)
    if not r:
        return None
    line = sys.stdin.readline()
    return line.strip() if line else "quit"


def main():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 100000)
    pub.bind("tcp://127.0.0.1:*")
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")

    published = batches()
    say({
        "pub": pub.getsockopt(zmq.LAST_ENDPOINT).decode(),
        "replay": router.getsockopt(zmq.LAST_ENDPOINT).decode(),
        "topic": TOPIC.decode(),
        "fixture_packb_matches": fixture_packb() == FIXTURE,
        "batches": [
            {"seq": seq, "label": label, "payload": payload.hex()}
            for seq, (label, payload) in enumerate(published)
        ],
    })

    deadline = time.monotonic() + 30
    while stdin_line(0.01) != "go":
        pub.send_multipart([b"kv@probe", (0).to_bytes(8, "big"), b""])
        if time.monotonic() > deadline:
            return 2

    pub.send_multipart([b"other@10.0.0.9", (7).to_bytes(8, "big"), b"\x90"])
    pub.send_multipart([TOPIC, (0).to_bytes(8, "big")])
    pub.send_multipart([TOPIC, b"\x00\x00\x00\x00", b"\x90"])
    buffer = []
    for seq, (_, payload) in enumerate(published):
        pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
        buffer.append((seq, payload))
    say({"published": len(buffer)})

    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if stdin_line(0) == "quit":
            break
        if not dict(poller.poll(10)):
            continue
        frames = router.recv_multipart()
        if len(frames) != 3:
            continue
        client_id, _, start_seq_bytes = frames
        start_seq = int.from_bytes(start_seq_bytes, "big")
        for seq, payload in buffer:
            if seq >= start_seq:
                router.send_multipart([client_id, b"", seq.to_bytes(8, "big"), payload])
        router.send_multipart([client_id, b"", END_SEQ, b""])
    pub.close()
    router.close()
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
