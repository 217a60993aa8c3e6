#!/usr/bin/env python3
"""Drives a Rolter route whose only target speaks OpenAI's chat API (no /v1/messages) with
the official `anthropic` Python SDK, unchanged: every answer is translated back into
Anthropic's Messages API.

Usage: python3 tests/sdk/anthropic_translated.py <base_url>

Run by tests/translation.rs, which checks what the engine received. The mock engine
answers a request with tools by calling the first tool with
{"location": "Paris", "unit": "celsius"}, and stops at a stop sequence found in its word
list. Exits 0 when every check passes, 1 on a mismatch or error, and 3 when the
`anthropic` package is not installed.
"""

import base64
import sys
import traceback

try:
    import anthropic
except ImportError as e:  # pragma: no cover - reported by the Rust test
    print(f"MISSING: the `anthropic` Python package is not installed ({e})", file=sys.stderr)
    sys.exit(3)

MESSAGES = [{"role": "user", "content": "Say something."}]
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather at a place.",
        "input_schema": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["location"],
        },
    }
]
PARIS = {"location": "Paris", "unit": "celsius"}
# A 1x1 PNG.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
    )
).decode()


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def whole_and_streamed(client):
    msg = client.messages.create(
        model="m", max_tokens=64, system="Be brief.", messages=MESSAGES,
        metadata={"user_id": "u-1"},
    )
    check(msg.type == "message" and msg.role == "assistant", f"message {msg.type} {msg.role}")
    check(msg.id.startswith("msg_"), f"message id {msg.id}")
    check(msg.model == "m", f"model echoed {msg.model}")
    text = text_of(msg)
    check(len(text) > 0, f"message text {text!r}")
    check(msg.stop_reason == "end_turn", f"stop_reason {msg.stop_reason}")
    check(msg.usage.input_tokens > 0 and msg.usage.output_tokens == 6, f"usage {msg.usage}")

    kinds, deltas = [], []
    with client.messages.stream(model="m", max_tokens=64, messages=MESSAGES) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                deltas.append(event.delta.text)
        final = stream.get_final_message()
    check(kinds[0] == "message_start" and kinds[-1] == "message_stop", f"event kinds {kinds}")
    for k in ("content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
        check(k in kinds, f"{k} in the stream")
    check("".join(deltas) == text, f"streamed text {''.join(deltas)!r} == {text!r}")
    check(final.stop_reason == "end_turn", f"streamed stop_reason {final.stop_reason}")
    check(final.usage.output_tokens == 6, f"streamed usage {final.usage}")


def stop_sequences(client):
    msg = client.messages.create(
        model="m", max_tokens=64, messages=MESSAGES, stop_sequences=[" mock"]
    )
    check(text_of(msg) == " Hello from the", f"stopped text {text_of(msg)!r}")
    check(msg.stop_reason == "stop_sequence", f"stop_reason {msg.stop_reason}")
    check(msg.stop_sequence == " mock", f"stop_sequence {msg.stop_sequence!r}")
    with client.messages.stream(
        model="m", max_tokens=64, messages=MESSAGES, stop_sequences=[" mock"]
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(streamed == " Hello from the", f"streamed stopped text {streamed!r}")
    check(
        final.stop_reason == "stop_sequence" and final.stop_sequence == " mock",
        f"streamed stop {final.stop_reason} {final.stop_sequence!r}",
    )


def tool_round_trip(client, stream):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        with client.messages.stream(model="m", max_tokens=64, messages=ask, tools=TOOLS) as s:
            kinds = [e.type for e in s]
            msg = s.get_final_message()
        check("content_block_start" in kinds, f"streamed tool events {kinds}")
    else:
        msg = client.messages.create(
            model="m", max_tokens=64, messages=ask, tools=TOOLS, tool_choice={"type": "auto"}
        )
    how = "streamed" if stream else "whole"
    check(msg.stop_reason == "tool_use", f"{how} tool stop_reason {msg.stop_reason}")
    uses = [b for b in msg.content if b.type == "tool_use"]
    check(len(uses) == 1, f"{how}: one tool_use block in {msg.content}")
    use = uses[0]
    check(use.name == "get_weather" and use.input == PARIS, f"{how} tool call {use}")
    check(len(use.id) > 0, f"{how} tool id {use.id}")
    # The result goes back; the engine answers in text.
    follow = ask + [
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees, sunny"}],
        },
    ]
    answer = client.messages.create(model="m", max_tokens=64, messages=follow, tools=TOOLS)
    check(answer.stop_reason == "end_turn", f"{how} after the tool: {answer.stop_reason}")
    check(len(text_of(answer)) > 0, f"{how} answer after the tool {text_of(answer)!r}")


def image(client):
    msg = client.messages.create(
        model="m",
        max_tokens=64,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    {"type": "text", "text": "What is in this image?"},
                ],
            }
        ],
    )
    check(msg.stop_reason == "end_turn" and len(text_of(msg)) > 0, f"image answer {msg}")


def errors(client):
    counted = client.messages.count_tokens(model="m", messages=MESSAGES)
    check(counted.input_tokens > 0, f"count_tokens {counted}")
    # The engine's own error (a 429), in Anthropic's shape: the SDK's typed exception.
    try:
        client.messages.create(
            model="m", max_tokens=16, messages=MESSAGES, extra_headers={"x-mock-status": "429"}
        )
        check(False, "an engine's 429 raises")
    except anthropic.RateLimitError as e:
        check(e.body["type"] == "error", f"429 body {e.body}")
        check(e.body["error"]["type"] == "rate_limit_error", f"429 type {e.body}")
    # A stream cut mid-way: Anthropic's error event, raised by the SDK.
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
        check(e.body["error"]["type"] == "api_error", f"cut body {e.body}")
        check("incomplete" in e.body["error"]["message"], f"cut message {e.body}")


def main(base_url: str) -> None:
    client = anthropic.Anthropic(
        base_url=base_url.rstrip("/"), api_key="test-key", max_retries=0, timeout=10.0
    )
    print(f"anthropic {anthropic.__version__} against {base_url}")
    whole_and_streamed(client)
    stop_sequences(client)
    tool_round_trip(client, stream=False)
    tool_round_trip(client, stream=True)
    image(client)
    errors(client)


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
