"""One run of a skill that follows the MCP form of the write-lock block
(docs/write-lock.md "MCP form"): its own session, so its own
`skill-lock mcp` server, driven by the Python `mcp` package's stdio client.

Started by tests/integration/write_block.rs with the environment of the
shell form's runs: SL (the binary), SKILL, REPO, NOTE, TTL, FORGE, RUN,
THINK, POST_GAP, REREAD (0 drops the read-again step), GATE (optional: a
file to wait for after the first read, `GATE.read` made first). The
checkout is the current directory. SERVER_PID_FILE (optional): where to
write the server's pid once it holds the lock. Exit status as the shell form's: 0 done,
3 already running, 4 lease lost, 2 anything else; prints `acquired FENCE`
(and `took_over`) as it goes.
"""

import asyncio
import os
import sys
import urllib.request

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ENV = os.environ
FORGE = ENV["FORGE"]


def todo():
    with urllib.request.urlopen(f"{FORGE}/todo", timeout=60) as r:
        return r.read().decode().split()


def post(issue):
    req = urllib.request.Request(f"{FORGE}/comment/{issue}?run={ENV['RUN']}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


async def gate():
    if not ENV.get("GATE"):
        return
    open(ENV["GATE"] + ".read", "w").close()
    while not os.path.exists(ENV["GATE"]):
        await asyncio.sleep(0.02)


async def skill(call):
    # 1. Before reading: note state and fence.
    st = await call("status")
    if st["result"] != "status":
        return 2
    state, fence = st["state"], st["fence"] or 0
    issues = todo()
    await gate()
    await asyncio.sleep(float(ENV["THINK"]))
    # 2. Acquire with since = that fence.
    a = await call("acquire", since=fence, ttl=int(ENV["TTL"]), note=ENV["NOTE"])
    if a["result"] == "already_running":
        return 3
    if a["result"] != "acquired":
        return 2
    if a["took_over"] is not None:
        print(f"took_over {a['took_over']['reason']}", flush=True)
    print(f"acquired {a['fence']}", flush=True)
    if ENV.get("SERVER_PID_FILE"):
        # The test kills or freezes the server with the session (the
        # client runs it in a session of its own).
        with open(ENV["SERVER_PID_FILE"] + ".tmp", "w") as f:
            f.write(str(a["owner_pid"]))
        os.replace(ENV["SERVER_PID_FILE"] + ".tmp", ENV["SERVER_PID_FILE"])
    mine = a["fence"]
    # Read again unless status said free and nobody acquired since.
    if ENV["REREAD"] == "1" and not (state == "free" and a["others_since"] is False):
        issues = todo()
    for issue in issues:
        # 3. Renew immediately before each post.
        r = await call("renew", fence=mine)
        if r["result"] != "renewed":
            await call("release", fence=mine)
            return 4 if r["result"] in ("not_owner", "not_held") else 2
        mine = r["fence"]  # new when the lease was revived
        post(issue)
        await asyncio.sleep(float(ENV["POST_GAP"]))
    # 4. Release after the recap.
    await call("release", fence=mine)
    return 0


async def main():
    lock = {"skill": ENV["SKILL"], "repo": ENV["REPO"], "root": os.getcwd()}
    params = StdioServerParameters(command=ENV["SL"], args=["mcp"], env=dict(ENV))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()

        async def call(tool, **args):
            result = await session.call_tool(tool, {**lock, **args})
            return result.structuredContent or {"result": "error"}

        return await skill(call)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
