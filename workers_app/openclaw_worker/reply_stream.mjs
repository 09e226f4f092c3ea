// Folding one OpenAI chat-completions event stream (`chat.completion.chunk` events) into a reply.
//
// The JavaScript twin of openclaw_client/agent/openai_stream.py (`StreamState`), which the project's Python
// worker uses on the same stream from the gateway's inference proxy: the same tolerances (the id or name
// repeated on every fragment, the whole call in one fragment, no `index`, every call numbered 0, arguments
// sent as an object, no id at all), the same bounds and the same failure messages, so a turn run by this
// worker fails with the same `{kind, message}` as one run by the Python worker.
//
//   const state = new StreamState();
//   for (const line of lines) { const piece = state.feedLine(line); ... }   // the text each line completed
//   state.endOfStream();  const reply = state.reply();

import { randomUUID } from "node:crypto";

// A reply past these is refused as malformed, whatever the server meant: they bound what one model
// step can make the worker hold and run.
export const MAX_TOOL_CALLS = 64;
export const MAX_ARGUMENTS_BYTES = 1024 * 1024;
export const MAX_NAME_CHARS = 128;
export const MAX_ID_CHARS = 256;

const DONE_MARKER = "[DONE]";
// OpenAI's usage keys, then the gateway's own (what its inference proxy forwards).
const USAGE_KEYS = [
  ["prompt_tokens", "completion_tokens", "total_tokens"],
  ["input", "output", "totalTokens"],
];

/** The reply cannot be used. */
export class ReplyError extends Error {}

/** The body does not follow the format (or passes the bounds above); `why` says where. */
export class MalformedReply extends ReplyError {
  constructor(why) {
    super(why);
    this.why = why;
  }
}

/** The model refused, or the server filtered its reply; the message is one line for people. */
export class RefusedReply extends ReplyError {}

/** The server sent an error instead of (or in the middle of) the reply; `body` is the object holding it. */
export class ErrorReported extends ReplyError {
  constructor(body) {
    super("the server reported an error");
    this.body = body;
  }
}

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
const isInteger = (value) => typeof value === "number" && Number.isInteger(value);

/** Whitespace runs as one space, at most `limit` characters (Python's `" ".join(text.split())[:limit]`). */
export function oneLine(text, limit) {
  return text.split(/\s+/u).filter(Boolean).join(" ").slice(0, limit);
}

/** `{input, output, totalTokens}` from OpenAI's usage (or the gateway's own keys), or null. */
export function usageOf(raw) {
  if (!isObject(raw)) return null;
  for (const [promptKey, completionKey, totalKey] of USAGE_KEYS) {
    const prompt = raw[promptKey];
    const completion = raw[completionKey];
    const total = raw[totalKey];
    if (isInteger(prompt) && isInteger(completion)) {
      return { input: prompt, output: completion, totalTokens: isInteger(total) ? total : prompt + completion };
    }
  }
  return null;
}

export class StreamState {
  constructor() {
    this.parts = [];
    this.refusal = [];
    this.finishReason = null;
    this.usage = null;
    this.responseId = null;
    this.model = null;
    this.done = false; // the event stream said [DONE]
    this.drafts = [];
    this.byIndex = new Map();
    this.calls = null;
    this.pending = [];
  }

  /** The content text so far. */
  get text() {
    return this.parts.join("");
  }

  /**
   * One line of the event stream (without its line break); returns the content text it completed.
   * A `data:` line is used as soon as the data gathered so far parses as JSON (servers differ on blank-line
   * separators); a blank line with unparseable data pending is malformed, and so is such data at the end.
   */
  feedLine(line) {
    if (!line) {
      if (this.pending.length) throw new MalformedReply("invalid JSON in stream event");
      return "";
    }
    if (line.startsWith(":")) return "";
    const colon = line.indexOf(":");
    const name = colon === -1 ? line : line.slice(0, colon);
    const value = colon === -1 ? "" : line.slice(colon + 1);
    if (name !== "data") {
      if (name === "event" || name === "id" || name === "retry") return "";
      throw new MalformedReply(`unexpected line in event stream: ${oneLine(line, 80)}`);
    }
    this.pending.push(value.startsWith(" ") ? value.slice(1) : value);
    const data = this.pending.join("\n");
    if (data.trim() === DONE_MARKER) {
      this.done = true;
      this.pending = [];
      return "";
    }
    let chunk;
    try {
      chunk = JSON.parse(data);
    } catch {
      return ""; // the rest of this event's JSON may follow on the next data line
    }
    this.pending = [];
    return this.feedChunk(chunk);
  }

  /** The body ended: an event still waiting for the rest of its JSON never got it. */
  endOfStream() {
    if (this.pending.length) throw new MalformedReply("invalid JSON in stream event");
  }

  /** One `chat.completion.chunk`; returns its content text ("" when it has none). */
  feedChunk(chunk) {
    const obj = this.note(chunk);
    const choices = obj.choices;
    if (choices === undefined || choices === null) {
      if (Object.hasOwn(obj, "usage")) return "";
      throw new MalformedReply("stream event has no choices");
    }
    if (!Array.isArray(choices)) throw new MalformedReply("stream event choices is not a list");
    if (!choices.length) return ""; // e.g. the trailing usage chunk of stream_options.include_usage
    return this.feedChoice(choices[0]);
  }

  note(obj) {
    if (!isObject(obj)) throw new MalformedReply("stream event is not a JSON object");
    if (obj.error) throw new ErrorReported(obj);
    if (typeof obj.id === "string" && obj.id && this.responseId === null) this.responseId = obj.id;
    if (typeof obj.model === "string" && obj.model) this.model = obj.model;
    const usage = usageOf(obj.usage);
    if (usage !== null) this.usage = usage;
    return obj;
  }

  feedChoice(choice) {
    if (!isObject(choice)) throw new MalformedReply("choice is not a JSON object");
    const body = choice.delta || {};
    if (!isObject(body)) throw new MalformedReply("choice delta is not a JSON object");
    const content = body.content;
    if (content !== undefined && content !== null && typeof content !== "string") {
      throw new MalformedReply("delta content is not a string");
    }
    if (typeof body.refusal === "string" && body.refusal) this.refusal.push(body.refusal);
    this.feedToolCalls(body.tool_calls);
    if (typeof choice.finish_reason === "string" && choice.finish_reason) this.finishReason = choice.finish_reason;
    if (content) {
      this.parts.push(content);
      return content;
    }
    return "";
  }

  // --- tool calls ---------------------------------------------------------------------------------

  feedToolCalls(fragments) {
    if (fragments === undefined || fragments === null) return;
    if (!Array.isArray(fragments)) throw new MalformedReply("delta tool_calls is not a list");
    for (const fragment of fragments) {
      if (!isObject(fragment)) throw new MalformedReply("delta tool call is not a JSON object");
      this.feedToolCall(fragment);
    }
  }

  feedToolCall(fragment) {
    const index = fragment.index ?? null;
    if (index !== null && !(isInteger(index) && index >= 0)) {
      throw new MalformedReply("tool call index is not a non-negative integer");
    }
    const callId = fragment.id ?? null;
    if (callId !== null && typeof callId !== "string") throw new MalformedReply("tool call id is not a string");
    if (callId && callId.length > MAX_ID_CHARS) {
      throw new MalformedReply(`tool call id longer than ${MAX_ID_CHARS} characters`);
    }
    const draft = this.draftFor(index, callId || "");
    if (callId && !draft.id) draft.id = callId;
    const fn = fragment.function;
    if (fn === undefined || fn === null) return;
    if (!isObject(fn)) throw new MalformedReply("tool call function is not a JSON object");
    this.addName(draft, fn.name);
    this.addArguments(draft, fn.arguments);
  }

  /** The call a fragment belongs to (see the header for the servers this tolerates). */
  draftFor(index, callId) {
    if (index === null) {
      const newest = this.drafts.at(-1);
      if (newest !== undefined && (!callId || !newest.id || callId === newest.id)) return newest;
      return this.newDraft();
    }
    let draft = this.byIndex.get(index);
    if (draft === undefined || (callId && draft.id && callId !== draft.id)) {
      draft = this.newDraft();
      this.byIndex.set(index, draft);
    }
    return draft;
  }

  newDraft() {
    if (this.drafts.length >= MAX_TOOL_CALLS) {
      throw new MalformedReply(`more than ${MAX_TOOL_CALLS} tool calls in one reply`);
    }
    const draft = { id: "", name: "", parts: [], size: 0 };
    this.drafts.push(draft);
    return draft;
  }

  addName(draft, name) {
    if (name === undefined || name === null || name === "") return;
    if (typeof name !== "string") throw new MalformedReply("tool call name is not a string");
    if (name.length > MAX_NAME_CHARS) throw new MalformedReply(`tool call name longer than ${MAX_NAME_CHARS} characters`);
    if (!draft.name) draft.name = name;
    else if (name !== draft.name) throw new MalformedReply(`tool call ${this.drafts.indexOf(draft)} changed its name`);
  }

  addArguments(draft, args) {
    if (args === undefined || args === null) return;
    // Some servers send the arguments as the object itself; the tools take its JSON text.
    const text = isObject(args) ? JSON.stringify(args) : args;
    if (typeof text !== "string") throw new MalformedReply("tool call arguments is not a string");
    draft.size += Buffer.byteLength(text, "utf8");
    if (draft.size > MAX_ARGUMENTS_BYTES) {
      throw new MalformedReply(`tool call arguments larger than ${MAX_ARGUMENTS_BYTES} bytes`);
    }
    draft.parts.push(text);
  }

  /** The calls, once the body ended; a call whose name never came is malformed. */
  assembled() {
    if (this.calls !== null) return this.calls;
    this.calls = this.drafts.map((draft, number) => {
      if (!draft.name) throw new MalformedReply(`tool call ${number} has no name`);
      const args = draft.parts.join("");
      return {
        // Made up once and kept: the tool message must answer the call by the same id.
        id: draft.id || `call_${randomUUID().replaceAll("-", "").slice(0, 24)}`,
        name: draft.name,
        arguments: args.trim() ? args : "{}",
      };
    });
    return this.calls;
  }

  // --- the end ------------------------------------------------------------------------------------

  /**
   * The complete reply, once the body ended cleanly. A reply is complete with text, or with tool calls when
   * the server said why it stopped (or said [DONE]): tool calls cut off before either may have lost arguments.
   */
  reply() {
    const calls = this.assembled();
    if (!this.parts.length && !calls.length) {
      if (this.refusal.length) throw new RefusedReply(`model refused: ${oneLine(this.refusal.join(""), 500)}`);
      if (this.finishReason === "content_filter") {
        throw new RefusedReply("model provider blocked the reply (content_filter)");
      }
      if (this.finishReason === null) throw new MalformedReply("stream ended without content or finish_reason");
    }
    if (calls.length && this.finishReason === null && !this.done) {
      throw new MalformedReply("stream ended before its tool calls were complete");
    }
    return {
      text: this.text,
      toolCalls: calls,
      finishReason: this.finishReason || (calls.length ? "tool_calls" : "stop"),
      usage: this.usage,
      responseId: this.responseId,
      model: this.model,
    };
  }
}
