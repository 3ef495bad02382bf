#!/usr/bin/env python3
"""Tools for a mneme agent, written as Python functions: an MCP server made
with the official MCP Python SDK (`pip install mcp==2.3.0`), spoken to over
stdio. agent.toml beside it declares what each function does to the world,
which decides what mneme does with a call a crash interrupted (see
docs/guide/python-and-typescript-tools.md):

- find_customer  reads only                      -> effect = "read_only"
- save_note      writes, keyed by the call's key -> effect = "idempotent"
- send_receipt   acts every time it is called    -> effect = "side_effect",
                 and cannot drop a repeat; but      check_tool = "receipt_sent"
                 receipt_sent can tell afterwards
                 whether a call took effect

The files it writes are in the directory mneme runs in: notes.json and
outbox.jsonl (one line a receipt, as an email provider's log would be).
"""

import json
import os
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

mcp = MCPServer("crm")

NOTES = Path("notes.json")
OUTBOX = Path("outbox.jsonl")
CUSTOMERS = {
    "ada": {"name": "Ada Lovelace", "email": "ada@example.com", "plan": "pro"},
    "alan": {"name": "Alan Turing", "email": "alan@example.com", "plan": "free"},
}


def idempotency_key(ctx: Context) -> str:
    """The call's idempotency key: mneme sends it in the request's `_meta`
    (the same on every attempt of one call, different for every call)."""
    meta = ctx.request_context.meta or {}
    return meta.get("mneme/idempotency_key", "")


def held(tool: str) -> None:
    """The crash test's hook: while a file hold-TOOL exists in the
    directory, TOOL waits after it took effect, as a slow API would, so the
    test can SIGKILL mneme in the middle of the call."""
    while Path(f"hold-{tool}").exists():
        time.sleep(0.05)


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(".part")
    with open(partial, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


@mcp.tool()
def find_customer(name: str) -> dict:
    """Look a customer up by first name (lower case)."""
    customer = CUSTOMERS.get(name.lower())
    if customer is None:
        # A ToolError's text reaches the model, as a tool error (other
        # exceptions reach it only as "Error executing tool ...").
        raise ToolError(f"no customer named {name!r}")
    return customer


@mcp.tool()
def save_note(customer: str, text: str, ctx: Context) -> dict:
    """Save a note about a customer."""
    key = idempotency_key(ctx)
    notes = json.loads(NOTES.read_text()) if NOTES.exists() else {}
    # Stored under the call's key: the same call run again (after a crash)
    # writes the same entry, so the write is idempotent.
    notes[key] = {"customer": customer, "text": text}
    write_atomically(NOTES, json.dumps(notes, indent=1))
    held("save_note")
    return {"saved": key, "notes": sum(n["customer"] == customer for n in notes.values())}


@mcp.tool()
def send_receipt(to: str, text: str, ctx: Context) -> dict:
    """Email a receipt to a customer."""
    # Like most email APIs, it sends every time it is asked: a repeat is a
    # second email. The key goes along as the message's id, which is what
    # lets receipt_sent find it later.
    key = idempotency_key(ctx)
    with open(OUTBOX, "a") as outbox:
        outbox.write(json.dumps({"message_id": key, "to": to, "text": text}) + "\n")
        outbox.flush()
        os.fsync(outbox.fileno())
    held("send_receipt")
    return {"sent": key, "to": to}


@mcp.tool()
def receipt_sent(to: str, text: str, ctx: Context) -> dict:
    """Whether send_receipt took effect for this call: mneme's check, asked
    with the interrupted call's arguments and key after a crash. Looks, never
    sends."""
    key = idempotency_key(ctx)
    lines = OUTBOX.read_text().splitlines() if OUTBOX.exists() else []
    for line in lines:
        sent = json.loads(line)
        if sent["message_id"] == key:
            return {"applied": True, "result": {"sent": key, "to": sent["to"]}}
    return {"applied": False}


if __name__ == "__main__":
    mcp.run()  # stdio
