"""A real MCP client (the `mcp` package from PyPI) for tests/mcp.rs.

Usage: python mcp_client.py MEMPROF ROOT < calls.json

Starts `MEMPROF mcp --root ROOT` over stdio, lists its tools, makes each call of the JSON list
on stdin ([{"tool": NAME, "arguments": {...}}, ...]) and prints one JSON document: the tools
(name, description, input schema) and each call's error flag and text.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(memprof, root, calls):
    server = StdioServerParameters(command=memprof, args=["mcp", "--root", root])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            listed = await session.list_tools()
            results = []
            for call in calls:
                result = await session.call_tool(call["tool"], call["arguments"])
                results.append(
                    {
                        "is_error": bool(result.is_error),
                        "text": "".join(c.text for c in result.content if c.type == "text"),
                    }
                )
    return {
        "server": init.server_info.name,
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in listed.tools
        ],
        "results": results,
    }


if __name__ == "__main__":
    report = asyncio.run(main(sys.argv[1], sys.argv[2], json.load(sys.stdin)))
    json.dump(report, sys.stdout)
