// The agent loop: model → tool calls → results → model … until the model answers without tool calls.
//
// The JavaScript twin of openclaw_client/agent/loop.py (`AgentLoop`): the same steps, the same step limit and
// its message, and the same two shapes of every message — the OpenAI chat-completions messages the model is
// sent (`tool_calls`, `role: "tool"`) and OpenClaw's transcript messages the gateway stores (assistant content
// parts `{type: "toolCall", id, name, arguments}`, `{role: "toolResult", toolCallId, toolName, content,
// details, isError, timestamp}`), keys in the same order. What differs per host is behind the hooks:
//
//   hooks.modelStep(messages, tools, step)      → {text, toolCalls:[{id,name,arguments}], stopReason, usage, model}
//   hooks.recordMessage(message, fullText)      → the message as stored (its text is what the model is sent)
//   hooks.toolStarted(callId, name, args)
//   hooks.approveExec(callId, request)          → {allowed, reason, aborted}
//   hooks.shouldAbort()                         → whether the turn was asked to stop
//   hooks.signal                                → the turn's AbortSignal, handed to every tool run
//
// The tools are tools.mjs's `ToolRunner` (confined to the workspace): `toolSpecs()` (the schemas with the
// runner's limits), `prepare(name, argumentsJson)` → {ok, call | result}, `execRequest(call)` (throws
// tools.mjs's ToolCallError for a call to refuse), `run(call, {signal})` → a ToolResult
// `{content:[{type:"text",text}], details, isError, fullText?}`; `refusedExecResult(reason, aborted)`.

import { ToolCallError, refusedExecResult } from "./tools.mjs";

export const DEFAULT_MAX_STEPS = 24;
const EXEC_TOOL = "exec";
// What a model's tool-call arguments look like in the transcript when they are not a JSON object.
const RAW_ARGUMENTS_KEY = "raw";
const ABORTED_TEXT = "not run: the turn was aborted";

/** The model kept calling tools past the agent's step limit. */
export class StepLimitReached extends Error {
  constructor(maxSteps) {
    super(
      `agent stopped after ${maxSteps} model steps without a final answer ` +
        `(step limit ${maxSteps}); ask for a smaller task or raise the agent's step limit`,
    );
    this.maxSteps = maxSteps;
  }
}

/** The turn was asked to stop; what completed before is already recorded. */
export class LoopAborted extends Error {}

export class AgentLoop {
  constructor({ hooks, runner, maxSteps = DEFAULT_MAX_STEPS, tools }) {
    this.hooks = hooks;
    this.runner = runner;
    this.maxSteps = maxSteps;
    this.tools = tools ?? [];
  }

  /** Run the turn on `messages` (the model's context, the user's message last; extended in place). */
  async run(messages) {
    let usage = null;
    for (let step = 1; step <= this.maxSteps; step += 1) {
      const reply = await this.hooks.modelStep(messages, this.tools, step);
      usage = addUsage(usage, reply.usage);
      if (!reply.toolCalls.length) {
        return { text: reply.text, stopReason: reply.stopReason, usage, model: reply.model ?? null, steps: step };
      }
      await this.hooks.recordMessage(assistantMessage(reply), null);
      messages.push(openaiAssistantMessage(reply.text, reply.toolCalls));
      for (const [index, call] of reply.toolCalls.entries()) {
        if (this.hooks.shouldAbort()) {
          await this.abortRemaining(reply.toolCalls.slice(index), messages);
          throw new LoopAborted();
        }
        const result = await this.call(call);
        const stored = await this.hooks.recordMessage(toolResultMessage(call, result), fullTextOf(result));
        messages.push(openaiToolMessage(call.id, messageText(stored)));
        if (result.details?.aborted) {
          await this.abortRemaining(reply.toolCalls.slice(index + 1), messages);
          throw new LoopAborted();
        }
      }
    }
    throw new StepLimitReached(this.maxSteps);
  }

  /** One tool call; a malformed call, a refusal or a failure is the tool's error result, never the turn's. */
  async call(call) {
    this.hooks.toolStarted(call.id, call.name, parsedArguments(call.arguments));
    if (this.runner === null) {
      return errorResult(`tool "${call.name}" is not available: this turn has no workspace`);
    }
    const prepared = this.runner.prepare(call.name, call.arguments);
    if (!prepared.ok) return prepared.result;
    if (prepared.call.name === EXEC_TOOL) {
      let request;
      try {
        request = this.runner.execRequest(prepared.call);
      } catch (error) {
        if (error instanceof ToolCallError) return errorResult(error.message); // e.g. a workdir that is no directory
        throw error;
      }
      const approval = await this.hooks.approveExec(call.id, request);
      if (approval.aborted) return refusedExecResult(approval.reason || ABORTED_TEXT, true);
      if (!approval.allowed) return refusedExecResult(approval.reason, false);
    }
    return await this.runner.run(prepared.call, { signal: this.hooks.signal });
  }

  /** Calls the model asked for that never ran get a result saying so: the transcript stays well formed
   * (every tool call answered), and nothing that did not happen is reported as done. */
  async abortRemaining(calls, messages) {
    for (const call of calls) {
      const stored = await this.hooks.recordMessage(toolResultMessage(call, errorResult(ABORTED_TEXT, { aborted: true })), null);
      messages.push(openaiToolMessage(call.id, messageText(stored)));
    }
  }
}

// --- message shapes -------------------------------------------------------------------------------------

/** The model's arguments as shown in the transcript and events: the object, or the raw text it sent. */
export function parsedArguments(raw) {
  let value;
  try {
    value = raw.trim() ? JSON.parse(raw) : {};
  } catch {
    return { [RAW_ARGUMENTS_KEY]: raw };
  }
  return value !== null && typeof value === "object" && !Array.isArray(value) ? value : { [RAW_ARGUMENTS_KEY]: raw };
}

export function assistantMessage(reply) {
  const content = reply.text ? [{ type: "text", text: reply.text }] : [];
  for (const call of reply.toolCalls) {
    content.push({ type: "toolCall", id: call.id, name: call.name, arguments: parsedArguments(call.arguments) });
  }
  const message = { role: "assistant", content, stopReason: "toolUse", timestamp: Date.now() };
  if (reply.model) message.model = reply.model;
  if (reply.usage && Object.keys(reply.usage).length) message.usage = reply.usage;
  return message;
}

export function toolResultMessage(call, result) {
  return {
    role: "toolResult",
    toolCallId: call.id,
    toolName: call.name,
    content: [{ type: "text", text: resultText(result) }],
    details: result.details ?? {},
    isError: result.isError === true,
    timestamp: Date.now(),
  };
}

/** The text parts of a message (or a ToolResult), joined. */
export function messageText(message) {
  return (message.content ?? [])
    .filter((part) => part !== null && typeof part === "object" && part.type === "text")
    .map((part) => (typeof part.text === "string" ? part.text : ""))
    .join("");
}

const resultText = messageText;

function fullTextOf(result) {
  return typeof result.fullText === "string" ? result.fullText : null;
}

export function errorResult(text, details = {}) {
  return { content: [{ type: "text", text }], details, isError: true };
}

export function openaiAssistantMessage(text, calls) {
  return {
    role: "assistant",
    content: text,
    tool_calls: calls.map((call) => ({
      id: call.id,
      type: "function",
      function: { name: call.name, arguments: call.arguments },
    })),
  };
}

export function openaiToolMessage(callId, text) {
  return { role: "tool", tool_call_id: callId, content: text };
}

export function addUsage(total, more) {
  if (!more || !Object.keys(more).length) return total;
  const summed = { ...(total ?? {}) };
  for (const key of ["input", "output", "totalTokens"]) {
    const value = more[key];
    if (Number.isInteger(value)) summed[key] = (summed[key] ?? 0) + value;
  }
  return summed;
}
