"""Drives an OpenAI-compatible server with the official OpenAI Python client.

Reads a JSON object on standard input:
  {"base_url": URL, "api_key": KEY, "ops": [OP, ...]}
where each OP is [KIND, ARGUMENTS] or [KIND, ARGUMENTS, OPTIONS]: KIND is "chat" (one
completion) or "stream" (the same streamed), ARGUMENTS are those of
client.chat.completions.create, and OPTIONS may replace "base_url" or "api_key". Writes one JSON
array to standard output, one result per OP:
  chat    {"content": str, "finish_reason": str}
  stream  {"deltas": [str, ...], "content": str}
An error reply is {"error": {"status": int, "message": str}}; no reply within 60 s or
no connection, {"error": {"status": null, "message": str}}.
"""

import json
import sys

import openai


def run_op(spec, op):
    kind, arguments = op[0], op[1]
    options = {"base_url": spec["base_url"], "api_key": spec["api_key"]}
    options.update(op[2] if len(op) > 2 else {})
    client = openai.OpenAI(max_retries=0, timeout=60, **options)
    if kind == "chat":
        reply = client.chat.completions.create(**arguments)
        choice = reply.choices[0]
        return {"content": choice.message.content, "finish_reason": choice.finish_reason}
    if kind == "stream":
        deltas = []
        for chunk in client.chat.completions.create(stream=True, **arguments):
            if chunk.choices and chunk.choices[0].delta.content:
                deltas.append(chunk.choices[0].delta.content)
        return {"deltas": deltas, "content": "".join(deltas)}
    raise ValueError(f"unknown op {kind!r}")


def main():
    spec = json.load(sys.stdin)
    results = []
    for op in spec["ops"]:
        try:
            results.append(run_op(spec, op))
        except openai.APIStatusError as e:
            message = e.body.get("message") if isinstance(e.body, dict) else None
            results.append({"error": {"status": e.status_code, "message": message or str(e)}})
        except openai.APIConnectionError as e:
            results.append({"error": {"status": None, "message": f"{type(e).__name__}: {e}"}})
    json.dump(results, sys.stdout)


main()
