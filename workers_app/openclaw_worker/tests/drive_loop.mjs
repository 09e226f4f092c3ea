// Runs agent_loop.mjs on scripted model replies for the parity test with openclaw_client/agent/loop.py
// (tests/workers_app/test_openclaw_worker_js.py): `node drive_loop.mjs <bundle dir>` reads
// `[{messages, maxSteps, abortAfter, replies: [{text, toolCalls: [{id, name, arguments}], stopReason, usage,
// model}]}, …]` as JSON on stdin and prints, per case, what the hooks saw and how the loop ended (`abortAfter`:
// the turn is stopped once that many tools started). The turn has no workspace (no tool runner): the loop's
// own shapes are compared; the tools have their own parity test.

import path from "node:path";
import { pathToFileURL } from "node:url";

const { AgentLoop } = await import(pathToFileURL(path.join(process.argv[2], "agent_loop.mjs")).href);

const cases = JSON.parse(await new Response(process.stdin).text());
const results = [];
for (const { messages, maxSteps, abortAfter, replies } of cases) {
  const recorded = [];
  const started = [];
  const steps = [];
  const hooks = {
    signal: new AbortController().signal,
    async modelStep(context, tools, step) {
      steps.push({ step, context: structuredClone(context), tools });
      return replies[step - 1];
    },
    async recordMessage(message, fullText) {
      recorded.push({ message, fullText });
      return message;
    },
    toolStarted(callId, name, args) {
      started.push({ callId, name, args });
    },
    shouldAbort: () => abortAfter !== null && started.length >= abortAfter,
  };
  const loop = new AgentLoop({ hooks, runner: null, maxSteps });
  const context = structuredClone(messages);
  let outcome;
  try {
    outcome = { ok: await loop.run(context) };
  } catch (error) {
    outcome = { error: { type: error.constructor.name, message: error.message } };
  }
  results.push({ recorded, started, steps, outcome, context });
}
process.stdout.write(JSON.stringify(results));
