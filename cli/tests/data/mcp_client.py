"""Drives an MCP server over stdio with the official MCP Python SDK's client.

Reads a JSON object on standard input:
  {"command": PATH, "args": [...], "env": {...}, "ops": [OP, ...]}
where each OP is one of
  ["list_tools"], ["call", NAME, ARGUMENTS], ["list_resources"], ["read", URI]
and writes one JSON array to standard output, one result per OP:
  list_tools      {"tools": [tool, ...]}           (as the server listed them)
  call            {"is_error": bool, "text": str, "structured": value}
  list_resources  {"resources": [resource, ...]}
  read            {"contents": [text, ...]}
An MCP error (a JSON-RPC error reply) is {"mcp_error": {"code": int, "message": str}}.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def run_op(client, op):
    kind = op[0]
    if kind == "list_tools":
        listed = await client.list_tools()
        return {"tools": [dump(t) for t in listed.tools]}
    if kind == "call":
        result = await client.call_tool(op[1], op[2])
        text = "".join(c.text for c in result.content if c.type == "text")
        return {
            "is_error": bool(result.is_error),
            "text": text,
            "structured": result.structured_content,
        }
    if kind == "list_resources":
        listed = await client.list_resources()
        return {"resources": [dump(r) for r in listed.resources]}
    if kind == "read":
        read = await client.read_resource(op[1])
        return {"contents": [getattr(c, "text", None) for c in read.contents]}
    raise ValueError(f"unknown op {kind!r}")


async def main():
    spec = json.load(sys.stdin)
    server = StdioServerParameters(
        command=spec["command"], args=spec["args"], env=spec.get("env")
    )
    results = []
    # No client-side cache: every read must reach the server.
    async with Client(server, cache=None) as client:
        for op in spec["ops"]:
            try:
                results.append(await run_op(client, op))
            except MCPError as e:
                results.append({"mcp_error": {"code": e.code, "message": e.message}})
    json.dump(results, sys.stdout)


asyncio.run(main())
