// The worker's pure pieces: where its gateway is, which paths it may ask there, what a launch must say.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { GatewayClient, gatewayBase, pinnedIdentityCheck } from "../gateway_client.mjs";

describe("the gateway's address", () => {
  test("from the worker endpoint: ws→http, wss→https, same host and port, its path prefix kept", () => {
    assert.equal(gatewayBase("ws://127.0.0.1:18789/__openclaw__/worker"), "http://127.0.0.1:18789");
    assert.equal(gatewayBase("wss://gw.example:443/__openclaw__/worker"), "https://gw.example");
    assert.equal(gatewayBase("wss://gw.example:8443/prefix/__openclaw__/worker"), "https://gw.example:8443/prefix");
  });

  test("an endpoint that is not a worker endpoint of a gateway is refused", () => {
    for (const url of [
      "http://127.0.0.1:1/__openclaw__/worker",
      "ws://127.0.0.1:1/elsewhere",
      "ws://user:pw@127.0.0.1:1/__openclaw__/worker",
      "ws://127.0.0.1:1/__openclaw__/worker?x=1",
      "ws://127.0.0.1:1/__openclaw__/worker#f",
      "not a url",
    ]) {
      assert.equal(gatewayBase(url), null, url);
    }
  });

  test("only paths on the gateway itself: no other origin, no protocol-relative or odd paths", () => {
    const client = new GatewayClient({ base: "http://127.0.0.1:9/prefix", credential: "x".repeat(20) });
    assert.equal(client.url("/api/workers/turns/r/launch").href, "http://127.0.0.1:9/prefix/api/workers/turns/r/launch");
    for (const path of ["//evil.example/x", "http://evil.example/x", "api/x", "/a b", "/a\\b", 7, null]) {
      assert.equal(client.url(path), null, String(path));
    }
  });
});

describe("a pinned gateway certificate", () => {
  const fingerprint = "AB:".repeat(31) + "AB";
  const cert = { subject: { CN: "gw.example" }, subjectaltname: "DNS:gw.example", fingerprint256: fingerprint };

  test("is accepted with its own fingerprint (any spelling of the pin)", () => {
    assert.equal(pinnedIdentityCheck("ab".repeat(32))("gw.example", cert), undefined);
  });

  test("is refused with another fingerprint, and for another host whatever its fingerprint", () => {
    assert.match(pinnedIdentityCheck("cd".repeat(32))("gw.example", cert).message, /does not match its pinned fingerprint/u);
    assert.ok(pinnedIdentityCheck("ab".repeat(32))("other.example", cert) instanceof Error);
  });

  test("a pin in the sha256: or colon form is read; an unusable one is refused, never ignored", () => {
    const base = "https://gw.example";
    assert.equal(new GatewayClient({ base, credential: "x".repeat(20), tlsFingerprint: `sha256:${fingerprint}` }).pin, "ab".repeat(32));
    assert.throws(() => new GatewayClient({ base, credential: "x".repeat(20), tlsFingerprint: "not-a-pin" }), /not a SHA-256/u);
  });
});
