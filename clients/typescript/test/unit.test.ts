// The client against a scripted local server: what it sends, and what it makes of answers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { AfterwordError, HostClient, RESERVED_ENV, type RunBody } from "../src/index.js";

interface Seen {
  method: string;
  url: string;
  auth: string | undefined;
  type: string | undefined;
  body: string;
}

type Reply = (seen: Seen) => [number, unknown];

async function fake(reply: Reply): Promise<{ url: string; seen: Seen[]; stop: () => Promise<void> }> {
  const seen: Seen[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let body = "";
    req.on("data", (chunk: Buffer) => (body += chunk.toString()));
    req.on("end", () => {
      const s = {
        method: req.method ?? "",
        url: req.url ?? "",
        auth: req.headers.authorization,
        type: req.headers["content-type"],
        body,
      };
      seen.push(s);
      const [status, out] = reply(s);
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(out));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const stop = () => new Promise<void>((resolve) => server.close(() => resolve()));
  return { url: `http://127.0.0.1:${port}`, seen, stop };
}

function runBody(state: RunBody["state"] = "open"): RunBody {
  const open = state === "open";
  return {
    runId: "run/1",
    conversationId: "local:c#2026-01-02",
    replyTo: "local:c",
    mode: "reply",
    state,
    abandonReason: null,
    servers: [
      {
        server: "work-control",
        env: open ? Object.fromEntries(RESERVED_ENV.map((k) => [k, `v-${k}`])) : {},
        headers: open ? { "x-mono-agent-continuation-claim-token": "tok" } : {},
      },
    ],
    leaseMs: 60000,
    leaseExpiresAt: "2030-01-01T00:00:00.000Z",
    snapshotDigest: state === "finalized" ? "abc" : null,
    claims: [],
  };
}

test("beginRun sends the binding with the host capability and returns the reserved values", async () => {
  const srv = await fake(() => [200, runBody()]);
  try {
    const host = new HostClient({ baseUrl: srv.url + "/", token: "awh1.secret" });
    const run = await host.beginRun({ runId: "run/1", conversationId: "local:c#2026-01-02", replyTo: "local:c" });
    const [req] = srv.seen;
    assert.equal(req?.method, "POST");
    assert.equal(req?.url, "/v1/host/runs");
    assert.equal(req?.auth, "Bearer awh1.secret");
    assert.equal(req?.type, "application/json");
    assert.deepEqual(JSON.parse(req?.body ?? ""), {
      runId: "run/1",
      conversationId: "local:c#2026-01-02",
      replyTo: "local:c",
      mode: "reply",
    });
    assert.deepEqual(run.servers, ["work-control"]);
    // Configured values with reserved names are dropped whatever their case; ours come last.
    const env = run.stdioEnv("work-control", {
      PATH: "/bin",
      mono_agent_continuation_claim_token: "evil",
      MONO_AGENT_CONTINUATION_CLAIM_URL: "http://evil.example/",
      UNSET: undefined,
    });
    assert.equal(env.PATH, "/bin");
    assert.equal(env.MONO_AGENT_CONTINUATION_CLAIM_URL, "v-MONO_AGENT_CONTINUATION_CLAIM_URL");
    assert.equal("mono_agent_continuation_claim_token" in env, false);
    assert.equal("UNSET" in env, false);
    assert.deepEqual(run.stdioEnv("other", { A: "1", MONO_AGENT_CONTINUATION_CLAIM_MODE: "x" }), { A: "1" });
    const headers = run.httpHeaders("work-control", { "X-Mono-Agent-Continuation-Claim-Token": "evil", a: "b" });
    assert.deepEqual(headers, { a: "b", "x-mono-agent-continuation-claim-token": "tok" });
    assert.equal(String(host).includes("secret"), false);
  } finally {
    await srv.stop();
  }
});

test("run verbs post to the run's escaped path and keep the latest body", async () => {
  const states: Record<string, RunBody["state"]> = { close: "closed", finalize: "finalized", activate: "activated" };
  const srv = await fake((s) => [200, runBody(states[s.url.split("/").pop() ?? ""] ?? "open")]);
  try {
    const host = new HostClient({ baseUrl: srv.url, token: "t" });
    const run = await host.beginRun({ runId: "run/1", conversationId: "c", replyTo: "r" });
    assert.deepEqual(await run.close(), []);
    assert.equal(run.state, "closed");
    assert.deepEqual(run.stdioEnv("work-control"), {}); // closed: no authority left
    const history = [
      { role: "user" as const, content: "hi" },
      { role: "assistant" as const, content: "started" },
    ];
    assert.equal(await run.finalize(history), "abc");
    await run.activate();
    assert.equal(run.state, "activated");
    const urls = srv.seen.map((s) => `${s.method} ${s.url}`);
    assert.deepEqual(urls.slice(1), [
      "POST /v1/host/runs/run%2F1/close",
      "POST /v1/host/runs/run%2F1/finalize",
      "POST /v1/host/runs/run%2F1/activate",
    ]);
    assert.deepEqual(JSON.parse(srv.seen[2]?.body ?? ""), { history });
  } finally {
    await srv.stop();
  }
});

test("an error envelope becomes an AfterwordError with its status and code", async () => {
  const srv = await fake(() => [409, { error: { code: "conflict", message: "already begun" } }]);
  try {
    const host = new HostClient({ baseUrl: srv.url, token: "t" });
    await assert.rejects(host.beginRun({ runId: "r", conversationId: "c" }), (err: unknown) => {
      assert.ok(err instanceof AfterwordError);
      assert.equal(err.status, 409);
      assert.equal(err.code, "conflict");
      assert.equal(err.message, "already begun");
      return true;
    });
  } finally {
    await srv.stop();
  }
});

test("an unreachable service is status 0, code unreachable", async () => {
  const srv = await fake(() => [200, {}]);
  await srv.stop(); // nothing listens on that port any more
  const host = new HostClient({ baseUrl: srv.url, token: "t", timeoutMs: 2000 });
  await assert.rejects(host.health(), (err: unknown) => {
    assert.ok(err instanceof AfterwordError);
    assert.equal(err.status, 0);
    assert.equal(err.code, "unreachable");
    return true;
  });
});

test("the token file is read and trimmed; list and verbs build their requests", async () => {
  const srv = await fake((s) => [200, s.url.includes("captured-text") ? { continuationId: "c", text: "kept" } : { items: [], nextCursor: null }]);
  try {
    const dir = await mkdtemp(join(tmpdir(), "afterword-ts-"));
    const path = join(dir, "host.token");
    await writeFile(path, "awh1.fromfile\n", { mode: 0o600 });
    const host = await HostClient.fromTokenFile(srv.url, path);
    await host.listContinuations({ limit: 5, cursor: "a.b" });
    assert.equal(await host.capturedText("c_1"), "kept");
    await host.resolve("c_1", { kind: "delivered", deliveryId: "ts-1" });
    await host.retry("c_1", { allowUnknown: true });
    await host.cancel("c_1");
    assert.deepEqual(
      srv.seen.map((s) => `${s.method} ${s.url} ${s.body}`),
      [
        "GET /v1/host/continuations?limit=5&cursor=a.b ",
        "GET /v1/host/continuations/c_1/captured-text ",
        'POST /v1/host/continuations/c_1/resolve {"kind":"delivered","deliveryId":"ts-1"}',
        'POST /v1/host/continuations/c_1/retry {"allowUnknown":true}',
        "POST /v1/host/continuations/c_1/cancel ",
      ],
    );
    assert.equal(srv.seen[0]?.auth, "Bearer awh1.fromfile");
  } finally {
    await srv.stop();
  }
});

test("adoptTask sends only the handle's fields; reportTaskOutcome posts the outcome", async () => {
  const srv = await fake((s) => {
    if (s.url.endsWith("/tasks")) return [200, { continuationId: "c_7", follow: "host" }];
    if (s.url.endsWith("/task-outcome")) return [200, { state: "cancelled", cancel: true }];
    return [200, runBody()];
  });
  try {
    const host = new HostClient({ baseUrl: srv.url, token: "t" });
    const run = await host.beginRun({ runId: "run/1", conversationId: "c", replyTo: "r" });
    // A handle straight from an MCP client keeps its other wire fields: they are not sent.
    const handle = {
      resultType: "task",
      taskId: "t-1",
      status: "working" as const,
      pollIntervalMs: 500,
      ttlMs: null,
      createdAt: "2030-01-01T00:00:00Z",
    };
    const adopted = await run.adoptTask("work-control", handle);
    assert.deepEqual(adopted, { continuationId: "c_7", follow: "host" });
    const report = await host.reportTaskOutcome("c_7", {
      status: "completed",
      result: { content: [{ type: "text", text: "done" }], isError: false },
      message: null,
    });
    assert.deepEqual(report, { state: "cancelled", cancel: true });
    assert.deepEqual(
      srv.seen.slice(1).map((s) => `${s.method} ${s.url} ${s.body}`),
      [
        'POST /v1/host/runs/run%2F1/tasks {"server":"work-control","taskId":"t-1","status":"working","pollIntervalMs":500}',
        'POST /v1/host/continuations/c_7/task-outcome {"status":"completed","result":{"content":[{"type":"text","text":"done"}],"isError":false}}',
      ],
    );
  } finally {
    await srv.stop();
  }
});
