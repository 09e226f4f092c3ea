// The turn's progress, posted to the gateway in order: `POST /api/workers/turns/<runId>/progress {"items":[…]}`.
//
// One request at a time (so items arrive in the order they were made), each with every item queued so far
// (1–64 items, at most 4 MiB). Deltas are cumulative (the current step's text so far) and coalesced: at most
// one is queued per DELTA_INTERVAL_MS, and a pending one is queued ahead of any other item, so the gateway
// always has a step's text before the message that follows it. A transient failure (no connection, 429,
// 502–504) is retried with backoff; 409/410 means the run is no longer running here (GatewayGone); any other
// answer is a refusal. The first failure stops the channel (later items are dropped) and is reported once to
// `onFailure`; `end()` still tries to deliver the turn's `end` item unless the run is gone.

import { GatewayGone } from "./gateway_client.mjs";
import { oneLine } from "./reply_stream.mjs";

export const DELTA_INTERVAL_MS = 50;
export const MAX_ITEMS_PER_POST = 64;
export const MAX_POST_BYTES = 4 * 1024 * 1024;
// Room for `{"items":[` and `]}` and the commas between items.
const ENVELOPE_BYTES = 64 + MAX_ITEMS_PER_POST;
const POST_TIMEOUT_MS = 30_000;
const RETRY_DELAYS_MS = [100, 250, 500, 1000, 2000, 4000, 8000];
const END_QUICK_TIMEOUT_MS = 2_500;
const RETRYABLE_STATUSES = new Set([429, 502, 503, 504]);

/** The gateway would not take the turn's progress (a status other than 200, 409, 410, or no connection). */
export class ProgressRefused extends Error {
  constructor(message, { transient }) {
    super(message);
    this.transient = transient;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class ProgressChannel {
  constructor(client, runId, { onFailure = () => {}, log = () => {} } = {}) {
    this.client = client;
    this.path = `/api/workers/turns/${encodeURIComponent(runId)}/progress`;
    this.onFailure = onFailure;
    this.log = log;
    this.queue = [];
    this.sending = null;
    this.failure = null;
    this.pendingDelta = null;
    this.deltaTimer = null;
    this.lastDeltaAt = -Infinity;
    this.quick = false;
  }

  /** The current step's text so far (the newest one wins while a delta waits for its turn). */
  delta(text) {
    if (this.failure) return;
    this.pendingDelta = text;
    const wait = this.lastDeltaAt + DELTA_INTERVAL_MS - performance.now();
    if (wait <= 0) this.queueDelta();
    else this.deltaTimer ??= setTimeout(() => this.queueDelta(), wait);
  }

  /** A message or tool item, after any delta still waiting. */
  push(item) {
    if (this.failure) return;
    this.queueDelta();
    this.queue.push(item);
    this.kick();
  }

  /** Resolves once everything queued so far was accepted; rejects with the channel's failure. */
  async flush() {
    this.queueDelta();
    while (this.sending) await this.sending;
    if (this.failure) throw this.failure;
  }

  /**
   * Deliver the `end` item (after every item still queued); true once the gateway accepted it. When items before
   * it are refused, the end is sent once more on its own: it still says how the turn ended. `quick`: see hurry().
   */
  async end(result, { quick = false } = {}) {
    if (quick) this.hurry();
    for (let attempt = 1; ; attempt += 1) {
      if (this.failure instanceof GatewayGone) return false;
      if (this.failure) {
        // The items the gateway would not take are lost.
        this.queue = [];
        this.pendingDelta = null;
        this.failure = null;
      }
      this.queueDelta(); // the step's whole text so far, ahead of the end
      const end = { kind: "end", result };
      this.queue.push(end);
      this.kick();
      try {
        await this.flush();
        return true;
      } catch (error) {
        // Refused itself, or dropped unsent with a batch before it (then it gets one more try alone).
        if (attempt >= 2 || this.lastBatch?.includes(end) || error instanceof GatewayGone) {
          this.log(`the turn's end could not be reported: ${error.message}`);
          return false;
        }
      }
    }
  }

  queueDelta() {
    clearTimeout(this.deltaTimer);
    this.deltaTimer = null;
    if (this.pendingDelta === null || this.failure) return;
    const item = { kind: "delta", text: this.pendingDelta };
    this.pendingDelta = null;
    this.lastDeltaAt = performance.now();
    if (itemBytes(item) + ENVELOPE_BYTES > MAX_POST_BYTES) return; // a live view only: never worth a refusal
    this.queue.push(item);
    this.kick();
  }

  kick() {
    if (!this.sending) this.sending = this.drain();
  }

  async drain() {
    try {
      while (this.queue.length && !this.failure) {
        const batch = this.takeBatch();
        this.lastBatch = batch;
        try {
          await this.post(batch);
        } catch (error) {
          this.failure = error;
          this.queue = [];
          this.onFailure(error);
        }
      }
    } finally {
      this.sending = null;
    }
  }

  takeBatch() {
    const batch = [];
    let size = ENVELOPE_BYTES;
    while (this.queue.length && batch.length < MAX_ITEMS_PER_POST) {
      const item = fitted(this.queue[0]);
      const bytes = itemBytes(item);
      if (batch.length && size + bytes > MAX_POST_BYTES) break;
      this.queue.shift();
      batch.push(item);
      size += bytes;
    }
    return batch;
  }

  /** From now on every post gets one short attempt: the turn is stopping (the node stops a cancelled worker
   * within seconds). */
  hurry() {
    this.quick = true;
  }

  async post(items) {
    for (let attempt = 1; ; attempt += 1) {
      let failure;
      try {
        const answer = await this.client.exchange("POST", this.path, {
          body: { items },
          timeoutMs: this.quick ? END_QUICK_TIMEOUT_MS : POST_TIMEOUT_MS,
        });
        if (answer.status === 200) return;
        if (answer.status === 409 || answer.status === 410) throw new GatewayGone(answer.status);
        failure = new ProgressRefused(`progress refused: HTTP ${answer.status}${errorDetail(answer.json)}`, {
          transient: RETRYABLE_STATUSES.has(answer.status),
        });
      } catch (error) {
        if (error instanceof GatewayGone) throw error;
        failure = new ProgressRefused(`progress not delivered: ${error.code ?? error.name}`, { transient: true });
      }
      if (!failure.transient || this.quick || attempt > RETRY_DELAYS_MS.length) throw failure;
      await sleep(RETRY_DELAYS_MS[attempt - 1]);
    }
  }
}

/** `: <message>` of the gateway's `{"error": {"code", "message"}}`, one line and short; else nothing. */
export function errorDetail(json) {
  const message = json?.error?.message;
  return typeof message === "string" && message.trim() ? `: ${oneLine(message, 300)}` : "";
}

function itemBytes(item) {
  return Buffer.byteLength(JSON.stringify(item), "utf8") + 1;
}

/** An item within one post: a message whose whole tool output (`fullText`) would not fit goes without it. */
function fitted(item) {
  if (item.fullText === undefined || itemBytes(item) + ENVELOPE_BYTES <= MAX_POST_BYTES) return item;
  const { fullText: _dropped, ...rest } = item;
  return rest;
}
