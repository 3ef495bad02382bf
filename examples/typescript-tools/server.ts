#!/usr/bin/env node
// Tools for a mneme agent, written as TypeScript functions: an MCP server
// made with the official MCP TypeScript SDK (@modelcontextprotocol/sdk),
// spoken to over stdio. agent.toml beside it declares what each function
// does to the world, which decides what mneme does with a call a crash
// interrupted (see docs/guide/python-and-typescript-tools.md):
//
// - find_customer  reads only                      -> effect = "read_only"
// - save_note      writes, keyed by the call's key -> effect = "idempotent"
// - send_receipt   acts every time it is called    -> effect = "side_effect",
//                  and cannot drop a repeat; but      check_tool = "receipt_sent"
//                  receipt_sent can tell afterwards
//                  whether a call took effect
//
// The files it writes are in the directory mneme runs in: notes.json and
// outbox.jsonl (one line a receipt, as an email provider's log would be).
// Build with `npm install && npm run build`; run dist/server.js.

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import * as fs from "node:fs";
import { z } from "zod";

const server = new McpServer({ name: "crm", version: "1.0.0" });

const NOTES = "notes.json";
const OUTBOX = "outbox.jsonl";
const CUSTOMERS: Record<string, { name: string; email: string; plan: string }> = {
  ada: { name: "Ada Lovelace", email: "ada@example.com", plan: "pro" },
  alan: { name: "Alan Turing", email: "alan@example.com", plan: "free" },
};

/** The request's `_meta`, as the SDK hands it to a tool. */
type Extra = { _meta?: Record<string, unknown> };

/** The call's idempotency key: mneme sends it in the request's `_meta` (the
 * same on every attempt of one call, different for every call). */
function idempotencyKey(extra: Extra): string {
  const key = extra._meta?.["mneme/idempotency_key"];
  return typeof key === "string" ? key : "";
}

/** The crash test's hook: while a file hold-TOOL exists in the directory,
 * TOOL waits after it took effect, as a slow API would, so the test can
 * SIGKILL mneme in the middle of the call. */
async function held(tool: string): Promise<void> {
  while (fs.existsSync(`hold-${tool}`)) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A tool's answer: JSON, as text. */
function answer(value: unknown) {
  return { content: [{ type: "text" as const, text: JSON.stringify(value) }] };
}

function writeAtomically(path: string, text: string): void {
  const partial = `${path}.part`;
  const fd = fs.openSync(partial, "w");
  fs.writeSync(fd, text);
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  fs.renameSync(partial, path);
}

const receipt = { to: z.string(), text: z.string() };

server.registerTool(
  "find_customer",
  {
    description: "Look a customer up by first name (lower case).",
    inputSchema: { name: z.string() },
  },
  async ({ name }) => {
    const customer = CUSTOMERS[name.toLowerCase()];
    if (!customer) {
      return { ...answer(`no customer named ${JSON.stringify(name)}`), isError: true };
    }
    return answer(customer);
  },
);

server.registerTool(
  "save_note",
  {
    description: "Save a note about a customer.",
    inputSchema: { customer: z.string(), text: z.string() },
  },
  async ({ customer, text }, extra) => {
    const key = idempotencyKey(extra);
    const notes: Record<string, { customer: string; text: string }> = fs.existsSync(NOTES)
      ? JSON.parse(fs.readFileSync(NOTES, "utf8"))
      : {};
    // Stored under the call's key: the same call run again (after a crash)
    // writes the same entry, so the write is idempotent.
    notes[key] = { customer, text };
    writeAtomically(NOTES, JSON.stringify(notes, null, 1));
    await held("save_note");
    const count = Object.values(notes).filter((n) => n.customer === customer).length;
    return answer({ saved: key, notes: count });
  },
);

server.registerTool(
  "send_receipt",
  { description: "Email a receipt to a customer.", inputSchema: receipt },
  async ({ to, text }, extra) => {
    // Like most email APIs, it sends every time it is asked: a repeat is a
    // second email. The key goes along as the message's id, which is what
    // lets receipt_sent find it later.
    const key = idempotencyKey(extra);
    const fd = fs.openSync(OUTBOX, "a");
    fs.writeSync(fd, JSON.stringify({ message_id: key, to, text }) + "\n");
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    await held("send_receipt");
    return answer({ sent: key, to });
  },
);

server.registerTool(
  "receipt_sent",
  {
    description:
      "Whether send_receipt took effect for this call: mneme's check, asked with the " +
      "interrupted call's arguments and key after a crash. Looks, never sends.",
    inputSchema: receipt,
  },
  async (_args, extra) => {
    const key = idempotencyKey(extra);
    const lines = fs.existsSync(OUTBOX) ? fs.readFileSync(OUTBOX, "utf8").split("\n") : [];
    for (const line of lines.filter((l) => l.trim() !== "")) {
      const sent = JSON.parse(line);
      if (sent.message_id === key) {
        return answer({ applied: true, result: { sent: key, to: sent.to } });
      }
    }
    return answer({ applied: false });
  },
);

await server.connect(new StdioServerTransport());
