// The worker's HTTP client for its gateway: the turn's routes, each with the turn's bearer credential.
//
// The HTTP(S) base is derived from the descriptor's worker endpoint as OpenClaw's node host derives its own
// transfer URLs (`transferUrl`, NH region src/node-host/node-worker-transfer-http.ts): ws→http, wss→https,
// same host and port, the gateway's path prefix kept (the endpoint's `/__openclaw__/worker` suffix removed).
// Cloudflare Access headers are sent when the endpoint has them; a pinned TLS fingerprint is checked on top
// of the usual certificate verification (a self-signed gateway certificate needs NODE_EXTRA_CA_CERTS, which the
// node passes to its workers). Node's http/https are used rather than fetch so that a pin is checked before any
// byte of a request (and its credential) is sent.
//
// Every failure that is not an HTTP status is a Node error; an answer 409/410 (the run is no longer running
// on this node) is a `GatewayGone` wherever it comes.

import http from "node:http";
import https from "node:https";
import tls from "node:tls";

export const WORKER_ENDPOINT_SUFFIX = "/__openclaw__/worker";
const MAX_ERROR_BODY_BYTES = 64 * 1024;

/** The gateway answered 409 or 410: the run is no longer running on this node; the turn stops. */
export class GatewayGone extends Error {
  constructor(status) {
    super(`the gateway answered HTTP ${status}: the run is no longer running here`);
    this.status = status;
  }
}

/** A request ran past its deadline. */
export class RequestTimedOut extends Error {
  constructor() {
    super("request timed out");
    this.code = "ETIMEDOUT";
  }
}

/** The http(s) base URL of the gateway from the descriptor's `connectionEndpoint.url`, or null if unusable. */
export function gatewayBase(endpointUrl) {
  const url = URL.parse(endpointUrl);
  if (url === null || (url.protocol !== "ws:" && url.protocol !== "wss:")) return null;
  if (url.username || url.password || url.search || url.hash || !url.pathname.endsWith(WORKER_ENDPOINT_SUFFIX)) {
    return null;
  }
  const base = new URL(url.toString());
  base.protocol = url.protocol === "wss:" ? "https:" : "http:";
  base.pathname = url.pathname.slice(0, -WORKER_ENDPOINT_SUFFIX.length);
  return base.toString().replace(/\/$/u, "");
}

/** A SHA-256 certificate fingerprint (hex, colon-separated, or `sha256:`-prefixed) as 64 lowercase hex, or null. */
export function normalizedFingerprint(value) {
  const hex = String(value ?? "")
    .trim()
    .replace(/^sha256:/iu, "")
    .replaceAll(":", "")
    .toLowerCase();
  return /^[0-9a-f]{64}$/u.test(hex) ? hex : null;
}

/** A `checkServerIdentity` that also requires the certificate's SHA-256 fingerprint to be `pin` (hex). Node
 * calls it only for a certificate whose chain verified: a pin adds to the verification, it does not replace it. */
export function pinnedIdentityCheck(pin) {
  return (host, cert) => {
    const failure = tls.checkServerIdentity(host, cert);
    if (failure) return failure;
    return normalizedFingerprint(cert.fingerprint256) === pin
      ? undefined
      : new Error("the gateway's TLS certificate does not match its pinned fingerprint");
  };
}

export class GatewayClient {
  /**
   * @param {object} options
   * @param {string} options.base          the gateway's http(s) base (gatewayBase)
   * @param {string} options.credential    the turn's bearer token
   * @param {object} [options.cloudflareAccess]  {clientId, clientSecret}
   * @param {string} [options.tlsFingerprint]    a SHA-256 certificate pin (https only)
   */
  constructor({ base, credential, cloudflareAccess, tlsFingerprint }) {
    this.base = base;
    this.credential = credential;
    this.extraHeaders = cloudflareAccess
      ? { "CF-Access-Client-Id": cloudflareAccess.clientId, "CF-Access-Client-Secret": cloudflareAccess.clientSecret }
      : {};
    this.pin = tlsFingerprint === undefined ? null : normalizedFingerprint(tlsFingerprint);
    if (tlsFingerprint !== undefined && this.pin === null) throw new Error("the TLS fingerprint is not a SHA-256 fingerprint");
  }

  /** The full URL of `path` (an absolute path on the gateway), or null when it would leave the gateway. */
  url(path) {
    if (typeof path !== "string" || !path.startsWith("/") || path.startsWith("//") || /[\s\\]/u.test(path)) {
      return null;
    }
    const url = URL.parse(this.base + path);
    return url !== null && url.origin === new URL(this.base).origin ? url : null;
  }

  /**
   * Send one request; resolves with the response (its body unread) once the status line arrived.
   * `signal` aborts it (and its body) at any time; `timeoutMs` bounds it as a whole, body included
   * (the timeout's signal is `response.deadline`).
   */
  send(method, path, { body, signal, timeoutMs, accept = "application/json" } = {}) {
    const url = this.url(path);
    if (url === null) return Promise.reject(new Error("the gateway path is not a path on the gateway"));
    const deadline = timeoutMs ? AbortSignal.timeout(timeoutMs) : null;
    const signals = [signal, deadline].filter(Boolean);
    const combined = signals.length ? AbortSignal.any(signals) : undefined;
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body), "utf8");
    const headers = {
      ...this.extraHeaders,
      Authorization: `Bearer ${this.credential}`,
      Accept: accept,
      ...(payload ? { "Content-Type": "application/json", "Content-Length": String(payload.length) } : {}),
    };
    const secure = url.protocol === "https:";
    const options = { method, headers, signal: combined };
    if (secure && this.pin) options.checkServerIdentity = pinnedIdentityCheck(this.pin);
    return new Promise((resolve, reject) => {
      const request = (secure ? https : http).request(url, options, (response) => {
        // An abort while nobody reads the body must not become an uncaught 'error'; readers see it anyway.
        response.on("error", () => {});
        response.deadline = deadline;
        response.requestSignal = combined;
        resolve(response);
      });
      request.on("error", (error) => reject(deadline?.aborted && !signal?.aborted ? new RequestTimedOut() : error));
      request.end(payload);
    });
  }

  /** `send`, then the whole body (at most `maxBytes`) as {status, text, json (undefined unless JSON)}. */
  async exchange(method, path, { body, signal, timeoutMs, maxBytes }) {
    const response = await this.send(method, path, { body, signal, timeoutMs });
    const text = await readBody(response, maxBytes, signal);
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { status: response.statusCode, statusMessage: response.statusMessage, text, json };
  }
}

/** The body of `response` as text; a body longer than `maxBytes` is cut there (and the response closed). */
export async function readBody(response, maxBytes = MAX_ERROR_BODY_BYTES, signal) {
  const chunks = [];
  let size = 0;
  try {
    for await (const chunk of response) {
      const room = maxBytes - size;
      chunks.push(chunk.length > room ? chunk.subarray(0, room) : chunk);
      size += Math.min(chunk.length, room);
      if (size >= maxBytes) {
        response.destroy();
        break;
      }
    }
  } catch (error) {
    if (signal?.aborted) throw error;
    if (response.deadline?.aborted) throw new RequestTimedOut();
    throw error;
  }
  return Buffer.concat(chunks).toString("utf8");
}
