// An agent host written in Node, with afterword running beside it as a sidecar.
//
// One scripted turn, the model replaced by a script (as in examples/reference_host.py):
//   1. bind the run over the host API: one claim capability per selected MCP server;
//   2. start examples/work_control_server.py over stdio with the official MCP SDK 2.x
//      (@modelcontextprotocol/client), its environment carrying the reserved claim values
//      from the host API;
//   3. the "model" calls start_job; the server claims a continuation and answers "accepted";
//   4. the tool calls have settled: close, finalize (pin the conversation), commit, activate;
//   5. the job finishes, afterword synthesizes one answer and delivers it to the outbox;
//      this host prints it.
//
//   node host.mjs --base-url http://127.0.0.1:4319 --token-file host.token \
//     --server ../work_control_server.py --outbox ../outbox.jsonl [--python python3]
//
// The host capability comes from `afterword continuations host-token --file host.token`.

import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { parseArgs } from "node:util";

// The split MCP TypeScript SDK 2.x: the client package (the 1.x monolith
// @modelcontextprotocol/sdk is no longer used; docs/mcp.md, "TypeScript").
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

import { HostClient } from "../../clients/typescript/dist/src/index.js";

const SERVER = "work-control";
const { values: opts } = parseArgs({
  options: {
    "base-url": { type: "string", default: "http://127.0.0.1:4319" },
    "token-file": { type: "string" },
    server: { type: "string", default: new URL("../work_control_server.py", import.meta.url).pathname },
    python: { type: "string", default: "python3" },
    outbox: { type: "string" },
    "reply-to": { type: "string", default: "local:node-chat" },
    text: { type: "string", default: "Please rebuild the search index" },
    "timeout-ms": { type: "string", default: "60000" },
  },
});
if (!opts["token-file"] || !opts.outbox) {
  console.error("usage: node host.mjs --token-file PATH --outbox PATH [--base-url URL] [--server PATH]");
  process.exit(2);
}

const step = (kind, line) => console.log(`[${kind}] ${line}`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitForAnswer(path, replyTo, timeoutMs) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    let text = "";
    try {
      text = await readFile(path, "utf8");
    } catch (error) {
      if (error.code !== "ENOENT") throw error;
    }
    for (const line of text.split("\n")) {
      if (!line.trim()) continue;
      const entry = JSON.parse(line);
      if (entry.conversationId === replyTo) return entry;
    }
    await sleep(50);
  }
  throw new Error(`no answer for ${replyTo} in ${path} within ${timeoutMs} ms`);
}

async function main() {
  const replyTo = opts["reply-to"];
  const timeoutMs = Number(opts["timeout-ms"]);
  const host = await HostClient.fromTokenFile(opts["base-url"], opts["token-file"]);

  const runId = `node-run-${randomUUID().slice(0, 8)}`;
  const run = await host.beginRun({ runId, conversationId: replyTo, replyTo });
  step("run", `begun ${runId} over the host API: capability for ${run.servers.join(", ")}, replies bound to ${replyTo}`);
  const stopHeartbeat = run.keepAlive(); // the lease lapses if this process dies mid-turn

  const transport = new StdioClientTransport({
    command: opts.python,
    args: [opts.server],
    env: run.stdioEnv(SERVER, { PYTHONUNBUFFERED: "1" }),
    stderr: "inherit",
  });
  // "auto": the 2026-07-28 revision (server/discover) when the server speaks it, else the
  // initialize handshake, so a Python server on either SDK line answers. On stdio the SDK
  // probes with a short-lived sibling process spawned from the same parameters (the same
  // trusted server, same environment); it makes no tool call, so it claims nothing.
  const mcp = new Client(
    { name: "afterword-node-host", version: "0.1.0" },
    { versionNegotiation: { mode: "auto" } },
  );
  await mcp.connect(transport);
  try {
    step(
      "mcp",
      `${SERVER} started over stdio by @modelcontextprotocol/client with the reserved environment ` +
        `(protocol ${mcp.getNegotiatedProtocolVersion()}, ${mcp.getProtocolEra()} era)`,
    );
    const job = opts.text.replace(/^Please /, "").replace(/[.!?]+$/, "");
    step("tool", `model calls start_job(${JSON.stringify({ job, seconds: 0.5 })})`);
    const result = await mcp.callTool({ name: "start_job", arguments: { job, seconds: 0.5 } });
    const toolText = result.content.filter((c) => c.type === "text").map((c) => c.text).join(" ");
    step("tool", `start_job returned: ${toolText}`);
    const assistant = result.isError
      ? `I could not start that in the background (${toolText}).`
      : "I've started that in the background and will post the result here when it is done.";
    step("assistant", assistant);

    const history = [
      { role: "user", content: opts.text },
      { role: "assistant", content: assistant },
    ];
    const active = await run.close();
    step("settle", `tool calls settled; capability closed, active claims: ${active.join(", ") || "none"}`);
    let digest;
    try {
      digest = await run.finalize(history);
    } catch (error) {
      await run.abandon(); // the turn fails: never publish success without secured context
      throw error;
    }
    if (digest) step("settle", `origin snapshot bound to the claims (blake3 ${digest.slice(0, 16)}...)`);
    step("settle", "host committed its turn (history, run status)"); // a real host writes here
    await run.activate();
    stopHeartbeat();
    step("settle", "origin activated: the result may now be synthesized and delivered");

    // Keep the MCP server running until its background job has reported and been delivered.
    const answer = await waitForAnswer(opts.outbox, replyTo, timeoutMs);
    console.log(`[later answer -> ${answer.conversationId}] ${answer.text}`);
  } finally {
    stopHeartbeat();
    await mcp.close();
  }
}

main().catch((error) => {
  console.error(`node-host: ${error.message ?? error}`);
  process.exit(1);
});
