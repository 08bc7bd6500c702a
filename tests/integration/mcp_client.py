"""Drives `skill-lock mcp` with the Python `mcp` package's stdio client.

    python mcp_client.py SCENARIO

Environment: SKILL_LOCK_BIN (the binary under test), SKILL_LOCK_TEST_ROOT (a
checkout to lock in). Each scenario asserts what SPEC §2.9 promises and
prints `ok SCENARIO` last; any failure raises (exit status 1). Every message
any server sent is recorded, and at the end no message may carry a token:
no `token` field, and no 32-hex string whose SHA-256 is the token hash of a
lock the scenario acquired. Run by tests/integration/mcp.rs.
"""

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = os.environ["SKILL_LOCK_BIN"]
ROOT = os.environ["SKILL_LOCK_TEST_ROOT"]
# Generous: the machine running the suite may be loaded.
PATIENCE = 120.0

RAW = []  # every message a server sent, as JSON text
TOKEN_HASHES = set()  # token_sha256 of every lock acquired here


@contextlib.asynccontextmanager
async def server():
    """One `skill-lock mcp`, its session initialized, its messages recorded."""
    params = StdioServerParameters(command=BIN, args=["mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        relay_send, relay_recv = anyio.create_memory_object_stream(100)

        async def relay():
            async with relay_send:
                async for message in read:
                    if not isinstance(message, Exception):
                        RAW.append(message.message.model_dump_json(by_alias=True))
                    await relay_send.send(message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            async with ClientSession(relay_recv, write) as session:
                await session.initialize()
                yield session
            tg.cancel_scope.cancel()


def lock_args(skill="triage", repo="apache/airflow", **more):
    return {"skill": skill, "repo": repo, "root": ROOT, **more}


async def call(session, tool, **args):
    """Calls `tool`; its structured answer (checked against the text copy)."""
    result = await session.call_tool(tool, args)
    answer = result.structuredContent
    assert isinstance(answer, dict), f"{tool}: no structured content: {result}"
    texts = [c.text for c in result.content if c.type == "text"]
    assert texts and json.loads(texts[0]) == answer, f"{tool}: text copy differs: {result}"
    assert bool(result.isError) == (answer["result"] == "error"), f"{tool}: isError: {result}"
    assert "token" not in answer, f"{tool} answered a token: {answer}"
    if answer["result"] == "acquired":
        with open(os.path.join(answer["lock"], "owner.json")) as f:
            TOKEN_HASHES.add(json.load(f)["token_sha256"])
    return answer


def cli(*args):
    """The shell form: `skill-lock ARGS --root ROOT`, its JSON object."""
    out = subprocess.run([BIN, *args, "--root", ROOT], capture_output=True, text=True, check=False)
    return json.loads(out.stdout)


def no_token_anywhere():
    assert RAW, "no message recorded"
    for text in RAW:
        message = json.loads(text)
        stack = [message]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                assert "token" not in v, f"a message carries a token field: {text}"
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)
        for hexa in re.findall(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])", text):
            assert hashlib.sha256(hexa.encode()).hexdigest() not in TOKEN_HASHES, (
                f"a message carries a token: {text}"
            )


async def tools():
    async with server() as s:
        listed = (await s.list_tools()).tools
        by_name = {t.name: t for t in listed}
        assert set(by_name) == {"status", "acquire", "renew", "check", "release"}, by_name
        for name, t in by_name.items():
            props = t.inputSchema["properties"]
            required = set(t.inputSchema["required"])
            assert {"skill", "repo", "root"} <= required, (name, required)
            assert "token" not in props and "force" not in props and "store" not in props, props
            assert t.outputSchema and t.outputSchema["type"] == "object", name
            assert "result" in t.outputSchema["properties"], name
            assert ("fence" in required) == (name in ("renew", "check", "release")), name
        assert {"since", "ttl", "note"} <= set(by_name["acquire"].inputSchema["properties"])
        assert "ttl" in by_name["renew"].inputSchema["properties"]
        # The write-lock block's rules, for an agent that reads only the list.
        assert "before EACH post" in by_name["renew"].description
        assert "READ AGAIN" in by_name["acquire"].description
        assert "others_since" in by_name["acquire"].description
        assert "post NOTHING" in by_name["acquire"].description
        assert "fence" in by_name["status"].description
        assert by_name["status"].annotations.readOnlyHint is True
        assert by_name["release"].annotations.readOnlyHint is False


async def cycle():
    async with server() as s:
        st = await call(s, "status", **lock_args())
        assert st["result"] == "status" and st["state"] == "free", st
        since = st["fence"] or 0
        a = await call(s, "acquire", **lock_args(since=since, ttl=900, note="mcp cycle"))
        assert a["result"] == "acquired" and a["others_since"] is False, a
        assert a["note"] == "mcp cycle" and a["ttl"] == 900, a
        # The owner is the server's own process, not this client.
        assert a["owner_pid"] not in (None, os.getpid()), a
        fence = a["fence"]
        # The shell form reaches the same lock, held by the server's pid.
        shell = cli("status", "triage", "--repo", "apache/airflow")
        assert shell["state"] == "held" and shell["holder"]["owner_pid"] == a["owner_pid"], shell
        assert shell["fence"] == fence, shell
        c = await call(s, "check", **lock_args(fence=fence))
        assert c["result"] == "held" and c["fence"] == fence, c
        r = await call(s, "renew", **lock_args(fence=fence, ttl=600))
        assert r["result"] == "renewed" and r["ttl"] == 600 and r["fence"] == fence, r
        # The shell cannot release it without the token.
        refused = cli("release", "triage", "--repo", "apache/airflow", "--token", "0" * 32)
        assert refused["result"] == "refused", refused
        rel = await call(s, "release", **lock_args(fence=fence))
        assert rel["result"] == "released" and rel["holder"]["fence"] == fence, rel
        # Released: the handle is gone.
        again = await call(s, "release", **lock_args(fence=fence))
        assert again["result"] == "error" and again["error"] == "usage", again
        assert "acquired" in again["message"], again
        st = await call(s, "status", **lock_args())
        assert st["state"] == "free" and st["fence"] == fence, st


async def contend():
    async with server() as one, server() as two:
        a = await call(one, "acquire", **lock_args(since=0, ttl=900))
        assert a["result"] == "acquired", a
        b = await call(two, "acquire", **lock_args(since=0, ttl=900))
        assert b["result"] == "already_running", b
        assert b["holder"]["owner_pid"] == a["owner_pid"] and b["hint"], b
        # The other server's fence is no handle here.
        for tool in ("renew", "check", "release"):
            e = await call(two, tool, **lock_args(fence=a["fence"]))
            assert e["result"] == "error" and e["error"] == "usage", e
        assert (await call(one, "check", **lock_args(fence=a["fence"])))["result"] == "held"
        assert (await call(one, "release", **lock_args(fence=a["fence"])))["result"] == "released"
        b = await call(two, "acquire", **lock_args(since=a["fence"], ttl=900))
        assert b["result"] == "acquired" and b["others_since"] is False, b
        assert (await call(two, "release", **lock_args(fence=b["fence"])))["result"] == "released"


async def same_session():
    """Two runs of one session: the first's fence never acts on the second's lock."""
    async with server() as s:
        first = await call(s, "acquire", **lock_args(ttl=1, note="run 1"))
        assert first["result"] == "acquired", first
        held = await call(s, "acquire", **lock_args(ttl=900, note="run 2"))
        assert held["result"] == "already_running", held
        deadline = time.monotonic() + PATIENCE
        while True:
            second = await call(s, "acquire", **lock_args(since=first["fence"], ttl=900, note="run 2"))
            if second["result"] == "acquired":
                break
            assert time.monotonic() < deadline, f"run 1's 1-second lease never ran out: {second}"
            await asyncio.sleep(0.5)
        assert second["took_over"]["reason"] == "expired", second
        assert second["others_since"] is False, second  # nobody between run 1 and run 2
        assert second["fence"] > first["fence"], second
        r = await call(s, "renew", **lock_args(fence=first["fence"]))
        assert r["result"] == "not_owner", r
        c = await call(s, "check", **lock_args(fence=first["fence"]))
        assert c["result"] == "not_owner", c
        rel = await call(s, "release", **lock_args(fence=first["fence"]))
        assert rel["result"] == "refused" and rel["holder"]["fence"] == second["fence"], rel
        c = await call(s, "check", **lock_args(fence=second["fence"]))
        assert c["result"] == "held", c
        assert (await call(s, "release", **lock_args(fence=second["fence"])))["result"] == "released"


async def killed():
    """A SIGKILLed server's lock is taken over as owner_dead, not after its lease."""
    async with server() as victim:
        a = await call(victim, "acquire", **lock_args(ttl=3600, note="killed"))
        assert a["result"] == "acquired", a
        os.kill(a["owner_pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        with contextlib.suppress(Exception):
            await call(victim, "status", **lock_args())
    async with server() as heir:
        deadline = time.monotonic() + PATIENCE
        while True:
            b = await call(heir, "acquire", **lock_args(ttl=900))
            if b["result"] == "acquired":
                break
            assert b["result"] == "already_running", b
            assert time.monotonic() < deadline, f"never taken over: {b}"
            await asyncio.sleep(0.2)
        assert b["took_over"]["reason"] == "owner_dead", b
        print(f"taken over as owner_dead {time.monotonic() - killed_at:.3f} s after the SIGKILL")
        assert b["took_over"]["holder"]["owner_pid"] == a["owner_pid"], b
        assert (await call(heir, "release", **lock_args(fence=b["fence"])))["result"] == "released"


async def bad_arguments():
    async with server() as s:
        cases = [
            ("status", {"skill": "bad skill!", "repo": "a/b", "root": ROOT}, "invalid_skill"),
            ("status", {"skill": "ok", "repo": "nope", "root": ROOT}, "invalid_repo"),
            ("acquire", lock_args(ttl=0), "invalid_ttl"),
            ("acquire", lock_args(ttl="soon"), "invalid_ttl"),
            ("acquire", lock_args(note="two\nlines"), "invalid_note"),
            ("acquire", lock_args(since="x"), "usage"),
            ("acquire", lock_args(token="0" * 32), "usage"),
            ("release", lock_args(fence=1, force=True), "usage"),
            ("status", {"skill": "ok", "repo": "a/b"}, "usage"),
            ("status", {"skill": "ok", "repo": "a/b", "root": "/nonexistent/skill-lock-root"}, "no_root"),
            ("renew", lock_args(), "usage"),
            ("renew", lock_args(fence=12345), "usage"),
            ("check", lock_args(fence="abc"), "usage"),
            ("store", lock_args(), "usage"),
        ]
        for tool, args, code in cases:
            e = await call(s, tool, **args)
            assert e["result"] == "error" and e["error"] == code, (tool, args, e)
            assert e["message"], e
        missing = await call(s, "status", **{"skill": "ok", "repo": "a/b"})
        assert "root" in missing["message"], missing
        # Nothing was taken by any of them.
        assert (await call(s, "status", **lock_args()))["state"] == "free"


SCENARIOS = {
    "tools": tools,
    "cycle": cycle,
    "contend": contend,
    "same_session": same_session,
    "killed": killed,
    "bad_arguments": bad_arguments,
}

if __name__ == "__main__":
    name = sys.argv[1]
    asyncio.run(SCENARIOS[name]())
    no_token_anywhere()
    print(f"ok {name} ({len(RAW)} messages, {len(TOKEN_HASHES)} tokens looked for)")
