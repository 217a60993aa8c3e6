#!/usr/bin/env python3
"""Drives a Rolter gateway with the official `anthropic` Python SDK.

Usage: python3 tests/sdk/anthropic_client.py <base_url>   (e.g. http://127.0.0.1:8080)

Run by tests/anthropic_sdk.rs. Exits 0 when every check passes, 1 on a mismatch or error,
and 3 when the `anthropic` package is not installed.
"""

import sys
import traceback

try:
    import anthropic
except ImportError as e:  # pragma: no cover - reported by the Rust test
    print(f"MISSING: the `anthropic` Python package is not installed ({e})", file=sys.stderr)
    sys.exit(3)

MESSAGES = [{"role": "user", "content": "Say something."}]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def main(base_url: str) -> None:
    client = anthropic.Anthropic(
        base_url=base_url.rstrip("/"),
        api_key="test-key",
        max_retries=0,
        timeout=10.0,
    )
    print(f"anthropic {anthropic.__version__} against {base_url}")

    # A message, whole.
    msg = client.messages.create(model="m", max_tokens=64, messages=MESSAGES)
    check(msg.type == "message" and msg.role == "assistant", f"message {msg.type} {msg.role}")
    text = "".join(b.text for b in msg.content if b.type == "text")
    check(len(text) > 0, f"message text {text!r}")
    check(msg.usage.output_tokens > 0, f"message usage {msg.usage}")

    # The same, streamed: the deltas add up to the same text.
    deltas = []
    kinds = []
    with client.messages.create(model="m", max_tokens=64, messages=MESSAGES, stream=True) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                deltas.append(event.delta.text)
    check(kinds[0] == "message_start" and kinds[-1] == "message_stop", f"event kinds {kinds}")
    check("".join(deltas) == text, f"streamed text {''.join(deltas)!r} == {text!r}")

    # Counting tokens: routed by model like messages.
    counted = client.messages.count_tokens(model="m", messages=MESSAGES)
    check(counted.input_tokens > 0, f"count_tokens {counted}")

    # The gateway's own error, in Anthropic's shape: the SDK's typed exception.
    try:
        client.messages.create(model="no-such-model", max_tokens=16, messages=MESSAGES)
        check(False, "unknown model raises")
    except anthropic.NotFoundError as e:
        check(e.status_code == 404, f"unknown model -> NotFoundError {e.status_code}")
        check(isinstance(e.body, dict) and e.body.get("type") == "error", f"error body {e.body}")
        check(e.body["error"]["type"] == "not_found_error", f"error type {e.body}")
        check("no-such-model" in e.message, f"error message {e.message!r}")

    # A stream cut mid-way: Anthropic's error event, which the SDK raises as an API error
    # (never a silent end, never a bare transport error).
    got = []
    try:
        with client.messages.create(
            model="m",
            max_tokens=64,
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-mock-reset-after": "2"},
        ) as stream:
            for event in stream:
                if event.type == "content_block_delta":
                    got.append(event.delta.text)
        check(False, "a cut stream raises")
    except anthropic.APIStatusError as e:
        check(len(got) == 2, f"{len(got)} deltas before the cut")
        check(isinstance(e.body, dict) and e.body["error"]["type"] == "api_error", f"cut body {e.body}")
        check("incomplete" in e.body["error"]["message"], f"cut message {e.body}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        main(sys.argv[1])
    except Exception:  # noqa: BLE001 - any failure is a test failure
        traceback.print_exc()
        sys.exit(1)
    print("all checks passed")
