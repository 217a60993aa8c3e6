#!/usr/bin/env python3
"""Drives a Rolter gateway with the official `openai` Python SDK.

Usage: python3 tests/sdk/openai_client.py <base_url> [<ca_file>]
       (e.g. http://127.0.0.1:8080, or https://localhost:8443 ca.pem)

With a CA file (PEM) the SDK's HTTP client trusts exactly that CA, for a gateway serving
TLS with a certificate it signed.

Run by tests/openai_sdk.rs. Exits 0 when every check passes, 1 on a mismatch or error,
and 3 when the `openai` package is not installed.
"""

import sys
import traceback

try:
    import openai
except ImportError as e:  # pragma: no cover - reported by the Rust test
    print(f"MISSING: the `openai` Python package is not installed ({e})", file=sys.stderr)
    sys.exit(3)

MESSAGES = [{"role": "user", "content": "Say something."}]

# The file the transcription check uploads; tests/openai_sdk.rs looks for it in what the
# engine received.
AUDIO = b"RIFF" + bytes(range(256)) + b"\r\n--not-the-boundary\r\n" + bytes(range(255, -1, -1))


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def main(base_url: str, ca_file: str | None = None) -> None:
    extra = {}
    if ca_file is not None:
        extra["http_client"] = openai.DefaultHttpxClient(verify=ca_file)
    client = openai.OpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key="test-key",
        max_retries=0,
        timeout=10.0,
        **extra,
    )
    print(f"openai {openai.__version__} against {base_url}")

    # Non-streaming chat completion.
    chat = client.chat.completions.create(model="m", messages=MESSAGES)
    text = chat.choices[0].message.content
    check(chat.object == "chat.completion", f"chat object is {chat.object!r}")
    check(isinstance(text, str) and len(text) > 0, f"chat text {text!r}")
    check(chat.choices[0].finish_reason in ("stop", "length"), "chat finish_reason")
    check(chat.usage is not None and chat.usage.completion_tokens > 0, f"chat usage {chat.usage}")

    # Streaming chat completion: several deltas that add up to the same text.
    deltas = []
    usage = None
    finish = None
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    objects = set()
    for chunk in stream:
        objects.add(chunk.object)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                deltas.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    check(objects == {"chat.completion.chunk"}, f"stream chunk objects {objects}")
    check(len(deltas) >= 3, f"{len(deltas)} content deltas")
    check("".join(deltas) == text, f"streamed text {''.join(deltas)!r} == non-streaming {text!r}")
    check(finish in ("stop", "length"), f"stream finish_reason {finish!r}")
    check(usage is not None and usage.completion_tokens == chat.usage.completion_tokens,
          f"stream usage {usage}")

    # Completions.
    comp = client.completions.create(model="m", prompt="Once upon a time")
    check(comp.object == "text_completion", f"completion object {comp.object!r}")
    check(len(comp.choices[0].text) > 0, f"completion text {comp.choices[0].text!r}")

    # Models.
    ids = [m.id for m in client.models.list()]
    check("m" in ids, f"models.list() ids {ids}")
    model = client.models.retrieve("m")
    check(model.id == "m" and model.object == "model", f"models.retrieve('m') {model}")
    try:
        client.models.retrieve("no-such-model")
        check(False, "retrieving an unknown model raises")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"unknown model retrieve -> NotFoundError {e.status_code}")

    # Audio transcription: a multipart form with a binary file part.
    audio = AUDIO
    transcript = client.audio.transcriptions.create(
        model="m", file=("clip.wav", audio, "audio/wav")
    )
    check(isinstance(transcript.text, str) and "bytes of form data" in transcript.text,
          f"transcription text {transcript.text!r}")
    translation = client.audio.translations.create(
        model="m", file=("clip.wav", audio, "audio/wav")
    )
    check(translation.text.startswith("translated "), f"translation text {translation.text!r}")

    # An unknown model is a typed 404 from the SDK's point of view.
    try:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
        check(False, "unknown model raises")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"unknown model -> NotFoundError {e.status_code}")
        check(e.code == "model_not_found", f"unknown model code {e.code!r}")
        check("no-such-model" in e.message, f"unknown model message {e.message!r}")

    check_cut_streams(client)


def check_cut_streams(client) -> None:
    """Streams the engine cuts mid-way end with the API's own error event: the SDK raises
    `APIError` for chat, and yields the Responses API's `error` event."""
    cut = {"x-mock-reset-after": "2"}
    got = []
    try:
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_headers=cut
        )
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    got.append(choice.delta.content)
        check(False, "a cut chat stream raises")
    except openai.APIError as e:
        check(type(e) is openai.APIError, f"cut chat stream -> {type(e).__name__}")
        check(len(got) == 2, f"{len(got)} chat deltas before the cut")
        check("incomplete" in e.message, f"cut chat message {e.message!r}")
        check(e.code == "upstream_stream_interrupted", f"cut chat code {e.code!r}")

    events = []
    try:
        stream = client.responses.create(model="m", input="Hello", stream=True, extra_headers=cut)
        for event in stream:
            events.append(event)
    except Exception as e:  # noqa: BLE001 - the transport error after the event is expected
        print(f"after the error event: {type(e).__name__}")
    errors = [e for e in events if e.type == "error"]
    check(len(errors) == 1, f"responses stream error events {[e.type for e in events]}")
    err = errors[0]
    check(err.code == "upstream_stream_interrupted", f"responses error code {err.code!r}")
    check("incomplete" in err.message, f"responses error message {err.message!r}")
    before = [e.sequence_number for e in events if e.type != "error"]
    check(err.sequence_number == before[-1] + 1, f"error numbered {err.sequence_number} after {before}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        main(*sys.argv[1:])
    except Exception:  # noqa: BLE001 - any failure is a test failure
        traceback.print_exc()
        sys.exit(1)
    print("all checks passed")
