// MCP Tasks (io.modelcontextprotocol/tasks, SEP-2663) on the Node host side: a tool call
// answered with a task handle becomes a continuation through afterword's host API.
//
// What the official TypeScript SDK 2.4 (@modelcontextprotocol/client) offers, and what it
// does not:
// - declaring the extension: yes. `new Client(info, { capabilities: { extensions: { [TASKS]:
//   {} } } })`; on the 2026-07-28 revision the SDK sends it in every request's per-request
//   client capabilities. We pass it only for servers the run selected (`run.servers`).
// - seeing a task handle: no. `callTool` (and `request` with any result schema) decodes the
//   raw `resultType` first and rejects `"task"` with `SdkError(UNSUPPORTED_RESULT_TYPE)`,
//   whose data keeps only `{resultType, method}`: the handle itself is dropped. (The separate
//   @modelcontextprotocol/ext-tasks package needs the host to supply raw dispatch on this
//   revision, so it does not close the gap either.) The minimal honest bridge: observe the raw
//   response on the SDK's public `Transport.onmessage` seam, keep a `resultType: "task"`
//   result by its JSON-RPC id, and pair it with the SDK's rejection of the same call. Nothing
//   is re-framed or re-sent by hand.
// - `tasks/get`, `tasks/cancel`: yes, through the generic `client.request(req, schema)`; the
//   SDK lets these two extension methods through its era gate when a result schema is given.
//   Every field we use is then checked here (a server may be hostile).

import { Client, fromJsonSchema, ProtocolError, SdkError, SdkErrorCode } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

export const TASKS = "io.modelcontextprotocol/tasks";
const STATUSES = ["working", "input_required", "completed", "failed", "cancelled"];
const TERMINAL_TASK = new Set(["completed", "failed", "cancelled", "lost", "protocol_error", "too_large"]);
const TERMINAL_RECORD = new Set(["delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"]);
const MAX_TASK_ID = 256; // afterword's own bound (protocol/tasks.py)
const MAX_MESSAGE = 1024; // bytes of UTF-8
const PROTOCOL_ERROR_LIMIT = 5; // consecutive malformed answers before giving up
// The longest wait between two polls, so between two reports: a third of afterword's default
// host lease (taskHostLeaseMs, 60 s), so a server that asks for rare polls cannot let it lapse.
const RENEW_EVERY_MS = 20_000;
const INVALID_PARAMS = -32602; // a tasks/* error with it: the server does not know the task
const ANY_OBJECT = fromJsonSchema({ type: "object" });
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;

/** A task handle or `tasks/get` answer that breaks the protocol. Names the field, never its value. */
export class MalformedTask extends Error {}

function taskId(raw, where) {
  const id = raw.taskId;
  if (typeof id !== "string" || id.length < 1 || id.length > MAX_TASK_ID) {
    throw new MalformedTask(`${where}: taskId must be a string of 1-${MAX_TASK_ID} characters`);
  }
  if (CONTROL.test(id)) throw new MalformedTask(`${where}: taskId holds a control character`);
  return id;
}

function status(raw, where) {
  if (!STATUSES.includes(raw.status)) throw new MalformedTask(`${where}: status must be one of ${STATUSES.join(", ")}`);
  return raw.status;
}

function millis(raw, key, where) {
  const value = raw[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new MalformedTask(`${where}: ${key} must be a non-negative number of milliseconds`);
  }
  return Math.min(Math.floor(value), 2 ** 53);
}

function bounded(text) {
  const bytes = Buffer.from(text, "utf8");
  return bytes.length <= MAX_MESSAGE ? text : new TextDecoder().decode(bytes.subarray(0, MAX_MESSAGE)).replace(/\uFFFD+$/, "");
}

/** The handle a `tools/call` answered with, checked (throws MalformedTask). */
export function readHandle(raw) {
  const where = "task handle";
  return {
    taskId: taskId(raw, where),
    status: status(raw, where),
    pollIntervalMs: millis(raw, "pollIntervalMs", where),
    ttlMs: millis(raw, "ttlMs", where),
  };
}

/** A `tasks/get` answer as the outcome afterword takes (throws MalformedTask). */
export function readOutcome(raw, expectedId) {
  const where = "tasks/get answer";
  if (taskId(raw, where) !== expectedId) throw new MalformedTask(`${where}: taskId is not the task asked for`);
  const state = status(raw, where);
  const pollIntervalMs = millis(raw, "pollIntervalMs", where);
  let message = typeof raw.statusMessage === "string" ? bounded(raw.statusMessage) : null;
  if (state === "completed") {
    const result = raw.result;
    if (typeof result !== "object" || result === null || Array.isArray(result) || !Array.isArray(result.content ?? [])) {
      throw new MalformedTask(`${where}: a completed task needs a CallToolResult object in result`);
    }
    return { status: state, result, message, pollIntervalMs };
  }
  if (state === "failed") {
    if (typeof raw.error?.message === "string") message = bounded(raw.error.message);
    return { status: state, message: message || "the task failed", pollIntervalMs };
  }
  return { status: state, message, pollIntervalMs };
}

/** What the model reads when a tool call became a continuation (names no task id). */
export function acceptedText(tool, continuationId) {
  return (
    `Accepted: ${tool} is running as a background task (continuation ${continuationId}). ` +
    "Its answer will follow in this conversation when it finishes; there is nothing to wait for or poll now."
  );
}

const toolError = (text) => ({ content: [{ type: "text", text }], isError: true });
const toolText = (text) => ({ content: [{ type: "text", text }], isError: false });

/** One MCP server over stdio; the tasks extension is declared only when `declareTasks`. */
export class McpSession {
  static async open({ name, command, args = [], env, declareTasks }) {
    const transport = new StdioClientTransport({ command, args, env, stderr: "inherit" });
    const options = { versionNegotiation: { mode: "auto" } };
    if (declareTasks) options.capabilities = { extensions: { [TASKS]: {} } };
    const client = new Client({ name: "afterword-node-host", version: "0.1.0" }, options);
    await client.connect(transport);
    return new McpSession(name, client, transport, declareTasks);
  }

  #handles = new Map(); // JSON-RPC id -> raw `resultType: "task"` result
  #queue = Promise.resolve(); // one tools/call at a time, so a rejection pairs with its handle

  constructor(name, client, transport, declaresTasks) {
    this.name = name;
    this.client = client;
    this.declaresTasks = declaresTasks;
    this.closed = false;
    // After the server exits, the SDK rejects new requests with a plain Error: remember it here.
    client.onclose = () => {
      this.closed = true;
    };
    const deliver = transport.onmessage; // installed by Client.connect
    transport.onmessage = (message, extra) => {
      if (declaresTasks && message?.result?.resultType === "task") this.#handles.set(message.id, message.result);
      deliver(message, extra);
    };
  }

  /** `{ result }` for an ordinary answer, `{ task }` (the raw handle) for a task handle. */
  callTool(name, args) {
    const call = this.#queue.then(() => this.#call(name, args));
    this.#queue = call.catch(() => {});
    return call;
  }

  async #call(name, args) {
    this.#handles.clear();
    try {
      return { result: await this.client.callTool({ name, arguments: args }) };
    } catch (error) {
      const isTask =
        error instanceof SdkError && error.code === SdkErrorCode.UnsupportedResultType && error.data?.resultType === "task";
      if (!isTask || this.#handles.size !== 1) throw error;
      const [raw] = this.#handles.values();
      this.#handles.clear();
      return { task: raw };
    }
  }

  getTask(taskId, timeoutMs) {
    return this.client.request({ method: "tasks/get", params: { taskId } }, ANY_OBJECT, { timeout: timeoutMs });
  }

  cancelTask(taskId, timeoutMs) {
    return this.client.request({ method: "tasks/cancel", params: { taskId } }, ANY_OBJECT, { timeout: timeoutMs });
  }

  close() {
    return this.client.close();
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The poll cadence of afterword's own follower: the hint clamped to [250 ms, 60 s] (a hostile
 * 0 cannot spin the host), doubled per failed poll, capped at 60 s. */
export function pollDelayMs(hint, failures) {
  const base = Math.min(Math.max(hint ?? 1000, 250), 60_000);
  return Math.min(base * 2 ** Math.min(failures, 8), 60_000);
}

/**
 * Adopts task handles for one run and follows the host-followed ones while their sessions live.
 * `run` is the TypeScript client's run (`adoptTask`), `host` its HostClient (`reportTaskOutcome`).
 */
export class TaskBridge {
  #following = new Set();
  #done = [];

  constructor(run, host, { log = () => {}, timeoutMs = 10_000, renewEveryMs = RENEW_EVERY_MS, secrets = [] } = {}) {
    this.run = run;
    this.host = host;
    this.log = log;
    this.timeoutMs = timeoutMs;
    this.renewEveryMs = renewEveryMs;
    this.secrets = secrets.filter(Boolean);
    this.adopted = [];
    this.outcomes = new Map(); // continuation id -> the last status reported for it
  }

  /** The tool result the model reads for `session.callTool(tool, args)`. */
  async callTool(session, tool, args) {
    const answer = await session.callTool(tool, args);
    if (answer.result) return answer.result;
    if (!this.run.servers.includes(session.name)) {
      // Cannot happen with McpSession (it declares only for selected servers): refuse anyway.
      return toolError("Not accepted: a task handle from a server this run did not select.");
    }
    let handle;
    try {
      handle = readHandle(answer.task);
    } catch (error) {
      if (!(error instanceof MalformedTask)) throw error;
      return toolError(
        `Not accepted: the tool server answered with a malformed task handle (${error.message}). ` +
          "Nothing was started on afterword's side and no answer will follow.",
      );
    }
    let adopted;
    try {
      adopted = await this.run.adoptTask(session.name, handle);
    } catch (error) {
      // Nobody will follow the task: ask the server to drop it rather than leave it running.
      await this.#cancel(session, handle.taskId);
      return toolError(
        `Not accepted: afterword could not take this background task (${error.code ?? error.name}); ` +
          "the server was asked to cancel it and no answer will follow.",
      );
    }
    this.adopted.push({ server: session.name, ...adopted });
    this.log("task", `${tool} answered with a task handle: adopted as ${adopted.continuationId} (follow: ${adopted.follow})`);
    if (adopted.follow === "host" && !this.#following.has(adopted.continuationId)) {
      this.#following.add(adopted.continuationId);
      this.#done.push(this.#follow(session, adopted.continuationId, handle));
    }
    return toolText(acceptedText(tool, adopted.continuationId));
  }

  /** Resolves when every host-followed task is terminal (or can no longer be followed). */
  async settled() {
    await Promise.all(this.#done);
  }

  #scrub(outcome) {
    if (!this.secrets.length) return outcome;
    let text = JSON.stringify(outcome);
    if (!this.secrets.some((secret) => text.includes(secret))) return outcome;
    for (const secret of this.secrets) text = text.split(JSON.stringify(secret).slice(1, -1)).join("[redacted]");
    return JSON.parse(text);
  }

  async #follow(session, cid, handle) {
    try {
      await this.#pollUntilDone(session, cid, handle);
    } catch (error) {
      // This task's continuation is left to the host lease (task_host_gone), visibly.
      this.log("task", `following ${cid} stopped: ${error.message ?? error}`);
    } finally {
      this.#following.delete(cid);
    }
  }

  async #pollUntilDone(session, cid, handle) {
    let interval = handle.pollIntervalMs;
    let failures = 0;
    let malformed = 0;
    let first = handle.status !== "working";
    for (;;) {
      if (!first) await sleep(Math.min(pollDelayMs(interval, failures), this.renewEveryMs));
      first = false;
      let outcome;
      try {
        outcome = this.#scrub(readOutcome(await session.getTask(handle.taskId, this.timeoutMs), handle.taskId));
        malformed = 0;
      } catch (error) {
        if (error instanceof ProtocolError && error.code === INVALID_PARAMS) {
          outcome = { status: "lost", message: "the server no longer knows this task" };
        } else if (
          session.closed ||
          (error instanceof SdkError &&
            (error.code === SdkErrorCode.ConnectionClosed || error.code === SdkErrorCode.NotConnected))
        ) {
          this.log("task", `the session following ${cid} ended; afterword's host lease decides`);
          return;
        } else if (error instanceof MalformedTask) {
          failures += 1;
          malformed += 1;
          if (malformed < PROTOCOL_ERROR_LIMIT) continue;
          outcome = { status: "protocol_error", message: error.message };
        } else {
          failures += 1; // a refused or timed-out poll: back off and poll again
          continue;
        }
      }
      if (outcome.pollIntervalMs != null) interval = outcome.pollIntervalMs;
      let report;
      try {
        report = await this.host.reportTaskOutcome(cid, outcome);
      } catch (error) {
        if (error.status === 413) {
          // Bigger than the host API takes: say so, so the continuation ends task_result_too_large.
          outcome = { status: "too_large", message: "result too large for the host API" };
          report = await this.host.reportTaskOutcome(cid, outcome);
        } else if (error.status === 0 || error.status === 429 || error.status >= 500) {
          failures += 1; // afterword unreachable or busy: poll again, report then
          continue;
        } else {
          throw error;
        }
      }
      failures = 0;
      this.outcomes.set(cid, outcome.status);
      this.log("task", `${cid}: reported ${outcome.status}; afterword: ${report.state}${report.cancel ? ", cancel" : ""}`);
      if (report.cancel) {
        await this.#cancel(session, handle.taskId);
        return;
      }
      if (TERMINAL_TASK.has(outcome.status) || TERMINAL_RECORD.has(report.state)) return;
    }
  }

  async #cancel(session, taskId) {
    try {
      await session.cancelTask(taskId, this.timeoutMs);
    } catch (error) {
      this.log("task", `tasks/cancel failed (${error.name})`); // best effort: the record is already ended
    }
  }
}
