// One turn on this node: its launch fetched from the gateway, the agent loop run against the gateway's
// inference proxy, its progress posted back, and exactly one `end` item (what openclaw_client/worker.py's
// `AgentTurn` does with stdout events, here over the gateway's worker routes; docs/node-worker-protocol.md).
//
//   const turn = new WorkerTurn({client, runId, workspaceDir, log});
//   stdin cancel / SIGTERM → turn.cancel();
//   const {result, delivered} = await turn.run();   // result: the end item's result; delivered: the gateway took it
//
// Failure kinds are the Python worker's (`timeout`, `connection`, `http`, `rate_limit`, `malformed`,
// `refusal`, `step_limit`, `unknown`, or a kind the gateway reported); messages are one line and never contain
// the credential.

import process from "node:process";

import { AgentLoop, DEFAULT_MAX_STEPS, LoopAborted, StepLimitReached } from "./agent_loop.mjs";
import { GatewayGone, RequestTimedOut, readBody } from "./gateway_client.mjs";
import { ProgressChannel, errorDetail } from "./progress.mjs";
import { ErrorReported, MalformedReply, RefusedReply, ReplyError, StreamState, oneLine } from "./reply_stream.mjs";
import { ToolRunner } from "./tools.mjs";

const MAX_LAUNCH_BYTES = 64 * 1024 * 1024;
const MAX_LINE_BYTES = 16 * 1024 * 1024;
const MAX_ERROR_BODY_BYTES = 64 * 1024;
const ERROR_DETAIL_CHARS = 300;
const LAUNCH_TIMEOUT_MS = 60_000;
const GATEWAY_RETRY_DELAYS_MS = [250, 500, 1000, 2000, 4000, 8000, 15000];
// A decision may take an operator minutes: the gateway answers 504 (ask again) long before this.
const APPROVAL_REQUEST_TIMEOUT_MS = 10 * 60_000;
const APPROVAL_RETRY_PAUSE_MS = 100;
const RETRYABLE_STATUSES = new Set([429, 502, 503, 504]);
const KIND_PATTERN = /^[a-z_]{1,64}$/u;
const ABORTED_TEXT = "not run: the turn was aborted";

/** The turn failed; `kind` classifies it as the gateway's model providers do. */
export class TurnFailed extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

/** The turn was cancelled (the node asked, or the gateway no longer runs it). */
export class TurnCancelled extends Error {
  constructor() {
    super("the turn was cancelled");
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
const positiveInteger = (value) => Number.isSafeInteger(value) && value > 0;

export class WorkerTurn {
  constructor({ client, runId, workspaceDir, log = () => {} }) {
    this.client = client;
    this.runId = runId;
    this.workspaceDir = workspaceDir;
    this.log = log;
    this.abort = new AbortController();
    this.gone = false;
    this.progress = new ProgressChannel(client, runId, {
      log,
      onFailure: (error) => {
        if (error instanceof GatewayGone) this.stopBecauseGone();
        else {
          this.progressFailure = error;
          this.cancel();
        }
      },
    });
    this.progressFailure = null;
    this.text = ""; // the current step's text (an aborted turn keeps it)
    this.step = 0;
    this.results = 0;
  }

  get cancelled() {
    return this.abort.signal.aborted;
  }

  /** Stop the turn: its model request, a running tool (through the signal), a wait for an approval. */
  cancel() {
    this.progress.hurry();
    this.abort.abort();
  }

  stopBecauseGone() {
    this.gone = true;
    this.cancel();
  }

  /** `promise`, or TurnCancelled as soon as the turn is cancelled. */
  untilCancelled(promise) {
    if (this.cancelled) return Promise.reject(new TurnCancelled());
    return new Promise((resolve, reject) => {
      const stop = () => reject(new TurnCancelled());
      this.abort.signal.addEventListener("abort", stop, { once: true });
      promise.then(resolve, reject).finally(() => this.abort.signal.removeEventListener("abort", stop));
    });
  }

  /** Runs the turn to its end; `{result, delivered}` (delivered: the gateway accepted the `end` item). */
  async run() {
    const result = await this.outcome();
    if (this.gone) return { result, delivered: false }; // nobody to tell: the run is no longer running here
    const delivered = await this.progress.end(result, { quick: result.status === "aborted" });
    return { result, delivered };
  }

  async outcome() {
    try {
      const launch = await this.fetchLaunch();
      this.deadline = performance.now() + launch.timeoutMs;
      this.timeoutMs = launch.timeoutMs;
      this.model = launch.model;
      this.inferencePath = launch.inferencePath;
      enterWorkspace(this.workspaceDir);
      const runner = this.toolRunner(launch.agent);
      const loop = new AgentLoop({
        hooks: this,
        runner,
        maxSteps: launch.agent.maxSteps,
        tools: runner === null ? [] : runner.toolSpecs(),
      });
      const outcome = await loop.run([...launch.messages]);
      const done = { status: "ok", text: outcome.text, stopReason: outcome.stopReason };
      if (outcome.usage !== null) done.usage = outcome.usage;
      if (outcome.model !== null) done.model = outcome.model;
      return done;
    } catch (error) {
      return this.failedOutcome(error);
    }
  }

  failedOutcome(error) {
    if (this.progressFailure !== null) {
      const kind = this.progressFailure.transient ? "connection" : "http";
      return errorEnd(kind, this.redact(`the gateway did not take the turn's progress: ${this.progressFailure.message}`));
    }
    if (error instanceof TurnCancelled || error instanceof LoopAborted || error instanceof GatewayGone) {
      return { status: "aborted", text: this.text };
    }
    if (this.cancelled) return { status: "aborted", text: this.text };
    if (error instanceof StepLimitReached) return errorEnd("step_limit", error.message);
    if (error instanceof TurnFailed) return errorEnd(error.kind, this.redact(error.message));
    // A bug here must still end the turn, or the gateway waits for its timeout.
    this.log(`turn failed: ${error?.stack ?? error}`);
    return errorEnd("unknown", this.redact(`worker failed: ${describe(error)}`));
  }

  redact(message) {
    return this.client.credential ? message.replaceAll(this.client.credential, "[redacted]") : message;
  }

  toolRunner(agent) {
    if (!agent.tools) return null;
    try {
      return new ToolRunner(this.workspaceDir, agent.execTimeoutMs ? { execTimeoutMs: agent.execTimeoutMs } : {});
    } catch (error) {
      this.log(`the workspace cannot host tools: ${describe(error)}`);
      return null; // no workspace here: the model is offered no tools
    }
  }

  // --- the launch -----------------------------------------------------------------------------------

  async fetchLaunch() {
    const path = `/api/workers/turns/${encodeURIComponent(this.runId)}/launch`;
    const answer = await this.withRetries("launch request", () =>
      this.client.exchange("GET", path, {
        signal: this.abort.signal,
        timeoutMs: LAUNCH_TIMEOUT_MS,
        maxBytes: MAX_LAUNCH_BYTES,
      }),
    );
    if (answer.status !== 200) {
      throw new TurnFailed(statusKind(answer.status), `launch request failed: HTTP ${answer.status}${errorDetail(answer.json)}`);
    }
    return parseLaunch(answer.json, this.runId);
  }

  /**
   * `exchange()` until it gives an answer that is not transient (no connection, 429, 502–504); a 409/410
   * stops the turn; the turn's cancel stops the retries.
   */
  async withRetries(what, exchange, { answered = [] } = {}) {
    for (let attempt = 0; ; attempt += 1) {
      this.checkCancelled();
      let answer;
      try {
        answer = await exchange();
      } catch (error) {
        this.checkCancelled();
        if (attempt >= GATEWAY_RETRY_DELAYS_MS.length) throw connectionFailure(what, error);
        this.log(`${what}: ${describe(error)}; retrying`);
        await sleep(GATEWAY_RETRY_DELAYS_MS[attempt], this.abort.signal);
        continue;
      }
      if (answer.status === 409 || answer.status === 410) {
        this.stopBecauseGone();
        throw new GatewayGone(answer.status);
      }
      if (answered.includes(answer.status) || !RETRYABLE_STATUSES.has(answer.status)) return answer;
      if (attempt >= GATEWAY_RETRY_DELAYS_MS.length) return answer;
      await sleep(GATEWAY_RETRY_DELAYS_MS[attempt], this.abort.signal);
    }
  }

  checkCancelled() {
    if (this.cancelled) throw new TurnCancelled();
  }

  // --- the loop's hooks -----------------------------------------------------------------------------

  get signal() {
    return this.abort.signal;
  }

  shouldAbort() {
    return this.cancelled;
  }

  async modelStep(messages, tools, step) {
    this.step = step;
    this.results = 0;
    this.text = "";
    const reply = await this.ask(messages, tools.length ? tools : null);
    return {
      text: reply.text,
      toolCalls: reply.toolCalls,
      stopReason: reply.finishReason,
      usage: reply.usage,
      model: reply.model,
    };
  }

  async recordMessage(message, fullText) {
    const key = message.role === "toolResult" ? `s${this.step}.r${++this.results}` : `s${this.step}.a`;
    const item = { kind: "message", key, message };
    if (fullText !== null) item.fullText = fullText;
    this.progress.push(item);
    return message;
  }

  toolStarted(callId, name, args) {
    this.progress.push({ kind: "tool", phase: "start", toolCallId: callId, name, args });
  }

  /**
   * The gateway's decision on one `exec` (its policy, and an operator's answer when the policy asks): asked
   * after everything before it was delivered, again on 504/TIMEOUT (still undecided), until the turn stops.
   */
  async approveExec(callId, request) {
    const body = {
      toolCallId: callId,
      command: request.command,
      workdir: request.workdir,
      envKeys: [...request.envKeys],
      timeoutS: request.timeoutS,
    };
    const path = `/api/workers/turns/${encodeURIComponent(this.runId)}/approval`;
    try {
      await this.untilCancelled(this.progress.flush());
      for (;;) {
        const answer = await this.withRetries(
          "exec approval request",
          () =>
            this.client.exchange("POST", path, {
              body,
              signal: this.abort.signal,
              timeoutMs: APPROVAL_REQUEST_TIMEOUT_MS,
              maxBytes: MAX_ERROR_BODY_BYTES,
            }),
          { answered: [504] }, // "still undecided": asked again at once, below
        );
        if (answer.status === 504 || answer.json?.error?.code === "TIMEOUT") {
          await sleep(APPROVAL_RETRY_PAUSE_MS, this.abort.signal);
          continue;
        }
        if (answer.status !== 200 || !isObject(answer.json)) {
          throw new TurnFailed(statusKind(answer.status), `exec approval request failed: HTTP ${answer.status}${errorDetail(answer.json)}`);
        }
        return {
          allowed: answer.json.allowed === true,
          reason: typeof answer.json.reason === "string" ? answer.json.reason : "",
          aborted: answer.json.aborted === true,
        };
      }
    } catch (error) {
      if (this.cancelled) return { allowed: false, reason: ABORTED_TEXT, aborted: true };
      throw error;
    }
  }

  // --- one model call -------------------------------------------------------------------------------

  /** One model call through the gateway's inference proxy: its text streamed as deltas, the whole reply returned. */
  async ask(messages, tools) {
    this.checkCancelled();
    const state = new StreamState();
    const remaining = Math.max(1, Math.round(this.deadline - performance.now()));
    const payload = { model: this.model, messages, stream: true };
    if (tools) payload.tools = tools;
    let response;
    try {
      response = await this.client.send("POST", this.inferencePath, {
        body: payload,
        signal: this.abort.signal,
        timeoutMs: remaining,
        accept: "text/event-stream",
      });
      if (response.statusCode === 409 || response.statusCode === 410) {
        response.destroy();
        this.stopBecauseGone();
        throw new TurnCancelled();
      }
      if (response.statusCode < 200 || response.statusCode >= 300) throw await httpFailure(response);
      await this.readEvents(response, state);
      return state.reply();
    } catch (error) {
      response?.destroy();
      throw this.modelFailure(error, response?.deadline?.aborted === true);
    }
  }

  /** Fold the event stream until [DONE]; a body that ends first is complete only when the last chunk said why
   * it stopped (the gateway's proxy always ends with [DONE], so anything less was cut short). */
  async readEvents(response, state) {
    response.setEncoding("utf8");
    let pending = "";
    const feed = (line) => {
      const piece = state.feedLine(line.endsWith("\r") ? line.slice(0, -1) : line);
      if (piece) {
        this.text = state.text;
        this.progress.delta(this.text);
      }
    };
    for await (const chunk of response) {
      pending += chunk;
      let newline;
      while (!state.done && (newline = pending.indexOf("\n")) !== -1) {
        feed(pending.slice(0, newline));
        pending = pending.slice(newline + 1);
      }
      if (state.done) return;
      if (pending.length > MAX_LINE_BYTES) {
        throw new TurnFailed("malformed", "inference stream has a line longer than 16 MiB");
      }
    }
    if (pending) feed(pending);
    if (state.done) return;
    state.endOfStream();
    if (state.finishReason === null) {
      throw new TurnFailed("malformed", "inference stream ended before the reply was complete");
    }
  }

  /** What went wrong with a model call, as the turn's error (or its cancellation); `timedOut`: the call's
   * deadline aborted it (the body's reader sees only an abort). */
  modelFailure(error, timedOut) {
    if (error instanceof TurnCancelled || this.cancelled) return new TurnCancelled();
    let failure;
    if (error instanceof TurnFailed) failure = error;
    else if (error instanceof ReplyError) failure = replyFailure(error);
    else if (timedOut || error instanceof RequestTimedOut || error?.name === "TimeoutError") {
      failure = new TurnFailed("timeout", `inference request timed out after ${this.timeoutMs} ms`);
    } else if (error?.code === "ECONNREFUSED") {
      failure = new TurnFailed("connection", "inference endpoint unreachable: connection refused");
    } else if (isNetworkError(error)) {
      failure = new TurnFailed("connection", `inference request failed: ${describe(error)}`);
    } else return error; // a bug: the turn ends `unknown` with what it was
    if (failure.kind === "aborted") return new TurnCancelled(); // the gateway aborted the run on its side
    return new TurnFailed(failure.kind, this.redact(failure.message));
  }
}

// --- the launch ---------------------------------------------------------------------------------------

/** The launch's fields this worker uses, checked; a launch that does not say them is `unknown`. */
export function parseLaunch(launch, runId) {
  const agent = launch?.agent ?? {};
  const inference = launch?.inference;
  const maxSteps = agent.maxSteps ?? DEFAULT_MAX_STEPS;
  const execTimeoutMs = agent.execTimeoutMs ?? null;
  if (
    !isObject(launch) ||
    launch.runId !== runId ||
    typeof launch.model !== "string" ||
    !Array.isArray(launch.messages) ||
    !launch.messages.every(isObject) ||
    !positiveInteger(launch.timeoutMs) ||
    !isObject(agent) ||
    !positiveInteger(maxSteps) ||
    typeof (agent.tools ?? false) !== "boolean" ||
    !(execTimeoutMs === null || positiveInteger(execTimeoutMs)) ||
    !isObject(inference) ||
    typeof inference.path !== "string" ||
    !inference.path.startsWith("/")
  ) {
    throw new TurnFailed("unknown", "worker received a malformed launch");
  }
  return {
    model: launch.model,
    messages: launch.messages,
    timeoutMs: launch.timeoutMs,
    agent: { maxSteps, tools: agent.tools ?? false, execTimeoutMs },
    inferencePath: inference.path,
  };
}

/** Work in the turn's workspace, as the Python worker does (a relative path in a tool means it). */
function enterWorkspace(directory) {
  try {
    process.chdir(directory);
  } catch {
    throw new TurnFailed("unknown", "the environment's workspace is not available");
  }
}

// --- failures, as the Python worker words them ----------------------------------------------------------

function errorEnd(kind, message) {
  return { status: "error", error: { kind, message } };
}

function replyFailure(error) {
  if (error instanceof ErrorReported) return reportedFailure(error.body.error);
  if (error instanceof RefusedReply) return new TurnFailed("refusal", error.message);
  if (error instanceof MalformedReply) return new TurnFailed("malformed", `inference stream is malformed: ${error.why}`);
  return new TurnFailed("malformed", `inference stream is malformed: ${error.message}`);
}

/** The gateway's `{"kind", "message"}` error (or a bare message) as a failure. */
function reportedFailure(error) {
  let kind = null;
  let message = error;
  if (isObject(error)) {
    kind = error.kind || error.code || error.type || null;
    message = error.message;
  }
  const text = typeof message === "string" && message.trim() ? oneLine(message, ERROR_DETAIL_CHARS) : "the model call failed";
  return new TurnFailed(knownKind(kind), text);
}

/** A kind name as the gateway's providers spell them (lowercase words); anything else is `unknown`. */
function knownKind(kind) {
  return typeof kind === "string" && KIND_PATTERN.test(kind) ? kind : "unknown";
}

/** A non-2xx answer: the gateway's structured error when it sent one, else the status and a snippet. */
async function httpFailure(response) {
  let text = "";
  try {
    text = await readBody(response, MAX_ERROR_BODY_BYTES);
  } catch {
    text = "";
  }
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  const status = response.statusCode;
  if (isObject(parsed) && parsed.error !== undefined && parsed.error !== null) {
    const reported = reportedFailure(parsed.error);
    const kind = reported.kind !== "unknown" ? reported.kind : statusKind(status);
    return new TurnFailed(kind, `inference request failed: HTTP ${status}: ${reported.message}`);
  }
  const detail = oneLine(text, ERROR_DETAIL_CHARS) || response.statusMessage || "no details";
  return new TurnFailed(statusKind(status), `inference request failed: HTTP ${status}: ${detail}`);
}

function statusKind(status) {
  if (status === 429) return "rate_limit";
  if (status === 408 || status === 504) return "timeout";
  return "http";
}

function connectionFailure(what, error) {
  if (error instanceof RequestTimedOut) return new TurnFailed("timeout", `${what} timed out`);
  return new TurnFailed("connection", `${what} failed: ${describe(error)}`);
}

function isNetworkError(error) {
  return typeof error?.code === "string" || error?.name === "AbortError";
}

/** An error as one short line: its code (or class) and message. */
export function describe(error) {
  const name = error?.code ?? error?.name ?? "Error";
  const detail = error?.message ?? String(error);
  return oneLine(detail ? `${name}: ${detail}` : name, ERROR_DETAIL_CHARS);
}
