// A Node host whose tool servers may answer with MCP task handles (io.modelcontextprotocol/tasks):
// each handle becomes a continuation through afterword's host API, and its answer arrives later
// in the same conversation. One scripted turn, the model replaced by a list of tool calls:
//   1. bind the run over the host API; start every server of the MCP config over stdio with the
//      official MCP SDK 2.x, declaring the tasks extension only to the servers the run selected
//      (afterword's `tools.continuationServers`);
//   2. make the "model's" tool calls; a task handle is checked, adopted (`run.adoptTask`) and the
//      model reads "accepted, the answer will follow" (a malformed handle: a tool error, nothing
//      adopted);
//   3. close, finalize (pin the conversation), commit, activate;
//   4. follow each host-followed task (stdio) with `tasks/get` while its session lives and report
//      every answer (`host.reportTaskOutcome`); print the answer afterword delivers.
//
//   node tasks-host.mjs --token-file host.token --outbox outbox.jsonl --mcp-config mcp.json \
//     --call 'report-tasks/write_report/{"topic":"disk usage"}' [--call ...] [--base-url URL]
//
// The MCP config is the usual `{"mcpServers": {"name": {"command", "args", "env"}}}` (stdio).

import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { parseArgs } from "node:util";

import { HostClient } from "../../clients/typescript/dist/src/index.js";
import { McpSession, TaskBridge } from "./tasks.mjs";

const { values: opts } = parseArgs({
  options: {
    "base-url": { type: "string", default: "http://127.0.0.1:4319" },
    "token-file": { type: "string" },
    "mcp-config": { type: "string" },
    call: { type: "string", multiple: true, default: [] },
    outbox: { type: "string" },
    "reply-to": { type: "string", default: "local:node-tasks" },
    text: { type: "string", default: "Please write the report" },
    "timeout-ms": { type: "string", default: "60000" },
  },
});
if (!opts["token-file"] || !opts.outbox || !opts["mcp-config"] || opts.call.length === 0) {
  console.error("usage: node tasks-host.mjs --token-file PATH --outbox PATH --mcp-config PATH --call SERVER/TOOL/JSON ...");
  process.exit(2);
}

const step = (kind, line) => console.log(`[${kind}] ${line}`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function parseCall(spec) {
  const [server, tool, ...rest] = spec.split("/");
  if (!server || !tool) throw new Error(`--call wants SERVER/TOOL/JSON, got ${JSON.stringify(spec)}`);
  return { server, tool, args: rest.length ? JSON.parse(rest.join("/")) : {} };
}

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
      if (line.trim() && JSON.parse(line).conversationId === replyTo) return JSON.parse(line);
    }
    await sleep(50);
  }
  throw new Error(`no answer for ${replyTo} in ${path} within ${timeoutMs} ms`);
}

async function main() {
  const replyTo = opts["reply-to"];
  const timeoutMs = Number(opts["timeout-ms"]);
  const calls = opts.call.map(parseCall);
  const servers = JSON.parse(await readFile(opts["mcp-config"], "utf8")).mcpServers ?? {};
  const host = await HostClient.fromTokenFile(opts["base-url"], opts["token-file"]);

  const runId = `node-tasks-${randomUUID().slice(0, 8)}`;
  const run = await host.beginRun({ runId, conversationId: replyTo, replyTo });
  step("run", `begun ${runId}: selected servers ${run.servers.join(", ") || "none"}, replies bound to ${replyTo}`);
  const stopHeartbeat = run.keepAlive();

  const sessions = new Map();
  const secrets = [];
  try {
    for (const [name, spec] of Object.entries(servers)) {
      const selected = run.servers.includes(name);
      // The reserved claim values go only to selected servers (stdioEnv strips them otherwise).
      const env = run.stdioEnv(name, { ...spec.env, PYTHONUNBUFFERED: "1" });
      if (env.MONO_AGENT_CONTINUATION_CLAIM_TOKEN) secrets.push(env.MONO_AGENT_CONTINUATION_CLAIM_TOKEN);
      sessions.set(name, await McpSession.open({ name, command: spec.command, args: spec.args, env, declareTasks: selected }));
      step("mcp", `${name} started over stdio; tasks extension ${selected ? "declared" : "not declared (not selected)"}`);
    }
    const bridge = new TaskBridge(run, host, { log: step, secrets });

    const said = [];
    for (const { server, tool, args } of calls) {
      const session = sessions.get(server);
      if (!session) throw new Error(`no MCP server named ${server} in ${opts["mcp-config"]}`);
      step("tool", `model calls ${server}/${tool}(${JSON.stringify(args)})`);
      const result = await bridge.callTool(session, tool, args);
      const text = (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join(" ");
      step("tool", `${tool} returned${result.isError ? " an error" : ""}: ${text}`);
      said.push(text);
    }
    const assistant = bridge.adopted.length
      ? "I've started that in the background and will post the result here when it is done."
      : `Done: ${said.join(" ")}`;
    step("assistant", assistant);

    const history = [
      { role: "user", content: opts.text },
      { role: "assistant", content: assistant },
    ];
    await run.close();
    try {
      await run.finalize(history);
    } catch (error) {
      await run.abandon(); // never publish success without secured context
      throw error;
    }
    step("settle", "host committed its turn (history, run status)"); // a real host writes here
    await run.activate();
    stopHeartbeat();
    step("settle", `origin activated; ${bridge.adopted.length} task(s) adopted`);

    // Host-followed tasks live with these sessions: keep them open until each is terminal.
    await bridge.settled();
    const answering = bridge.adopted.filter(
      (a) => a.follow === "service" || ["completed", "failed"].includes(bridge.outcomes.get(a.continuationId)),
    );
    if (answering.length) {
      const answer = await waitForAnswer(opts.outbox, replyTo, timeoutMs);
      console.log(`[later answer -> ${answer.conversationId}] ${answer.text}`);
    }
  } finally {
    stopHeartbeat();
    for (const session of sessions.values()) await session.close();
  }
}

main().catch((error) => {
  console.error(`node-tasks-host: ${error.message ?? error}`);
  process.exit(1);
});
