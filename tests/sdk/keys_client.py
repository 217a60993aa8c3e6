#!/usr/bin/env python3
"""Checks a Rolter gateway's API-key answers with the official `openai` and `anthropic`
Python SDKs: each raises its own typed exception.

Usage: python3 tests/sdk/keys_client.py <base_url> <allowed_key> <model_n_only_key> <limited_key>

The gateway serves models "m" and "n"; the second key may use model "n" only; the third
has requests_per_minute = 1. Run by tests/api_keys.rs. Exits 0 when every check passes,
1 on a mismatch or error, and 3 when a package is not installed.
"""

import sys
import traceback

try:
    import anthropic
    import openai
except ImportError as e:  # pragma: no cover - reported by the Rust test
    print(f"MISSING: the `openai` or `anthropic` Python package is not installed ({e})", file=sys.stderr)
    sys.exit(3)

MESSAGES = [{"role": "user", "content": "Say something."}]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def oa(base_url, key):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=10.0)


def an(base_url, key):
    return anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=10.0)


def raises(kind, call, what):
    try:
        call()
    except kind as e:
        check(True, f"{what} -> {type(e).__name__} {e.status_code}")
        return e
    raise AssertionError(f"{what}: no {kind.__name__}")


def main(base_url, good, n_only, limited):
    base_url = base_url.rstrip("/")
    chat = lambda c, model="m": c.chat.completions.create(model=model, messages=MESSAGES)
    msg = lambda c, model="m": c.messages.create(model=model, max_tokens=16, messages=MESSAGES)

    # OpenAI's SDK sends Authorization: Bearer; Anthropic's sends x-api-key.
    check(chat(oa(base_url, good)).choices[0].message.content, "openai: allowed key served")
    check(msg(an(base_url, good)).type == "message", "anthropic: allowed key served")

    e = raises(openai.AuthenticationError, lambda: chat(oa(base_url, "wrong")), "openai: wrong key")
    check(e.code == "invalid_api_key", f"openai: code {e.code}")
    raises(anthropic.AuthenticationError, lambda: msg(an(base_url, "wrong")), "anthropic: wrong key")

    e = raises(openai.PermissionDeniedError, lambda: chat(oa(base_url, n_only)), "openai: model not allowed")
    check(e.code == "model_not_allowed", f"openai: code {e.code}")
    raises(anthropic.PermissionDeniedError, lambda: msg(an(base_url, n_only)), "anthropic: model not allowed")
    check(chat(oa(base_url, n_only), "n").choices[0].message.content, "openai: its model served")

    # requests_per_minute = 1: a second request in the same minute is refused (at most
    # one more is admitted should the minute turn between them).
    client = oa(base_url, limited)
    for _ in range(3):
        try:
            chat(client)
        except openai.RateLimitError as e:
            after = e.response.headers.get("retry-after")
            check(after is not None and 1 <= int(after) <= 60, f"openai: RateLimitError, Retry-After {after}")
            break
    else:
        raise AssertionError("no RateLimitError over requests_per_minute = 1")
    e = raises(anthropic.RateLimitError, lambda: msg(an(base_url, limited)), "anthropic: over the limit")
    check(e.response.headers.get("retry-after") is not None, "anthropic: Retry-After")
    print("all checks passed")


if __name__ == "__main__":
    try:
        main(*sys.argv[1:5])
    except Exception:  # noqa: BLE001 - every failure is reported the same way
        traceback.print_exc()
        sys.exit(1)
