// Runs tool calls through tools.mjs for the parity test (tests/workers_app/test_openclaw_worker_tools.py):
// reads {root, limits, cases: [{name, arguments}]} as JSON on stdin and prints, for each case in order, what the
// project's agent loop would record: {text, isError, details, fullText, request}. `arguments` is the model's raw
// JSON text, or an object. Prints {results, specs} (specs: the runner's toolSpecs()); with --specs, only the
// default toolSpecs().

import { ToolCallError, ToolRunner, errorResult, toolSpecs } from "../tools.mjs";

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

async function outcome(runner, name, raw) {
  const prepared = runner.prepare(name, raw);
  if (!prepared.ok) return { result: prepared.result, request: null };
  let request = null;
  if (prepared.call.name === "exec") {
    try {
      request = runner.execRequest(prepared.call);
    } catch (error) {
      if (!(error instanceof ToolCallError)) throw error;
      return { result: errorResult(error.message), request: null };
    }
  }
  return { result: await runner.run(prepared.call), request };
}

if (process.argv.includes("--specs")) {
  process.stdout.write(JSON.stringify(toolSpecs()));
} else {
  const { root, limits, cases } = await readStdin();
  const runner = new ToolRunner(root, limits);
  const results = [];
  for (const { name, arguments: raw } of cases) {
    const { result, request } = await outcome(runner, name, raw);
    results.push({
      text: result.content[0].text,
      isError: result.isError,
      details: result.details,
      fullText: result.fullText ?? null,
      request,
    });
  }
  process.stdout.write(JSON.stringify({ results, specs: runner.toolSpecs() }));
}
