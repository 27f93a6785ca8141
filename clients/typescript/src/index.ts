/**
 * A typed client for afterword's host API (`/v1/host/...`, docs/host-api.md).
 *
 * A host runs `afterword serve` beside it and binds each agent run over loopback HTTP:
 *
 *   const host = await HostClient.fromTokenFile("http://127.0.0.1:4319", tokenPath);
 *   const run = await host.beginRun({ runId, conversationId, replyTo });
 *   spawnServer({ env: run.stdioEnv("work-control", process.env) });
 *   ...the model's tool calls settle...
 *   await run.close();
 *   await run.finalize(history);   // throws: fail the turn instead of publishing success
 *   await run.activate();          // after the host committed its turn
 *
 * No dependencies beyond Node 20 (global fetch, node:fs).
 */

import { readFile } from "node:fs/promises";

// A producer written for Node computes a result's payloadHash with these.
export { canonicalJson, payloadHash } from "./canonical.js";

export type Mode = "reply" | "notify_if_actionable" | "capture" | "silent";
export type RunState = "open" | "closed" | "finalized" | "activated" | "abandoned";

/** The reserved environment variables of a stdio server; written over any configured value. */
export const RESERVED_ENV = [
  "MONO_AGENT_CONTINUATION_CLAIM_URL",
  "MONO_AGENT_CONTINUATION_CLAIM_TOKEN",
  "MONO_AGENT_CONTINUATION_CLAIM_FINGERPRINT",
  "MONO_AGENT_CONTINUATION_CLAIM_MODE",
] as const;

/** The reserved headers of a loopback HTTP server. */
export const RESERVED_HEADERS = [
  "x-mono-agent-continuation-claim-url",
  "x-mono-agent-continuation-claim-token",
  "x-mono-agent-continuation-claim-fingerprint",
  "x-mono-agent-continuation-claim-mode",
] as const;

const TERMINAL = new Set(["delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"]);

export interface HistoryMessage {
  role: "user" | "assistant";
  content: string;
}

export interface ServerBinding {
  server: string;
  env: Record<string, string>;
  headers: Record<string, string>;
}

export interface Receipt {
  kind: string;
  deliveredAt: string;
  channelId: string | null;
  deliveryIds: string[];
  historyRecorded: boolean;
  historyErrorCode: string | null;
}

export interface ContinuationStatus {
  continuationId: string;
  state: string;
  originContext: string;
  mode: string;
  kind: string;
  attempts: { synthesis: number; delivery: number };
  lastError: { code: string; message: string } | null;
  receipt: Receipt | null;
  completionKind: string | null;
  deferred: boolean;
  expiresAt: string;
  createdAt: string;
  updatedAt: string;
  outcome?: string | null;
}

export interface RunBody {
  runId: string;
  conversationId: string;
  replyTo: string | null;
  mode: Mode;
  state: RunState;
  abandonReason: "host" | "lease_lapsed" | null;
  servers: ServerBinding[];
  leaseMs: number;
  leaseExpiresAt: string;
  snapshotDigest: string | null;
  claims: ContinuationStatus[];
}

export interface HealthCause {
  code: string;
  status: string;
  count: number;
  message: string;
  ids: string[];
  commands: string[];
}

export interface Health {
  status: "healthy" | "degraded" | "unhealthy";
  counts: Record<string, number>;
  historyUnrecorded: number;
  active: number;
  causes: HealthCause[];
}

export interface ListItem {
  continuationId: string;
  state: string;
  originContext: string;
  [field: string]: unknown;
}

export interface ListPage {
  items: ListItem[];
  nextCursor: string | null;
}

export type Resolution =
  | { kind: "delivered"; deliveryId?: string }
  | { kind: "not_delivered" }
  | { kind: "dead_lettered" };

/** The status a task handle or a `tasks/get` answer carries (MCP Tasks, SEP-2663). */
export type TaskStatus = "working" | "input_required" | "completed" | "failed" | "cancelled";

/**
 * A task handle as an MCP server answered `tools/call` with it (`resultType: "task"`). Only
 * these fields are sent to afterword; anything else the handle holds is left out.
 */
export interface TaskHandle {
  taskId: string;
  status: TaskStatus;
  pollIntervalMs?: number | null;
  ttlMs?: number | null;
}

/** What adopting a task made: the continuation, and who polls the task. */
export interface AdoptedTask {
  continuationId: string;
  /** `service`: afterword polls it (loopback HTTP server); `host`: the host must (stdio). */
  follow: "service" | "host";
}

/** One answer of a host-followed task, reported to afterword (`lost`: the server forgot it). */
export interface TaskOutcome {
  status: TaskStatus | "lost";
  /** The `CallToolResult` of a completed (or failed) task: `content`, `structuredContent`, `isError`. */
  result?: { content?: unknown[]; structuredContent?: unknown; isError?: boolean } | null;
  /** Why it failed or was lost; at most 1 KiB. */
  message?: string | null;
  pollIntervalMs?: number | null;
}

/** afterword's answer to a report: the continuation's state, and whether to send `tasks/cancel`. */
export interface TaskReport {
  state: string;
  cancel: boolean;
}

/** An error answered by the service (its JSON envelope), or `status` 0 when unreachable. */
export class AfterwordError extends Error {
  readonly status: number;
  readonly code: string;

  constructor(status: number, code: string, message: string) {
    super(message);
    this.name = "AfterwordError";
    this.status = status;
    this.code = code;
  }
}

export interface HostClientOptions {
  /** The service's base URL, e.g. `http://127.0.0.1:4319`. */
  baseUrl: string;
  /** The host capability (`afterword continuations host-token --file PATH`). */
  token: string;
  /** Per-request timeout; `close` waits for admitted claims, so keep it generous. */
  timeoutMs?: number;
  fetch?: typeof fetch;
}

export interface BeginRunOptions {
  runId: string;
  conversationId: string;
  /** The physical route the channel driver gave the host, never a value from a model. */
  replyTo?: string | null;
  mode?: Mode;
}

function enc(part: string): string {
  return encodeURIComponent(part);
}

export class HostClient {
  readonly baseUrl: string;
  readonly #token: string;
  readonly #timeoutMs: number;
  readonly #fetch: typeof fetch;

  constructor(options: HostClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#token = options.token;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#fetch = options.fetch ?? fetch;
  }

  /** A client whose capability is read from the owner-only file the CLI wrote. */
  static async fromTokenFile(baseUrl: string, path: string, options: Partial<HostClientOptions> = {}) {
    const token = (await readFile(path, "utf8")).trim();
    return new HostClient({ ...options, baseUrl, token });
  }

  /** The token never appears here (nor in any error). */
  toString(): string {
    return `HostClient(${this.baseUrl})`;
  }

  async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.#token}` };
    const init: RequestInit = { method, headers, signal: AbortSignal.timeout(this.#timeoutMs) };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response: Response;
    try {
      response = await this.#fetch(`${this.baseUrl}/v1/host${path}`, init);
    } catch (error) {
      const why = error instanceof Error ? error.name : "error";
      throw new AfterwordError(0, "unreachable", `cannot reach ${this.baseUrl} (${why}): is afterword serve running?`);
    }
    const text = await response.text();
    if (!response.ok) {
      let code = "internal";
      let message = `HTTP ${response.status}`;
      try {
        const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
        if (typeof parsed.error?.code === "string") code = parsed.error.code;
        if (typeof parsed.error?.message === "string") message = parsed.error.message;
      } catch {
        // not the envelope: keep the status line
      }
      throw new AfterwordError(response.status, code, message);
    }
    return JSON.parse(text) as T;
  }

  async beginRun(options: BeginRunOptions): Promise<Run> {
    const body = {
      runId: options.runId,
      conversationId: options.conversationId,
      replyTo: options.replyTo ?? null,
      mode: options.mode ?? "reply",
    };
    return new Run(this, await this.request<RunBody>("POST", "/runs", body));
  }

  async getRun(runId: string): Promise<Run> {
    return new Run(this, await this.request<RunBody>("GET", `/runs/${enc(runId)}`));
  }

  health(): Promise<Health> {
    return this.request<Health>("GET", "/health");
  }

  listContinuations(options: { limit?: number; cursor?: string } = {}): Promise<ListPage> {
    const query = new URLSearchParams();
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    if (options.cursor !== undefined) query.set("cursor", options.cursor);
    const qs = query.size ? `?${query}` : "";
    return this.request<ListPage>("GET", `/continuations${qs}`);
  }

  /** The text a delivered capture continuation kept; null for anything else. */
  async capturedText(continuationId: string): Promise<string | null> {
    const body = await this.request<{ text: string | null }>(
      "GET",
      `/continuations/${enc(continuationId)}/captured-text`,
    );
    return body.text;
  }

  retry(continuationId: string, options: { allowUnknown?: boolean } = {}): Promise<ContinuationStatus> {
    const body = { allowUnknown: options.allowUnknown ?? false };
    return this.request("POST", `/continuations/${enc(continuationId)}/retry`, body);
  }

  cancel(continuationId: string): Promise<ContinuationStatus> {
    return this.request("POST", `/continuations/${enc(continuationId)}/cancel`);
  }

  resolve(continuationId: string, resolution: Resolution): Promise<ContinuationStatus> {
    return this.request("POST", `/continuations/${enc(continuationId)}/resolve`, resolution);
  }

  /**
   * Report what `tasks/get` answered for a host-followed task (follow `host`). A `working`
   * report renews the host's lease on it; when the answer says `cancel`, send `tasks/cancel`.
   */
  reportTaskOutcome(continuationId: string, outcome: TaskOutcome): Promise<TaskReport> {
    const body: Record<string, unknown> = { status: outcome.status };
    for (const key of ["result", "message", "pollIntervalMs"] as const) {
      if (outcome[key] !== undefined && outcome[key] !== null) body[key] = outcome[key];
    }
    return this.request("POST", `/continuations/${enc(continuationId)}/task-outcome`, body);
  }
}

/** One run bound over the host API: the in-process RunBinding's methods, over HTTP. */
export class Run {
  readonly #client: HostClient;
  body: RunBody;

  constructor(client: HostClient, body: RunBody) {
    this.#client = client;
    this.body = body;
  }

  get runId(): string {
    return this.body.runId;
  }

  get servers(): string[] {
    return this.body.servers.map((s) => s.server);
  }

  get state(): RunState {
    return this.body.state;
  }

  #binding(server: string): ServerBinding | undefined {
    return this.body.servers.find((s) => s.server === server);
  }

  /**
   * The environment to spawn a stdio server with: `baseEnv` with every reserved name removed
   * (whatever its case), then the reserved values last, only for a selected server of an
   * open run.
   */
  stdioEnv(server: string, baseEnv: Record<string, string | undefined> = {}): Record<string, string> {
    const reserved = new Set<string>(RESERVED_ENV);
    const out: Record<string, string> = {};
    for (const [key, value] of Object.entries(baseEnv)) {
      if (value !== undefined && !reserved.has(key.toUpperCase())) out[key] = value;
    }
    return { ...out, ...(this.#binding(server)?.env ?? {}) };
  }

  /** Headers for a loopback HTTP server, built the same way as {@link stdioEnv}. */
  httpHeaders(server: string, baseHeaders: Record<string, string> = {}): Record<string, string> {
    const reserved = new Set<string>(RESERVED_HEADERS);
    const out: Record<string, string> = {};
    for (const [key, value] of Object.entries(baseHeaders)) {
      if (!reserved.has(key.toLowerCase())) out[key] = value;
    }
    return { ...out, ...(this.#binding(server)?.headers ?? {}) };
  }

  async #post(verb: string, body?: unknown): Promise<RunBody> {
    this.body = await this.#client.request<RunBody>("POST", `/runs/${enc(this.runId)}/${verb}`, body);
    return this.body;
  }

  async refresh(): Promise<RunBody> {
    this.body = (await this.#client.getRun(this.runId)).body;
    return this.body;
  }

  heartbeat(): Promise<RunBody> {
    return this.#post("heartbeat");
  }

  /** No new claims; waits for admitted ones. Returns the ids of the run's active claims. */
  async close(): Promise<string[]> {
    const body = await this.#post("close");
    return body.claims.filter((c) => !TERMINAL.has(c.state)).map((c) => c.continuationId);
  }

  /** Pins the origin snapshot; its digest, or null when no claim needs one. */
  async finalize(history: HistoryMessage[]): Promise<string | null> {
    return (await this.#post("finalize", { history })).snapshotDigest;
  }

  async activate(): Promise<void> {
    await this.#post("activate");
  }

  /**
   * Adopt a task handle a selected server answered a tool call with: a continuation bound to
   * this run like a claim. Repeating it for the same task returns the same continuation.
   */
  adoptTask(server: string, handle: TaskHandle): Promise<AdoptedTask> {
    const body: Record<string, unknown> = { server, taskId: handle.taskId, status: handle.status };
    if (handle.pollIntervalMs !== undefined && handle.pollIntervalMs !== null) body.pollIntervalMs = handle.pollIntervalMs;
    if (handle.ttlMs !== undefined && handle.ttlMs !== null) body.ttlMs = handle.ttlMs;
    return this.#client.request<AdoptedTask>("POST", `/runs/${enc(this.runId)}/tasks`, body);
  }

  async abandon(): Promise<void> {
    await this.#post("abandon");
  }

  /**
   * Heartbeat every `intervalMs` (default: a third of the lease) until the returned function
   * is called, for a turn that spends long stretches without calling the run.
   */
  keepAlive(intervalMs = Math.max(100, Math.floor(this.body.leaseMs / 3))): () => void {
    const timer = setInterval(() => {
      this.heartbeat().catch(() => undefined); // a lapsed run shows on its next settle call
    }, intervalMs);
    timer.unref();
    return () => clearInterval(timer);
  }
}
