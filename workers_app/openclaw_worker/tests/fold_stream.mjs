// Folds event streams with reply_stream.mjs for the parity test with openclaw_client/agent/openai_stream.py
// (tests/workers_app/test_openclaw_worker_js.py): reads `[[line, …], …]` as JSON on stdin and prints, per case,
// `{pieces, reply}` or `{pieces, error: {type, message}}` as JSON on stdout.

import { StreamState } from "../reply_stream.mjs";

const cases = JSON.parse(await new Response(process.stdin).text());
const folded = cases.map((lines) => {
  const state = new StreamState();
  const pieces = [];
  try {
    for (const line of lines) pieces.push(state.feedLine(line));
    state.endOfStream();
    const reply = state.reply();
    return {
      pieces,
      reply: {
        text: reply.text,
        tool_calls: reply.toolCalls,
        finish_reason: reply.finishReason,
        usage: reply.usage,
        response_id: reply.responseId,
        model: reply.model,
      },
    };
  } catch (error) {
    return { pieces, error: { type: error.constructor.name, message: error.message } };
  }
});
process.stdout.write(JSON.stringify(folded));
