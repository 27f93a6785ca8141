// Against a real `afterword serve` (tests/e2e/test_host_clients.py starts one and sets
// AFTERWORD_BASE_URL and AFTERWORD_HOST_TOKEN_FILE); skipped without one.
import { test } from "node:test";
import assert from "node:assert/strict";

import { AfterwordError, HostClient } from "../src/index.js";

const base = process.env.AFTERWORD_BASE_URL;
const tokenFile = process.env.AFTERWORD_HOST_TOKEN_FILE;
const live = base && tokenFile ? {} : { skip: "no AFTERWORD_BASE_URL / AFTERWORD_HOST_TOKEN_FILE" };
const ORIGIN = [
  { role: "user" as const, content: "please index the repo" },
  { role: "assistant" as const, content: "started; I will post the result here" },
];

function rejectsWith(status: number, code: string) {
  return (err: unknown) => {
    assert.ok(err instanceof AfterwordError, String(err));
    assert.equal(err.status, status);
    assert.equal(err.code, code);
    return true;
  };
}

test("one run, claimed the way an MCP server would, settled over the host API", live, async () => {
  const host = await HostClient.fromTokenFile(base!, tokenFile!);
  const run = await host.beginRun({ runId: "ts-run-1", conversationId: "local:ts#2026-12-01", replyTo: "local:ts" });
  const again = await host.beginRun({ runId: "ts-run-1", conversationId: "local:ts#2026-12-01", replyTo: "local:ts" });
  assert.deepEqual(again.body.servers, run.body.servers); // idempotent: the same capability
  await assert.rejects(
    host.beginRun({ runId: "ts-run-1", conversationId: "local:other", replyTo: "local:ts" }),
    rejectsWith(409, "conflict"),
  );
  const env = run.stdioEnv("work-control", process.env);
  const claim = await fetch(env.MONO_AGENT_CONTINUATION_CLAIM_URL!, {
    method: "POST",
    headers: { authorization: `Bearer ${env.MONO_AGENT_CONTINUATION_CLAIM_TOKEN}`, "content-type": "application/json" },
    body: JSON.stringify({
      taskKey: "ts-task",
      taskHash: "a".repeat(64),
      deadline: new Date(Date.now() + 86_400_000).toISOString(),
    }),
  });
  assert.equal(claim.status, 200);
  const { continuationId } = (await claim.json()) as { continuationId: string };
  assert.deepEqual(await run.close(), [continuationId]);
  await assert.rejects(run.finalize([ORIGIN[0]!]), rejectsWith(400, "invalid_request"));
  const digest = await run.finalize(ORIGIN);
  assert.match(digest ?? "", /^[0-9a-f]{64}$/);
  await run.activate();
  const got = await host.getRun("ts-run-1");
  assert.equal(got.state, "activated");
  assert.equal(got.body.claims[0]?.originContext, "pinned");
  const page = await host.listContinuations({ limit: 10 });
  assert.ok(page.items.some((i) => i.continuationId === continuationId));
  assert.equal(await host.capturedText(continuationId), null); // not a delivered capture
  await assert.rejects(host.retry(continuationId), rejectsWith(409, "conflict"));
  assert.equal((await host.cancel(continuationId)).state, "cancelled");
  assert.equal((await host.health()).status, "healthy");
});

// The lease is the service's (continuations.limits.runLeaseMs, 60 s by default) and this test
// waits 2.5 leases: against a service with a long lease it would take minutes, so it runs only
// when the lease is at most AFTERWORD_LEASE_TEST_MAX_MS (default 10 s; the Python harness
// starts its service with 1.5 s). See README.md, "Tests".
const LEASE_TEST_MAX_MS = Number(process.env.AFTERWORD_LEASE_TEST_MAX_MS ?? 10_000);

test("the lease: a run whose host stops calling is abandoned", live, async (t) => {
  const host = await HostClient.fromTokenFile(base!, tokenFile!);
  const run = await host.beginRun({ runId: "ts-run-lease", conversationId: "local:ts", replyTo: "local:ts" });
  if (run.body.leaseMs > LEASE_TEST_MAX_MS) {
    await run.abandon();
    t.skip(
      `the service's lease is ${run.body.leaseMs} ms: start it with continuations.limits.runLeaseMs ` +
        `<= ${LEASE_TEST_MAX_MS} (e.g. 1500) to run this test in seconds`,
    );
    return;
  }
  const stop = run.keepAlive(Math.floor(run.body.leaseMs / 4));
  await new Promise((resolve) => setTimeout(resolve, run.body.leaseMs * 1.2));
  stop();
  assert.equal((await run.heartbeat()).state, "open"); // kept alive past its lease
  await new Promise((resolve) => setTimeout(resolve, run.body.leaseMs * 1.3));
  // Lapsed: settling is refused (the call applies a lapse the loop has not reached yet).
  await assert.rejects(run.activate(), rejectsWith(410, "closed"));
  const body = (await host.getRun("ts-run-lease")).body;
  assert.equal(body.state, "abandoned");
  assert.equal(body.abandonReason, "lease_lapsed");
});

test("a wrong capability is refused", live, async () => {
  const host = new HostClient({ baseUrl: base!, token: "awh1.not-the-token" });
  await assert.rejects(host.health(), rejectsWith(401, "unauthorized"));
});

test("a task handle adopted for a run, its host-followed outcomes reported", live, async () => {
  const host = await HostClient.fromTokenFile(base!, tokenFile!);
  // capture: the answer is kept, not posted (the sidecar's outbox belongs to the Node host test).
  const run = await host.beginRun({ runId: "ts-run-task", conversationId: "local:ts", mode: "capture" });
  // "work-control" is a stdio server: the host polls its task and reports what tasks/get said.
  const handle = { taskId: "ts-task-1", status: "working" as const, pollIntervalMs: 500 };
  const adopted = await run.adoptTask("work-control", handle);
  assert.equal(adopted.follow, "host");
  assert.match(adopted.continuationId, /^c_/);
  assert.deepEqual(await run.adoptTask("work-control", handle), adopted); // idempotent
  await assert.rejects(run.adoptTask("not-selected", handle), rejectsWith(400, "invalid_request"));
  const working = await host.reportTaskOutcome(adopted.continuationId, { status: "working", pollIntervalMs: 500 });
  assert.deepEqual(working, { state: "claimed", cancel: false });
  assert.deepEqual(await run.close(), [adopted.continuationId]);
  await assert.rejects(run.adoptTask("work-control", { taskId: "late", status: "working" }), rejectsWith(409, "closed"));
  await run.finalize(ORIGIN);
  await run.activate();
  const done = await host.reportTaskOutcome(adopted.continuationId, {
    status: "completed",
    result: { content: [{ type: "text", text: "indexed" }], structuredContent: { files: 3 }, isError: false },
  });
  assert.equal(done.cancel, false);
  assert.notEqual(done.state, "claimed"); // the result was accepted
  const later = await host.reportTaskOutcome(adopted.continuationId, { status: "failed", message: "too late" });
  assert.equal(later.cancel, false); // a late outcome changes nothing
});
