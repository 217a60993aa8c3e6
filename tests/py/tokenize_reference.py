"""Reference prompt ids for tests/tokenize_python.rs, from the Python reference implementations.

Independent of Rolter's code: jinja2 renders the chat template the way `transformers`'
`apply_chat_template` sets it up (trim_blocks, lstrip_blocks, loop controls, `tojson` as
`json.dumps(ensure_ascii=False)`, `raise_exception`, `strftime_now`), and the `tokenizers`
package encodes the whole rendered text at once (`add_special_tokens=False`, as vLLM encodes
a chat prompt).

Reads one JSON object on stdin:

  {"dir": fixture_dir, "cases": [{"messages": [...], "add_generation_prompt": bool,
                                  "kwargs": {...}}, ...]}

and writes one JSON object on stdout: {"results": [{"text": str, "ids": [int]}, ...]}.
Exits with 3 when jinja2 or tokenizers is missing.
"""

import json
import os
import sys
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"missing Python package: {e}", file=sys.stderr)
    sys.exit(3)


def environment(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def special_tokens(config):
    out = {}
    for key in [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ]:
        token = config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if token is not None:
            out[key] = token
    return out


def main():
    request = json.load(sys.stdin)
    directory = request["dir"]
    with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    template = environment(config["chat_template"])
    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    results = []
    for case in request["cases"]:
        variables = dict(special_tokens(config))
        variables.update(
            messages=case["messages"],
            tools=None,
            documents=None,
            add_generation_prompt=case["add_generation_prompt"],
        )
        variables.update(case.get("kwargs") or {})
        text = template.render(**variables)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        results.append({"text": text, "ids": ids})
    json.dump({"results": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
