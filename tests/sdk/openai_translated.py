#!/usr/bin/env python3
"""Drives a Rolter route whose only target speaks another API with the official `openai`
Python SDK, unchanged.

Usage: python3 tests/sdk/openai_translated.py <base_url> chat
           the route's target speaks only Anthropic's Messages API: chat completions
           (whole and streamed, text, a tool call round trip, an image, stop sequences,
           usage, an engine's error, a cut stream) are translated both ways
           (`chat-failover`: the same through a route that fails over to such a target,
           where an engine's 429 may be the OpenAI pool's own);
       python3 tests/sdk/openai_translated.py <base_url> responses
           the route's target has chat completions only: `responses.create` (whole and
           streamed, with a function call round trip) is translated to chat and back.

Run by tests/translation.rs, which checks what the engine received. The mock engine
answers a request with tools by calling the first tool with
{"location": "Paris", "unit": "celsius"}. Exits 0 when every check passes, 1 on a mismatch
or error, and 3 when the `openai` package is not installed.
"""

import json
import sys
import traceback

try:
    import openai
except ImportError as e:  # pragma: no cover - reported by the Rust test
    print(f"MISSING: the `openai` Python package is not installed ({e})", file=sys.stderr)
    sys.exit(3)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
PARAMS = {
    "type": "object",
    "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["location"],
}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": PARAMS}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather.", "parameters": PARAMS}]
PARIS = {"location": "Paris", "unit": "celsius"}
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAAAAgAB4iG8MwAAAABJRU5ErkJggg=="
)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def chat_text(client):
    chat = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=64)
    text = chat.choices[0].message.content
    check(chat.object == "chat.completion" and chat.id.startswith("chatcmpl-"), f"chat {chat.id}")
    check(isinstance(text, str) and len(text) > 0, f"chat text {text!r}")
    check(chat.choices[0].finish_reason == "stop", f"finish_reason {chat.choices[0].finish_reason}")
    check(chat.usage.completion_tokens == 6 and chat.usage.prompt_tokens > 0, f"usage {chat.usage}")
    deltas, usage, finish = [], None, None
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    objects = set()
    for chunk in stream:
        objects.add(chunk.object)
        usage = chunk.usage or usage
        for c in chunk.choices:
            deltas.append(c.delta.content or "")
            finish = c.finish_reason or finish
    check(objects == {"chat.completion.chunk"}, f"chunk objects {objects}")
    check("".join(deltas) == text, f"streamed {''.join(deltas)!r} == {text!r}")
    check(finish == "stop", f"streamed finish {finish}")
    check(usage is not None and usage.completion_tokens == 6, f"streamed usage {usage}")
    # Without include_usage there is no usage chunk.
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    check(all(c.usage is None for c in chunks), "no usage chunk unless asked")


def chat_stop_and_image(client):
    chat = client.chat.completions.create(model="m", messages=MESSAGES, stop=[" mock"])
    check(chat.choices[0].message.content == " Hello from the", f"stopped {chat.choices[0].message.content!r}")
    check(chat.choices[0].finish_reason == "stop", "stopped finish_reason")
    image = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]}]
    chat = client.chat.completions.create(model="m", messages=image)
    check(len(chat.choices[0].message.content) > 0, "image answered")


def chat_tools(client, stream):
    how = "streamed" if stream else "whole"
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        calls, finish = {}, None
        for chunk in client.chat.completions.create(model="m", messages=ask, tools=CHAT_TOOLS, stream=True):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                    call["id"] = tc.id or call["id"]
                    if tc.function:
                        call["name"] = tc.function.name or call["name"]
                        call["arguments"] += tc.function.arguments or ""
        check(list(calls) == [0], f"one streamed call {calls}")
        call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["arguments"]
    else:
        chat = client.chat.completions.create(model="m", messages=ask, tools=CHAT_TOOLS, tool_choice="auto")
        finish = chat.choices[0].finish_reason
        calls = chat.choices[0].message.tool_calls
        check(calls is not None and len(calls) == 1, f"one call {calls}")
        call_id, name, arguments = calls[0].id, calls[0].function.name, calls[0].function.arguments
    check(finish == "tool_calls", f"{how} finish {finish}")
    check(name == "get_weather" and json.loads(arguments) == PARIS, f"{how} call {name} {arguments}")
    follow = ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "18 degrees, sunny"},
    ]
    chat = client.chat.completions.create(model="m", messages=follow, tools=CHAT_TOOLS)
    check(chat.choices[0].finish_reason == "stop", f"{how} after the tool {chat.choices[0].finish_reason}")


def chat_errors(client, translated_429=True):
    try:
        client.chat.completions.create(model="m", messages=MESSAGES, extra_headers={"x-mock-status": "429"})
        check(False, "an engine's 429 raises")
    except openai.RateLimitError as e:
        check(e.status_code == 429 and "message" in e.body, f"429 in OpenAI's shape {e.body}")
        if translated_429:
            check(e.body["type"] == "rate_limit_error", f"Anthropic's error type kept {e.body}")
    got = []
    try:
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_headers={"x-mock-reset-after": "2"}
        )
        for chunk in stream:
            got += [c.delta.content for c in chunk.choices if c.delta.content]
        check(False, "a cut chat stream raises")
    except openai.APIError as e:
        check(type(e) is openai.APIError, f"cut chat stream -> {type(e).__name__}")
        check(len(got) == 2, f"{len(got)} deltas before the cut")
        check("incomplete" in e.message, f"cut message {e.message!r}")


def responses(client):
    r = client.responses.create(model="m", instructions="Be brief.", input="Say something.")
    check(r.object == "response" and r.status == "completed", f"response {r.status}")
    check(len(r.output_text) > 0, f"output_text {r.output_text!r}")
    check(r.usage.output_tokens == 6 and r.usage.input_tokens > 0, f"usage {r.usage}")
    kinds, text, done = [], [], None
    for event in client.responses.create(model="m", input="Say something.", stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        if event.type == "response.completed":
            done = event.response
    check(kinds[0] == "response.created" and kinds[-1] == "response.completed", f"kinds {kinds}")
    check("".join(text) == r.output_text, f"streamed {''.join(text)!r}")
    check(done.output_text == r.output_text and done.usage.output_tokens == 6, f"completed {done.usage}")


def responses_tools(client, stream):
    how = "streamed" if stream else "whole"
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        final, kinds = None, []
        for event in client.responses.create(model="m", input=ask, tools=RESPONSES_TOOLS, stream=True):
            kinds.append(event.type)
            if event.type == "response.completed":
                final = event.response
        check("response.function_call_arguments.delta" in kinds, f"{how} kinds {kinds}")
        r = final
    else:
        r = client.responses.create(model="m", input=ask, tools=RESPONSES_TOOLS)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1, f"{how}: one function call in {r.output}")
    call = calls[0]
    check(call.name == "get_weather" and json.loads(call.arguments) == PARIS, f"{how} call {call}")
    follow = ask + [
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"},
    ]
    r = client.responses.create(model="m", input=follow, tools=RESPONSES_TOOLS)
    check(r.status == "completed" and len(r.output_text) > 0, f"{how} after the call {r.output_text!r}")
    try:
        client.responses.create(model="m", input="Hi", previous_response_id="resp_1")
        check(False, "previous_response_id is refused")
    except openai.BadRequestError as e:
        check("previous_response_id" in e.message, f"refusal {e.message!r}")


def main(base_url: str, mode: str) -> None:
    client = openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="k", max_retries=0, timeout=10.0)
    print(f"openai {openai.__version__} against {base_url} ({mode})")
    if mode in ("chat", "chat-failover"):
        chat_text(client)
        chat_stop_and_image(client)
        chat_tools(client, stream=False)
        chat_tools(client, stream=True)
        # Failing over, a 429 is the pool's own (not retried), passed through as it came.
        chat_errors(client, translated_429=mode == "chat")
    elif mode == "responses":
        responses(client)
        responses_tools(client, stream=False)
        responses_tools(client, stream=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        main(*sys.argv[1:])
    except Exception:  # noqa: BLE001 - any failure is a test failure
        traceback.print_exc()
        sys.exit(1)
    print("all checks passed")
