// The agent's tools for the project's worker on OpenClaw's node host: a port of openclaw_client/agent/
// (tools.py, base.py, schema.py, files.py, search.py, execution.py, workspace.py) giving the same schemas,
// validation messages, result texts, details and bounds, so a turn behaves the same whichever worker runs it.
//
//   const runner = new ToolRunner(workspaceDir, {execTimeoutMs: 60000});
//   const prepared = runner.prepare(name, argumentsJson);   // {ok:false, result} for a malformed call
//   const request = runner.execRequest(prepared.call);      // exec only: what the approval shows (throws ToolCallError)
//   const result = await runner.run(prepared.call, {signal}); // {content, details, isError, fullText?}
//
// Model output is hostile input. Every path is resolved inside the workspace root; what is opened is opened
// again from the root one component at a time without following symlinks (through /proc/self/fd on Linux,
// Node having no openat), so a symlink swapped in after the check makes the call fail instead of leaving the
// workspace. Only regular files are read or written. `exec` runs `/bin/sh -c` as the leader of its own process
// group with an allowlisted environment, stdin closed, a wall-clock timeout, an output cap, and a bounded
// number of commands at once per host (ExecSlots). Standard library of Node 24 only.

import { spawn } from "node:child_process";
import { createHash, randomBytes, randomUUID } from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";

export const TOOL_NAMES = Object.freeze(["read", "write", "edit", "ls", "find", "grep", "exec"]);

const KIB = 1024;
const MIB = 1024 * KIB;

const ABORTED_TEXT = "Tool call aborted: the turn was stopped before it ran";
const NOT_RUN_TEXT = "not run: the turn was aborted";

// --- limits (base.py ToolLimits; times in milliseconds) ------------------------------------------------------

export const DEFAULT_EXEC_CONCURRENCY = 4;

const DEFAULT_LIMITS = Object.freeze({
  readMaxLines: 2000,
  readMaxBytes: 50 * KIB,
  // What the model sees of any one result; past it the text keeps its head and tail.
  resultMaxBytes: 32 * KIB,
  // How much of a truncated result is kept whole for the gateway to store as an artifact.
  artifactMaxBytes: 4 * MIB,
  execTimeoutMs: 120_000,
  execMaxTimeoutMs: 1_800_000,
  // Between SIGTERM and SIGKILL of a timed-out command's process group.
  execKillGraceMs: 2000,
  execSlotWaitMs: 30_000,
  grepLimit: 100,
  findLimit: 1000,
  lsLimit: 500,
  grepLineMaxChars: 500,
  grepMaxFileBytes: 8 * MIB,
  grepMaxScanBytes: 64 * MIB,
  // Directory entries one ls, find or grep looks at, so a hostile tree cannot stall a call.
  walkMaxEntries: 100_000,
});

/** The limits with `overrides` applied (an undefined one is left at its default) and checked as
 * ToolLimits.__post_init__ does. As the Python worker
 * does for a launch's exec timeout, a timeout above the default maximum raises the maximum unless one is given.
 * `execSlots`: `{dir, count}` (the host's bound), or null for none; by default a per-user directory of the
 * system's temporary folder with DEFAULT_EXEC_CONCURRENCY slots. */
export function toolLimits(overrides = {}) {
  const limits = { ...DEFAULT_LIMITS };
  for (const key of Object.keys(overrides)) {
    if (key === "execSlots" || overrides[key] === undefined) continue;
    if (!Object.hasOwn(DEFAULT_LIMITS, key)) throw new TypeError(`unknown tool limit ${key}`);
    limits[key] = overrides[key];
  }
  if (overrides.execMaxTimeoutMs === undefined) {
    limits.execMaxTimeoutMs = Math.max(limits.execTimeoutMs, DEFAULT_LIMITS.execMaxTimeoutMs);
  }
  for (const [key, value] of Object.entries(limits)) {
    if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
      throw new RangeError(`tool limit ${key} must be a positive number`);
    }
  }
  if (limits.execTimeoutMs > limits.execMaxTimeoutMs) {
    throw new RangeError("tool limit execTimeoutMs must not exceed execMaxTimeoutMs");
  }
  if (limits.artifactMaxBytes < limits.resultMaxBytes) {
    throw new RangeError("tool limit artifactMaxBytes must be at least resultMaxBytes");
  }
  limits.execSlots = overrides.execSlots !== undefined
    ? overrides.execSlots
    : { dir: path.join(os.tmpdir(), `openclaw-exec-slots-${process.getuid?.() ?? "user"}`), count: DEFAULT_EXEC_CONCURRENCY };
  return Object.freeze(limits);
}

// --- shared shapes and text helpers (base.py) -----------------------------------------------------------------

/** A call refused before anything is done: `message` is one line for the model. */
export class ToolCallError extends Error {
  constructor(message) {
    super(message);
    this.name = "ToolCallError";
  }
}

class CallAborted extends Error {}

function toolResult(text, isError, details = {}, fullText = null) {
  const result = { content: [{ type: "text", text }], details, isError };
  if (fullText !== null) result.fullText = fullText;
  return result;
}

/** The result the loop records for a call it did not run (tool errors, loop.py error_result). */
export function errorResult(message, details = {}) {
  return toolResult(message, true, { ...details });
}

function abortedResult(text = ABORTED_TEXT, details = {}) {
  return toolResult(text, true, { ...details, aborted: true });
}

/** The result of an exec the gateway did not allow (loop.py `_call`): aborted while waiting for the decision,
 * or denied with the gateway's reason. `refusedExecResult("", true)` is also the result of a call the turn never
 * reached because it was aborted. */
export function refusedExecResult(reason, aborted) {
  if (aborted) return errorResult(reason || NOT_RUN_TEXT, { aborted: true });
  return errorResult(reason, { denied: true });
}

function resultText(result) {
  return result.content[0].text;
}

function sizeText(size) {
  for (const [unit, name] of [
    [MIB, "MiB"],
    [KIB, "KiB"],
  ]) {
    if (size >= unit && size % unit === 0) return `${size / unit} ${name}`;
  }
  return `${size} bytes`;
}

/** Python's `format(number, "g")`: six significant digits, trailing zeros dropped. */
function formatG(number) {
  if (!Number.isFinite(number)) return Number.isNaN(number) ? "nan" : number > 0 ? "inf" : "-inf";
  if (number === 0) return "0";
  const [mantissa, exponentText] = number.toExponential(5).split("e");
  const exponent = Number(exponentText);
  if (exponent >= -4 && exponent < 6) {
    return stripZeros(number.toFixed(5 - exponent));
  }
  const digits = String(Math.abs(exponent)).padStart(2, "0");
  return `${stripZeros(mantissa)}e${exponent < 0 ? "-" : "+"}${digits}`;
}

function stripZeros(text) {
  return text.includes(".") ? text.replace(/0+$/, "").replace(/\.$/, "") : text;
}

/** Length in code points (Python's len of a str). */
function codePointLength(text) {
  let count = 0;
  for (let index = 0; index < text.length; index++) {
    const unit = text.charCodeAt(index);
    if (unit >= 0xd800 && unit <= 0xdbff && index + 1 < text.length) {
      const next = text.charCodeAt(index + 1);
      if (next >= 0xdc00 && next <= 0xdfff) index++;
    }
    count++;
  }
  return count;
}

/** The first `count` code points of `text` (Python's text[:count]). */
function codePointSlice(text, count) {
  let index = 0;
  for (let seen = 0; seen < count && index < text.length; seen++) {
    const unit = text.charCodeAt(index);
    index += unit >= 0xd800 && unit <= 0xdbff && index + 1 < text.length ? 2 : 1;
  }
  return text.slice(0, index);
}

/** Orders strings as their UTF-8 bytes (code points), as Python sorts str and bytes. */
function compareCodePoints(a, b) {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** A model-supplied string inside a message: quoted, escaped, and short. */
function quoted(value, maxChars = 200) {
  const text = String(value);
  const shown = codePointLength(text) <= maxChars ? text : codePointSlice(text, maxChars) + "…";
  // A lone surrogate (a model can send one as JSON "\ud800") is spelled out, as Python's backslashreplace does.
  return JSON.stringify(shown.replace(LONE_SURROGATE, (unit) => `\\u${unit.charCodeAt(0).toString(16)}`));
}

function omittedMarker(omittedBytes) {
  return `\n…[${omittedBytes} bytes omitted]…\n`;
}

/** The first `maxBytes` of UTF-8 `data`, without a character cut in two (Python's decode "ignore" at the cut). */
function utf8Head(data, maxBytes) {
  let end = Math.min(maxBytes, data.length);
  if (end < data.length) {
    let start = end;
    while (start > 0 && (data[start] & 0xc0) === 0x80) start--;
    if (start < end || (data[start] & 0xc0) === 0x80) {
      end = start;
    }
  }
  return data.subarray(0, end).toString("utf8");
}

function utf8Tail(data, fromIndex) {
  let start = fromIndex;
  while (start < data.length && (data[start] & 0xc0) === 0x80) start++;
  return data.subarray(start).toString("utf8");
}

/** `text` cut to about `maxBytes` UTF-8 bytes: its first and last halves around a marker (base.py head_and_tail). */
function headAndTail(text, maxBytes) {
  const data = Buffer.from(text, "utf8");
  if (data.length <= maxBytes) return [text, false];
  const head = utf8Head(data, Math.floor(maxBytes / 2));
  const tail = utf8Tail(data, data.length - (maxBytes - Math.floor(maxBytes / 2)));
  const omitted = data.length - Buffer.byteLength(head, "utf8") - Buffer.byteLength(tail, "utf8");
  return [head + omittedMarker(omitted) + tail, true];
}

function bounded(text, maxBytes) {
  const data = Buffer.from(text, "utf8");
  if (data.length <= maxBytes) return text;
  return utf8Head(data, maxBytes) + `\n…[${data.length - maxBytes} more bytes not kept]`;
}

function cappedResult(result, limits) {
  const [text, cut] = headAndTail(resultText(result), limits.resultMaxBytes);
  if (!cut) return result;
  return toolResult(
    text,
    result.isError,
    { ...result.details, truncated: true },
    bounded(resultText(result), limits.artifactMaxBytes),
  );
}

/** Defines an own property even for a key such as "__proto__" (a hostile key must not reach a prototype). */
function setOwn(target, key, value) {
  Object.defineProperty(target, key, { value, writable: true, enumerable: true, configurable: true });
}

// --- schemas (schema.py) ------------------------------------------------------------------------------------

const MAX_PATH_CHARS = 4096;
const MAX_CONTENT_CHARS = 8 * MIB;
const MAX_COMMAND_CHARS = 64 * KIB;
const MAX_PATTERN_CHARS = 4 * KIB;
const MAX_EDITS = 50;
const MAX_ENV_ENTRIES = 64;
const MAX_ENV_VALUE_CHARS = 32 * KIB;
const MAX_PAGE_LIMIT = 10_000;
const MAX_GREP_LIMIT = 1000;
const MAX_GREP_CONTEXT = 20;
const MAX_RAW_ARGUMENTS_CHARS = 32 * MIB;
// Python's json refuses deeper nesting (its C recursion limit); JSON.parse would take it.
const MAX_JSON_DEPTH = 9998;

const stringSchema = (description, maxLength) => ({ type: "string", description, maxLength });
const integerSchema = (description, minimum, maximum) =>
  maximum === undefined
    ? { type: "integer", description, minimum }
    : { type: "integer", description, minimum, maximum };
const objectSchema = (properties, required = []) => ({
  type: "object",
  properties,
  required,
  additionalProperties: false,
});
const pathSchema = (description) => stringSchema(description, MAX_PATH_CHARS);

/** Each tool's [description, parameters] with the defaults and maxima of `limits` (schema.py tool_schemas). */
function toolSchemas(limits) {
  const execTimeout = formatG(limits.execTimeoutMs / 1000);
  return {
    read: [
      `Read a text file in the workspace. Returns at most ${limits.readMaxLines} lines or ` +
        `${sizeText(limits.readMaxBytes)}, whichever comes first; when more remains, the text ends with ` +
        "a note giving the offset to continue from.",
      objectSchema(
        {
          path: pathSchema("File path, relative to the workspace root."),
          offset: integerSchema("Line number to start reading from (1-based; default 1).", 1),
          limit: integerSchema("Maximum number of lines to read.", 1),
        },
        ["path"],
      ),
    ],
    write: [
      "Create or overwrite a file in the workspace with the given content. Missing parent directories " +
        "are created.",
      objectSchema(
        {
          path: pathSchema("File path, relative to the workspace root."),
          content: stringSchema("The file's complete new content.", MAX_CONTENT_CHARS),
        },
        ["path", "content"],
      ),
    ],
    edit: [
      "Edit a file by exact text replacement. Each oldText must occur exactly once in the original file " +
        "(include enough surrounding lines to make it unique) and edits must not overlap. All edits are " +
        "applied together, or none is.",
      objectSchema(
        {
          path: pathSchema("File path, relative to the workspace root."),
          edits: {
            type: "array",
            description: "Replacements, each matched against the original file.",
            minItems: 1,
            maxItems: MAX_EDITS,
            items: objectSchema(
              {
                oldText: stringSchema("Exact text to replace.", MAX_CONTENT_CHARS),
                newText: stringSchema("Text to put in its place.", MAX_CONTENT_CHARS),
              },
              ["oldText", "newText"],
            ),
          },
        },
        ["path", "edits"],
      ),
    ],
    ls: [
      "List a directory: entries sorted by name, directories marked with a trailing '/', dotfiles " +
        `included, ${limits.lsLimit} per page by default. When more remain, the text ends with the ` +
        "'after' value for the next page.",
      objectSchema({
        path: pathSchema("Directory, relative to the workspace root (default: the root)."),
        limit: integerSchema(`Maximum entries to return (default ${limits.lsLimit}).`, 1, MAX_PAGE_LIMIT),
        after: stringSchema("Return entries after this name (from the previous page).", MAX_PATH_CHARS),
      }),
    ],
    find: [
      "Find files and directories by glob pattern. A pattern without '/' matches names at any depth " +
        "('*.py'); one with '/' matches the path relative to the search directory ('src/**/*.ts'). Returns " +
        "sorted paths relative to the search directory (directories end with '/'); .git is skipped.",
      objectSchema(
        {
          pattern: stringSchema("Glob pattern: * ? [abc] and ** (any number of directories).", MAX_PATTERN_CHARS),
          path: pathSchema("Directory to search in (default: the workspace root)."),
          limit: integerSchema(`Maximum results (default ${limits.findLimit}).`, 1, MAX_PAGE_LIMIT),
        },
        ["pattern"],
      ),
    ],
    grep: [
      "Search file contents for a regular expression (Python syntax) or a literal string. Returns " +
        "'path:line: text' for each matching line, path relative to the directory searched ('path-line- text' " +
        "for context lines); .git, binary " +
        `files and files over ${sizeText(limits.grepMaxFileBytes)} are skipped.`,
      objectSchema(
        {
          pattern: stringSchema("Regular expression, or literal text with literal=true.", MAX_PATTERN_CHARS),
          path: pathSchema("File or directory to search (default: the workspace root)."),
          glob: stringSchema("Only search files matching this glob, e.g. '*.py' or 'src/**/*.ts'.", MAX_PATTERN_CHARS),
          ignoreCase: { type: "boolean", description: "Match case-insensitively." },
          literal: { type: "boolean", description: "Treat pattern as literal text, not a regex." },
          context: integerSchema("Lines of context before and after each match.", 0, MAX_GREP_CONTEXT),
          limit: integerSchema(`Maximum matches (default ${limits.grepLimit}).`, 1, MAX_GREP_LIMIT),
        },
        ["pattern"],
      ),
    ],
    exec: [
      "Run a shell command (/bin/sh -c) in the workspace. stdin is empty; stdout and stderr are combined. " +
        `Output over ${sizeText(limits.resultMaxBytes)} keeps its start and end. The command is stopped ` +
        `after timeoutSeconds (default ${execTimeout}).`,
      objectSchema(
        {
          command: stringSchema("The shell command.", MAX_COMMAND_CHARS),
          workdir: pathSchema("Working directory, relative to the workspace root (default: the root)."),
          env: {
            type: "object",
            description: "Extra environment variables (PATH and loader variables are refused).",
            additionalProperties: { type: "string", maxLength: MAX_ENV_VALUE_CHARS },
            maxProperties: MAX_ENV_ENTRIES,
          },
          timeoutSeconds: {
            type: "number",
            description: `Timeout in seconds (default ${execTimeout}).`,
            minimum: 1,
            maximum: limits.execMaxTimeoutMs / 1000,
          },
        },
        ["command"],
      ),
    ],
  };
}

/** OpenAI chat-completions `tools` entries for `names`, in that order (schema.py tool_specs); `limits` as
 * toolLimits() takes them. */
export function toolSpecs(names = TOOL_NAMES, limits = {}) {
  const schemas = toolSchemas(toolLimits(limits));
  return names.map((name) => {
    if (!Object.hasOwn(schemas, name)) throw new RangeError(`unknown tool ${JSON.stringify(name)}`);
    const [description, parameters] = schemas[name];
    return { type: "function", function: { name, description, parameters } };
  });
}

// --- validation (schema.py validated) -------------------------------------------------------------------------

class SchemaViolation extends Error {}

function jsonType(value) {
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return "a boolean";
  if (typeof value === "number") return "a number";
  if (typeof value === "string") return "a string";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "object") return "an object";
  return typeof value;
}

const label = (where) => (where ? `"${where}"` : "arguments");
const joinKey = (where, key) => (where ? `${where}.${key}` : key);

function validated(schema, value, where = "") {
  const kind = schema.type;
  const name = label(where);
  if (kind === "integer") {
    if (typeof value !== "number" || !Number.isInteger(value)) {
      throw new SchemaViolation(`${name} must be an integer, not ${jsonType(value)}`);
    }
  } else if (kind === "number") {
    if (typeof value !== "number" || !Number.isFinite(value)) {
      throw new SchemaViolation(`${name} must be a finite number, not ${jsonType(value)}`);
    }
  } else if (kind === "string") {
    if (typeof value !== "string") throw new SchemaViolation(`${name} must be a string, not ${jsonType(value)}`);
    if (schema.maxLength !== undefined && value.length > schema.maxLength && codePointLength(value) > schema.maxLength) {
      throw new SchemaViolation(`${name} is too long (at most ${schema.maxLength} characters)`);
    }
    if (!value.isWellFormed()) {
      // JSON can spell one ("\ud800"); no file, command or environment can hold it.
      throw new SchemaViolation(`${name} is not valid Unicode text (it holds a lone surrogate)`);
    }
    return value;
  } else if (kind === "boolean") {
    if (typeof value !== "boolean") throw new SchemaViolation(`${name} must be a boolean, not ${jsonType(value)}`);
    return value;
  } else if (kind === "array") {
    return validatedArray(schema, value, where);
  } else {
    return validatedObject(schema, value, where);
  }
  if (schema.minimum !== undefined && value < schema.minimum) {
    throw new SchemaViolation(`${name} must be at least ${formatG(schema.minimum)}`);
  }
  if (schema.maximum !== undefined && value > schema.maximum) {
    throw new SchemaViolation(`${name} must be at most ${formatG(schema.maximum)}`);
  }
  return value;
}

function validatedArray(schema, value, where) {
  const name = label(where);
  if (!Array.isArray(value)) throw new SchemaViolation(`${name} must be an array, not ${jsonType(value)}`);
  if (value.length < (schema.minItems ?? 0)) {
    throw new SchemaViolation(`${name} must have at least ${schema.minItems} item(s)`);
  }
  if (schema.maxItems !== undefined && value.length > schema.maxItems) {
    throw new SchemaViolation(`${name} must have at most ${schema.maxItems} items`);
  }
  return value.map((item, index) => validated(schema.items, item, `${where}[${index}]`));
}

function validatedObject(schema, value, where) {
  const name = label(where);
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new SchemaViolation(`${name} must be an object, not ${jsonType(value)}`);
  }
  const properties = schema.properties ?? {};
  const extra = schema.additionalProperties ?? true;
  const keys = Object.keys(value);
  if (extra === false) {
    for (const key of keys) {
      if (!Object.hasOwn(properties, key)) {
        const allowed = Object.keys(properties).join(", ") || "none";
        throw new SchemaViolation(`unknown key ${quoted(key)} in ${name} (allowed: ${allowed})`);
      }
    }
  }
  for (const key of schema.required ?? []) {
    if (!Object.hasOwn(value, key)) throw new SchemaViolation(`"${joinKey(where, key)}" is required`);
  }
  if (schema.maxProperties !== undefined && keys.length > schema.maxProperties) {
    throw new SchemaViolation(`${name} must have at most ${schema.maxProperties} entries`);
  }
  const result = {};
  for (const key of keys) {
    const child = Object.hasOwn(properties, key) ? properties[key] : typeof extra === "object" ? extra : null;
    setOwn(result, key, child !== null ? validated(child, value[key], joinKey(where, key)) : value[key]);
  }
  return result;
}

function decodedArguments(name, raw) {
  let value = raw;
  if (typeof raw === "string") {
    if (raw.length > MAX_RAW_ARGUMENTS_CHARS) {
      throw new ToolCallError(`invalid arguments for ${name}: more than ${MAX_RAW_ARGUMENTS_CHARS} characters`);
    }
    try {
      // Models send "" for a call without arguments.
      value = PYTHON_BLANK.test(raw) ? {} : JSON.parse(raw);
    } catch (error) {
      if (jsonDepth(raw) > MAX_JSON_DEPTH) throw new ToolCallError(`invalid arguments for ${name}: nested too deeply`);
      const problem = pythonJsonProblem(raw) ?? error.message;
      throw new ToolCallError(`invalid arguments for ${name}: not valid JSON (${problem})`);
    }
    if (jsonDepth(raw) > MAX_JSON_DEPTH) throw new ToolCallError(`invalid arguments for ${name}: nested too deeply`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new ToolCallError(`invalid arguments for ${name}: expected a JSON object, not ${jsonType(value)}`);
  }
  return value;
}

// What Python's str.strip() removes: a text of only these is no arguments at all.
const PYTHON_BLANK = /^[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;

// --- Python's json error messages -------------------------------------------------------------------------------
// A model reads why its arguments are not JSON; it is told in the words of Python's json module (its C scanner),
// as the Python worker tells it. The text is scanned again only after JSON.parse refused it.

class JsonStop {
  constructor(position) {
    this.position = position;
  }
}

class JsonFailure {
  constructor(message, position) {
    this.message = message;
    this.position = position;
  }
}

class JsonConstant {
  constructor(constant) {
    this.constant = constant;
  }
}

const isJsonWhitespace = (char) => char === " " || char === "\t" || char === "\n" || char === "\r";
const isAsciiDigit = (char) => char !== undefined && char >= "0" && char <= "9";
const HEX_DIGIT = /^[0-9a-fA-F]$/;

function skipJsonWhitespace(text, index) {
  while (index < text.length && isJsonWhitespace(text[index])) index++;
  return index;
}

function scanJsonValue(text, index) {
  if (index >= text.length) throw new JsonStop(index);
  const char = text[index];
  if (char === '"') return scanJsonString(text, index + 1);
  if (char === "{") return scanJsonObject(text, index + 1);
  if (char === "[") return scanJsonArray(text, index + 1);
  for (const [literal, first] of [
    ["null", "n"],
    ["true", "t"],
    ["false", "f"],
  ]) {
    if (char === first && text.startsWith(literal, index)) return index + literal.length;
  }
  for (const constant of ["NaN", "Infinity", "-Infinity"]) {
    if (text.startsWith(constant, index)) throw new JsonConstant(constant);
  }
  return scanJsonNumber(text, index);
}

function scanJsonNumber(text, start) {
  const last = text.length - 1;
  let index = start;
  if (text[index] === "-") {
    index++;
    if (index > last) throw new JsonStop(start);
  }
  if (text[index] >= "1" && text[index] <= "9") {
    index++;
    while (index <= last && isAsciiDigit(text[index])) index++;
  } else if (text[index] === "0") {
    index++;
  } else {
    throw new JsonStop(start);
  }
  if (index < last && text[index] === "." && isAsciiDigit(text[index + 1])) {
    index += 2;
    while (index <= last && isAsciiDigit(text[index])) index++;
  }
  if (index < last && (text[index] === "e" || text[index] === "E")) {
    const exponentStart = index;
    index++;
    if (index < last && (text[index] === "-" || text[index] === "+")) index++;
    while (index <= last && isAsciiDigit(text[index])) index++;
    if (!isAsciiDigit(text[index - 1])) index = exponentStart;
  }
  return index;
}

function scanJsonString(text, end) {
  const length = text.length;
  const begin = end - 1;
  for (;;) {
    let next = end;
    let char;
    for (; next < length; next++) {
      char = text[next];
      if (char === '"' || char === "\\") break;
      if (char.charCodeAt(0) <= 0x1f) throw new JsonFailure("Invalid control character at", next);
    }
    if (next >= length) throw new JsonFailure("Unterminated string starting at", begin);
    next++;
    if (char === '"') return next;
    if (next === length) throw new JsonFailure("Unterminated string starting at", begin);
    const escape = text[next];
    if (escape !== "u") {
      end = next + 1;
      if (!'"\\/bfnrt'.includes(escape)) throw new JsonFailure("Invalid \\escape", end - 2);
      continue;
    }
    next++;
    end = next + 4;
    if (end >= length) throw new JsonFailure("Invalid \\uXXXX escape", next - 1);
    const high = text.slice(next, end);
    if (![...high].every((digit) => HEX_DIGIT.test(digit))) throw new JsonFailure("Invalid \\uXXXX escape", end - 5);
    const code = Number.parseInt(high, 16);
    if (code >= 0xd800 && code <= 0xdbff && end + 6 < length && text[end] === "\\" && text[end + 1] === "u") {
      const low = text.slice(end + 2, end + 6);
      if (![...low].every((digit) => HEX_DIGIT.test(digit))) throw new JsonFailure("Invalid \\uXXXX escape", end + 1);
      const lowCode = Number.parseInt(low, 16);
      if (lowCode >= 0xdc00 && lowCode <= 0xdfff) end += 6;
    }
  }
}

/** Scans an object's or an array's members from `index` (after its opening bracket) to its `close`; returns
 * the index after it. `member` scans one member and returns the index after it. */
function scanJsonMembers(text, index, close, kind, member) {
  const last = text.length - 1;
  index = skipJsonWhitespace(text, index);
  if (index > last || text[index] !== close) {
    for (;;) {
      index = skipJsonWhitespace(text, member(index));
      if (index <= last && text[index] === close) break;
      if (index > last || text[index] !== ",") throw new JsonFailure("Expecting ',' delimiter", index);
      const comma = index;
      index = skipJsonWhitespace(text, index + 1);
      if (index <= last && text[index] === close) {
        throw new JsonFailure(`Illegal trailing comma before end of ${kind}`, comma);
      }
    }
  }
  return index + 1;
}

function scanJsonObject(text, index) {
  return scanJsonMembers(text, index, "}", "object", (at) => {
    if (at >= text.length || text[at] !== '"') {
      throw new JsonFailure("Expecting property name enclosed in double quotes", at);
    }
    const colon = skipJsonWhitespace(text, scanJsonString(text, at + 1));
    if (colon >= text.length || text[colon] !== ":") throw new JsonFailure("Expecting ':' delimiter", colon);
    return scanJsonValue(text, skipJsonWhitespace(text, colon + 1));
  });
}

function scanJsonArray(text, index) {
  return scanJsonMembers(text, index, "]", "array", (at) => scanJsonValue(text, at));
}

/** Why Python's json.loads refuses `text`, in its words ("Expecting value at line 1 column 5"), or null when this
 * scan finds nothing (or nests too deeply for it): the caller then says it with JSON.parse's words. */
function pythonJsonProblem(text) {
  try {
    if (text.startsWith("\ufeff")) throw new JsonFailure("Unexpected UTF-8 BOM (decode using utf-8-sig)", 0);
    const end = skipJsonWhitespace(text, scanJsonValue(text, skipJsonWhitespace(text, 0)));
    if (end !== text.length) throw new JsonFailure("Extra data", end);
    return null;
  } catch (error) {
    if (error instanceof JsonConstant) return `${error.constant} is not a JSON number`;
    if (error instanceof JsonStop) return jsonLocated(text, "Expecting value", error.position);
    if (error instanceof JsonFailure) return jsonLocated(text, error.message, error.position);
    if (error instanceof RangeError) return null;
    throw error;
  }
}

/** "<message> at line L column C", counted in code points as Python counts. */
function jsonLocated(text, message, position) {
  const before = text.slice(0, position);
  const line = before.split("\n").length;
  const column = codePointLength(before.slice(before.lastIndexOf("\n") + 1)) + 1;
  return `${message} at line ${line} column ${column}`;
}

/** How deeply arrays and objects nest in the (valid) JSON text `raw`. */
function jsonDepth(raw) {
  let depth = 0;
  let deepest = 0;
  for (let index = 0; index < raw.length; index++) {
    const char = raw.charCodeAt(index);
    if (char === 0x22) {
      // Skip a string: its escapes included.
      for (index++; index < raw.length && raw.charCodeAt(index) !== 0x22; index++) {
        if (raw.charCodeAt(index) === 0x5c) index++;
      }
    } else if (char === 0x5b || char === 0x7b) {
      depth++;
      if (depth > deepest) deepest = depth;
    } else if (char === 0x5d || char === 0x7d) {
      depth--;
    }
  }
  return deepest;
}

function checkedArguments(name, argumentsObject, schema) {
  try {
    return validated(schema, argumentsObject);
  } catch (error) {
    if (error instanceof SchemaViolation) throw new ToolCallError(`invalid arguments for ${name}: ${error.message}`);
    throw error;
  }
}

// The legacy single-edit form some models were trained on: {path, oldText, newText}.
const LEGACY_EDIT_KEYS = ["oldText", "newText"];

function legacyEdit(argumentsObject) {
  if (Object.hasOwn(argumentsObject, "edits") || !LEGACY_EDIT_KEYS.some((key) => Object.hasOwn(argumentsObject, key))) {
    return argumentsObject;
  }
  const rest = {};
  for (const key of Object.keys(argumentsObject)) {
    if (!LEGACY_EDIT_KEYS.includes(key)) setOwn(rest, key, argumentsObject[key]);
  }
  const edit = {};
  for (const key of LEGACY_EDIT_KEYS) {
    if (Object.hasOwn(argumentsObject, key)) edit[key] = argumentsObject[key];
  }
  setOwn(rest, "edits", [edit]);
  return rest;
}

// --- the workspace (workspace.py) ----------------------------------------------------------------------------

const MAX_PATH_BYTES = 4096;
// Directories deeper than this below a walk's start are not entered (each level holds an open descriptor).
const MAX_WALK_DEPTH = 64;
const SKIPPED_DIRECTORY = ".git";
const C = fs.constants;
const DIRECTORY_FLAGS = C.O_RDONLY | C.O_DIRECTORY | C.O_NOFOLLOW | C.O_NONBLOCK;
const READ_FLAGS = C.O_RDONLY | C.O_NOFOLLOW | C.O_NONBLOCK;
const CREATE_FLAGS = C.O_WRONLY | C.O_CREAT | C.O_EXCL | C.O_NOFOLLOW;
// Linux names an open directory by /proc/self/fd/<fd>: opening "<that>/<name>" is openat(fd, name).
const PROC_FD = fs.existsSync("/proc/self/fd") ? "/proc/self/fd" : null;

/** Python's posixpath.normpath. */
function normpath(text) {
  if (!text) return ".";
  const initial = text.startsWith("/") ? (text.startsWith("//") && !text.startsWith("///") ? 2 : 1) : 0;
  const parts = [];
  for (const part of text.split("/")) {
    if (!part || part === ".") continue;
    if (part !== ".." || (!initial && !parts.length) || (parts.length && parts.at(-1) === "..")) parts.push(part);
    else if (parts.length) parts.pop();
  }
  const joined = "/".repeat(initial) + parts.join("/");
  return joined || ".";
}

/** Python 3.13's os.path.realpath(strict=False): symlinks of the existing components followed, the rest kept. */
function realpathLoose(filename) {
  const rest = filename.split("/").reverse();
  let partCount = rest.length;
  let current = filename.startsWith("/") ? "/" : process.cwd();
  const seen = new Map();
  const RESOLVED = Symbol("resolved");
  while (partCount) {
    const name = rest.pop();
    if (name === RESOLVED) {
      seen.set(rest.pop(), current);
      continue;
    }
    partCount--;
    if (!name || name === ".") continue;
    if (name === "..") {
      current = current.slice(0, current.lastIndexOf("/")) || "/";
      continue;
    }
    const next = current === "/" ? current + name : `${current}/${name}`;
    let target;
    try {
      if (!fs.lstatSync(next).isSymbolicLink()) {
        current = next;
        continue;
      }
      if (seen.has(next)) {
        const known = seen.get(next);
        // An unresolved entry is a symlink loop: kept as it is.
        current = known ?? next;
        continue;
      }
      target = fs.readlinkSync(next);
    } catch {
      current = next;
      continue;
    }
    if (target.startsWith("/")) current = "/";
    seen.set(next, null);
    rest.push(next, RESOLVED);
    const targetParts = target.split("/").reverse();
    rest.push(...targetParts);
    partCount += targetParts.length;
  }
  return current;
}

function isErrno(error, ...codes) {
  return error !== null && typeof error === "object" && codes.includes(error.code);
}

class Workspace {
  constructor(root) {
    const resolved = fs.realpathSync(root);
    if (!fs.statSync(resolved).isDirectory()) throw new Error("workspace root is not a directory");
    this.root = resolved;
    this.prefix = resolved === "/" ? "/" : `${resolved}/`;
  }

  /** The real path `requested` names (relative to the root, or absolute inside it); throws ToolCallError when it
   * is malformed or resolves outside the workspace. */
  resolve(requested, what = "path") {
    if (requested.includes("\0")) throw new ToolCallError(`${what} contains a NUL byte`);
    if (!requested.isWellFormed()) throw new ToolCallError(`${what} is not valid Unicode text`);
    if (Buffer.byteLength(requested, "utf8") > MAX_PATH_BYTES) {
      throw new ToolCallError(`${what} is longer than ${MAX_PATH_BYTES} bytes`);
    }
    const candidate = requested.startsWith("/") ? requested : this.prefix + requested;
    const real = realpathLoose(candidate);
    if (this.contains(real)) return real;
    if (this.contains(normpath(candidate))) {
      throw new ToolCallError(`${what} ${quoted(requested)} leads outside the workspace through a symbolic link`);
    }
    throw new ToolCallError(`${what} ${quoted(requested)} is outside the workspace`);
  }

  contains(candidate) {
    return candidate === this.root || candidate.startsWith(this.prefix);
  }

  display(real) {
    return real === this.root ? "." : real.slice(this.prefix.length);
  }

  components(real) {
    return real === this.root ? [] : real.slice(this.prefix.length).split("/");
  }

  // --- opening ------------------------------------------------------------------------------------------

  /** The path naming entry `name` (a string or the bytes of a name) of the open directory `handle`. */
  at(handle, name) {
    const base = PROC_FD ? `${PROC_FD}/${handle.fd}/` : `${handle.path}/`;
    return typeof name === "string" ? base + name : Buffer.concat([Buffer.from(base), name]);
  }

  /** An open handle {fd, path} of the directory `real` (resolved, inside the root), opened from the root without
   * following any symlink; with `create`, missing directories are made on the way. */
  openDirectory(real, create = false) {
    let handle = { fd: fs.openSync(this.root, DIRECTORY_FLAGS), path: this.root };
    const parts = this.components(real);
    try {
      for (let depth = 1; depth <= parts.length; depth++) {
        const part = parts[depth - 1];
        let child;
        try {
          child = fs.openSync(this.at(handle, part), DIRECTORY_FLAGS);
        } catch (error) {
          if (isErrno(error, "ENOENT")) {
            if (!create) throw error;
            try {
              fs.mkdirSync(this.at(handle, part), 0o777);
            } catch (made) {
              if (!isErrno(made, "EEXIST")) throw made;
            }
            child = fs.openSync(this.at(handle, part), DIRECTORY_FLAGS);
          } else {
            throw this.refusal(error, real, handle, part, depth === parts.length);
          }
        }
        fs.closeSync(handle.fd);
        handle = { fd: child, path: `${handle.path}/${part}` };
      }
    } catch (error) {
      fs.closeSync(handle.fd);
      throw error;
    }
    return handle;
  }

  /** What to tell the model when opening `name` (a component of `real`) without following links failed: `real`
   * has no symlink in it, so one found now was put there since (ELOOP, or ENOTDIR when a directory was asked for). */
  refusal(error, real, parent, name, last) {
    if (isErrno(error, "ELOOP", "ENOTDIR")) {
      let swapped = false;
      try {
        swapped = fs.lstatSync(this.at(parent, name)).isSymbolicLink();
      } catch {
        swapped = false;
      }
      if (swapped || error.code === "ELOOP") {
        return new ToolCallError(`${this.display(real)} changed while in use (a symbolic link appeared); try again`);
      }
      if (last) return new ToolCallError(`${this.display(real)} is not a directory`);
      return new ToolCallError(`${this.display(real)}: a component of the path is not a directory`);
    }
    return error;
  }

  /** A read-only descriptor of the regular file `real`; anything else is refused. */
  openRegularFile(real) {
    if (real === this.root) throw new ToolCallError(". is a directory, not a file");
    const parent = this.openDirectory(path.dirname(real));
    const name = path.basename(real);
    let fd;
    try {
      this.requireRegular(fs.lstatSync(this.at(parent, name)), real);
      try {
        fd = fs.openSync(this.at(parent, name), READ_FLAGS);
      } catch (error) {
        throw this.refusal(error, real, parent, name, true);
      }
    } finally {
      fs.closeSync(parent.fd);
    }
    try {
      // The entry may have been replaced between the stat and the open.
      this.requireRegular(fs.fstatSync(fd), real);
    } catch (error) {
      fs.closeSync(fd);
      throw error;
    }
    return fd;
  }

  requireRegular(status, real) {
    if (status.isFile()) return;
    if (status.isDirectory()) throw new ToolCallError(`${this.display(real)} is a directory, not a file`);
    if (status.isSymbolicLink()) {
      throw new ToolCallError(`${this.display(real)} changed while in use (a symbolic link appeared); try again`);
    }
    const kind = status.isFIFO()
      ? "a FIFO"
      : status.isSocket()
        ? "a socket"
        : status.isCharacterDevice() || status.isBlockDevice()
          ? "a device file"
          : "not a regular file";
    throw new ToolCallError(`${this.display(real)} is ${kind}; only regular files can be read or written`);
  }

  isDirectory(real) {
    try {
      fs.closeSync(this.openDirectory(real).fd);
    } catch {
      return false;
    }
    return true;
  }

  // --- writing ------------------------------------------------------------------------------------------

  /** Replace (or create) the regular file `real` with `data` at once: a temporary file in the same directory,
   * renamed over it. An existing file's permission bits are kept. Nothing changes when `signal` aborts first. */
  writeAtomically(real, data, signal) {
    if (real === this.root) throw new ToolCallError(". is a directory, not a file");
    if (signal?.aborted) throw new CallAborted();
    const parent = this.openDirectory(path.dirname(real), true);
    const name = path.basename(real);
    const temporary = `.${randomUUID().replaceAll("-", "")}.openclaw-tmp`;
    try {
      let mode = null;
      try {
        const existing = fs.lstatSync(this.at(parent, name));
        this.requireRegular(existing, real);
        mode = existing.mode & 0o7777;
      } catch (error) {
        if (!isErrno(error, "ENOENT")) throw error;
      }
      const fd = fs.openSync(this.at(parent, temporary), CREATE_FLAGS, mode === null ? 0o666 : 0o600);
      try {
        let written = 0;
        while (written < data.length) written += fs.writeSync(fd, data, written);
        if (mode !== null) fs.fchmodSync(fd, mode);
      } finally {
        fs.closeSync(fd);
      }
      if (signal?.aborted) throw new CallAborted();
      // rename() replaces the directory entry itself: a symlink swapped in meanwhile is not followed.
      fs.renameSync(this.at(parent, temporary), this.at(parent, name));
    } catch (error) {
      try {
        fs.unlinkSync(this.at(parent, temporary));
      } catch {
        // It was never made, or was renamed.
      }
      throw error;
    } finally {
      fs.closeSync(parent.fd);
    }
  }

  // --- listing and walking ------------------------------------------------------------------------------

  /** The entries of an open directory sorted by name (bytewise), and whether all were read (at most
   * `maxEntries` are). Each entry: {name (bytes), text, isDir, isFile}. */
  entries(handle, maxEntries) {
    const found = [];
    let complete = true;
    const directory = fs.opendirSync(this.at(handle, ""), { encoding: "buffer" });
    try {
      for (let item = directory.readSync(); item !== null; item = directory.readSync()) {
        if (found.length >= maxEntries) {
          complete = false;
          break;
        }
        found.push({
          name: item.name,
          text: item.name.toString("utf8"),
          isDir: item.isDirectory(),
          isFile: item.isFile(),
        });
      }
    } finally {
      directory.closeSync();
    }
    found.sort((a, b) => Buffer.compare(a.name, b.name));
    return [found, complete];
  }

  /** Every entry below the directory `start`, depth first in name order, without following symlinks and without
   * entering .git: {path (text, relative), entry, directory (the open handle holding it, valid until the walk
   * moves on)}. Once `budget` is spent no further directory is read; stops when `signal` aborts. */
  *walk(start, budget, signal) {
    const top = this.openDirectory(start);
    const stack = [{ handle: top, prefix: "", pending: [][Symbol.iterator]() }];
    try {
      const [entries, complete] = this.entries(top, budget.remainingEntries());
      budget.spendEntries(entries.length, complete);
      stack[0].pending = entries[Symbol.iterator]();
      while (stack.length && !signal?.aborted) {
        const { handle, prefix, pending } = stack.at(-1);
        const next = pending.next();
        if (next.done) {
          fs.closeSync(stack.pop().handle.fd);
          continue;
        }
        const entry = next.value;
        if (entry.isDir && entry.text === SKIPPED_DIRECTORY) continue;
        const relative = prefix + entry.text;
        yield { path: relative, entry, directory: handle };
        if (!entry.isDir || budget.exhausted) continue;
        if (stack.length > MAX_WALK_DEPTH) {
          budget.tooDeep = true;
          continue;
        }
        let child;
        try {
          child = { fd: fs.openSync(this.at(handle, entry.name), DIRECTORY_FLAGS), path: `${handle.path}/${entry.text}` };
        } catch {
          // Replaced, removed or unreadable since it was listed: not part of this walk.
          continue;
        }
        let childEntries;
        let childComplete;
        try {
          [childEntries, childComplete] = this.entries(child, budget.remainingEntries());
        } catch {
          fs.closeSync(child.fd);
          continue;
        }
        budget.spendEntries(childEntries.length, childComplete);
        stack.push({ handle: child, prefix: `${relative}/`, pending: childEntries[Symbol.iterator]() });
      }
    } finally {
      for (const { handle } of stack) fs.closeSync(handle.fd);
    }
  }

  /** A read-only descriptor of a walked regular file, or null when it is no longer one. */
  openEntryFile(item) {
    let fd;
    try {
      fd = fs.openSync(this.at(item.directory, item.entry.name), READ_FLAGS);
    } catch {
      return null;
    }
    if (!fs.fstatSync(fd).isFile()) {
      fs.closeSync(fd);
      return null;
    }
    return fd;
  }
}

/** How many directory entries one walk may look at; records why a walk stopped short. */
class WalkBudget {
  constructor(maxEntries) {
    this.maxEntries = maxEntries;
    this.seen = 0;
    this.exhausted = false;
    this.tooDeep = false;
  }

  remainingEntries() {
    return Math.max(this.maxEntries - this.seen, 0);
  }

  spendEntries(count, complete) {
    this.seen += count;
    if (!complete) this.exhausted = true;
  }
}

// --- the file tools (files.py) --------------------------------------------------------------------------------

// A file whose first bytes hold a NUL is binary (as git and grep decide).
const BINARY_SNIFF_BYTES = 8 * KIB;
// `edit` reads the whole file and writes it back.
const MAX_EDIT_FILE_BYTES = 8 * MIB;
const READ_CHUNK = 64 * KIB;
const READ_BUFFER_MAX = 1 * MIB;

const isBinary = (head) => head.subarray(0, BINARY_SNIFF_BYTES).includes(0);

/** Up to `count` bytes from `fd` at `position` (fewer only at the end of the file); memory grows with what is
 * read, not with `count` (grep and edit ask for up to 8 MiB of every file). */
function readBytes(fd, count, position = null, expected = READ_BUFFER_MAX) {
  const chunks = [];
  let total = 0;
  while (total < count) {
    // The first read sized to what is expected (a file's size, and one byte to see its end).
    const wanted = chunks.length ? READ_BUFFER_MAX : Math.max(Math.min(expected, READ_BUFFER_MAX), 1);
    const buffer = Buffer.allocUnsafe(Math.min(count - total, wanted));
    const read = fs.readSync(fd, buffer, 0, buffer.length, position === null ? null : position + total);
    if (read === 0) break;
    chunks.push(buffer.subarray(0, read));
    total += read;
  }
  return chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, total);
}

/** Python's BufferedReader.readline(limit) over a descriptor. */
class LineReader {
  constructor(fd) {
    this.fd = fd;
    this.buffer = Buffer.alloc(0);
    this.ended = false;
  }

  readline(limit) {
    for (;;) {
      const newline = this.buffer.subarray(0, limit).indexOf(0x0a);
      if (newline !== -1) return this.take(newline + 1);
      if (this.buffer.length >= limit) return this.take(limit);
      if (this.ended) return this.take(this.buffer.length);
      const more = readBytes(this.fd, READ_CHUNK);
      if (more.length === 0) this.ended = true;
      this.buffer = this.buffer.length ? Buffer.concat([this.buffer, more]) : more;
    }
  }

  take(count) {
    const piece = this.buffer.subarray(0, count);
    this.buffer = this.buffer.subarray(count);
    return piece;
  }
}

/** [the first `maxLineBytes` of each line, newline included, and the line's whole length]. */
function* boundedLines(reader, maxLineBytes) {
  for (let piece = reader.readline(maxLineBytes + 1); piece.length; piece = reader.readline(maxLineBytes + 1)) {
    if (piece.at(-1) === 0x0a || piece.length <= maxLineBytes) {
      yield [piece, piece.length];
      continue;
    }
    let length = piece.length;
    let rest = piece;
    while (rest.at(-1) !== 0x0a) {
      rest = reader.readline(READ_CHUNK);
      if (!rest.length) break;
      length += rest.length;
    }
    yield [piece.subarray(0, maxLineBytes), length];
  }
}

function withNote(text, note) {
  return (text.endsWith("\n") || !text ? text : `${text}\n`) + "\n" + note;
}

function continueNote(offset, nextLine, cap) {
  if (cap === null) return `[More lines in file. Use offset=${nextLine} to continue.]`;
  return `[Showing lines ${offset}-${nextLine - 1} (${cap}). Use offset=${nextLine} to continue.]`;
}

function readFile(workspace, limits, args) {
  const real = workspace.resolve(args.path);
  const shown = workspace.display(real);
  const offset = args.offset ?? 1;
  const maxLines = Math.min(args.limit ?? limits.readMaxLines, limits.readMaxLines);
  const cap = sizeText(limits.readMaxBytes);
  const fd = workspace.openRegularFile(real);
  const shownLines = [];
  let number = 0;
  let note = "";
  try {
    if (isBinary(readBytes(fd, BINARY_SNIFF_BYTES, 0))) {
      throw new ToolCallError(`${shown} is a binary file; read shows text files only`);
    }
    let used = 0;
    for (const [piece, length] of boundedLines(new LineReader(fd), limits.readMaxBytes)) {
      number++;
      if (number < offset) continue;
      if (shownLines.length >= maxLines) {
        const capped = maxLines === limits.readMaxLines;
        note = continueNote(offset, number, capped ? `read limit ${maxLines} lines` : null);
        break;
      }
      if (used + length > limits.readMaxBytes) {
        if (shownLines.length) {
          note = continueNote(offset, number, `read limit ${cap}`);
        } else {
          shownLines.push(piece);
          note =
            `[Line ${number} is ${length} bytes, over the ${cap} read limit; showing its first ` +
            `${cap}. Use exec (e.g. head -c or cut) for the rest of it, or offset=${number + 1} ` +
            "to go past it.]";
        }
        break;
      }
      shownLines.push(piece);
      used += length;
    }
  } finally {
    fs.closeSync(fd);
  }
  if (offset > Math.max(number, 1)) {
    throw new ToolCallError(`offset ${offset} is beyond the end of ${shown} (${number} lines)`);
  }
  const text = Buffer.concat(shownLines).toString("utf8");
  const nextOffset = note ? offset + shownLines.length : null;
  const details = { path: shown, offset, lines: shownLines.length, nextOffset };
  if (number === 0) return toolResult("(empty file)", false, details);
  return toolResult(note ? withNote(text, note) : text, false, details);
}

function writeFile(workspace, limits, args, signal) {
  const real = workspace.resolve(args.path);
  const data = Buffer.from(args.content, "utf8");
  workspace.writeAtomically(real, data, signal);
  const shown = workspace.display(real);
  return toolResult(`Wrote ${data.length} bytes to ${shown}`, false, { path: shown, bytes: data.length });
}

/** Where `needle` starts in `text` (overlapping matches included), up to `stopAfter` places. */
function occurrences(text, needle, stopAfter = 1000) {
  const found = [];
  let start = text.indexOf(needle);
  while (start !== -1 && found.length < stopAfter) {
    found.push(start);
    start = text.indexOf(needle, start + 1);
  }
  return found;
}

const STRICT_UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Exact replacements, each located in the original content; all apply or nothing is written. */
function editFile(workspace, limits, args, signal) {
  const real = workspace.resolve(args.path);
  const shown = workspace.display(real);
  const fd = workspace.openRegularFile(real);
  let data;
  try {
    data = readBytes(fd, MAX_EDIT_FILE_BYTES + 1);
  } finally {
    fs.closeSync(fd);
  }
  if (data.length > MAX_EDIT_FILE_BYTES) {
    throw new ToolCallError(`${shown} is larger than ${sizeText(MAX_EDIT_FILE_BYTES)}; use write or exec to change it`);
  }
  if (isBinary(data)) throw new ToolCallError(`${shown} is a binary file; edit changes text files only`);
  let original;
  try {
    original = STRICT_UTF8.decode(data);
  } catch {
    throw new ToolCallError(`${shown} is not valid UTF-8 text; edit would corrupt it`);
  }
  const spans = args.edits.map((edit, index) => {
    const places = occurrences(original, edit.oldText);
    if (!places.length) {
      throw new ToolCallError(
        `Could not find edits[${index}].oldText in ${shown}. It must match exactly, including whitespace and line breaks.`,
      );
    }
    if (places.length > 1) {
      throw new ToolCallError(
        `Found ${places.length} occurrences of edits[${index}] in ${shown}. ` +
          "Each oldText must be unique. Please provide more context to make it unique.",
      );
    }
    return [places[0], places[0] + edit.oldText.length, index];
  });
  spans.sort((a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2]);
  for (let index = 1; index < spans.length; index++) {
    const [, end, first] = spans[index - 1];
    const [start, , second] = spans[index];
    if (start < end) {
      const [low, high] = [first, second].sort((a, b) => a - b);
      throw new ToolCallError(`edits[${low}] and edits[${high}] overlap in ${shown}; merge them into one edit`);
    }
  }
  let updated = original;
  for (const [start, end, index] of [...spans].reverse()) {
    updated = updated.slice(0, start) + args.edits[index].newText + updated.slice(end);
  }
  if (updated === original) {
    throw new ToolCallError(`No changes made to ${shown}: the replacements produce identical content`);
  }
  workspace.writeAtomically(real, Buffer.from(updated, "utf8"), signal);
  const firstChangedLine = original.slice(0, spans[0][0]).split("\n").length;
  return toolResult(`Successfully replaced ${spans.length} block(s) in ${shown}.`, false, {
    path: shown,
    replacements: spans.length,
    firstChangedLine,
  });
}

function listDirectory(workspace, limits, args) {
  const real = workspace.resolve(args.path ?? ".");
  const shown = workspace.display(real);
  const limit = args.limit ?? limits.lsLimit;
  const handle = workspace.openDirectory(real);
  let entries;
  let complete;
  try {
    [entries, complete] = workspace.entries(handle, limits.walkMaxEntries);
  } finally {
    fs.closeSync(handle.fd);
  }
  const after = args.after;
  if (after) {
    const cursor = Buffer.from(after, "utf8");
    entries = entries.filter((entry) => Buffer.compare(entry.name, cursor) > 0);
  }
  const page = entries.slice(0, limit);
  const lines = page.map((entry) => entry.text + (entry.isDir ? "/" : ""));
  const nextAfter = entries.length > limit ? page.at(-1).text : null;
  const notes = [];
  if (nextAfter !== null) {
    notes.push(`[${entries.length - limit} more entries. Use after=${JSON.stringify(nextAfter)} to continue.]`);
  }
  if (!complete) {
    notes.push(
      `[${shown} has more than ${limits.walkMaxEntries} entries; only the first ${limits.walkMaxEntries} ` +
        "read are listed, in name order. Use find or exec to look further.]",
    );
  }
  const text = lines.length ? lines.join("\n") : after ? "(no more entries)" : "(empty directory)";
  const details = { path: shown, entries: page.length, nextAfter, complete };
  return toolResult(notes.length ? withNote(text, notes.join("\n")) : text, false, details);
}

// --- the search tools (search.py) -----------------------------------------------------------------------------

const REGEX_SPECIALS = /[\\^$.*+?()[\]{}|/]/g;
const escapeRegex = (text) => text.replace(REGEX_SPECIALS, "\\$&");

/** A glob as a regular expression: * and ? stay within one path segment, ** spans directories (**\/ also matches
 * none), [abc] / [!abc] are classes and {a,b} alternatives. */
function globRegex(pattern) {
  try {
    return new RegExp(`^(?:${globBody(pattern)})$`, "su");
  } catch (error) {
    throw new ToolCallError(`invalid glob ${quoted(pattern)}: ${regexProblem(error)}`);
  }
}

function globBody(pattern) {
  const out = [];
  let index = 0;
  while (index < pattern.length) {
    const char = pattern[index];
    if (pattern.startsWith("**/", index)) {
      out.push("(?:.*/)?");
      index += 3;
      continue;
    }
    if (pattern.startsWith("**", index)) {
      out.push(".*");
      index += 2;
      continue;
    }
    let close;
    if (char === "*") {
      out.push("[^/]*");
    } else if (char === "?") {
      out.push("[^/]");
    } else if (char === "[" && (close = pattern.indexOf("]", index + 2)) !== -1) {
      let body = pattern.slice(index + 1, close);
      const negated = body[0] === "!" || body[0] === "^";
      body = negated ? body.slice(1) : body;
      // A leading "]" is literal in Python's classes; JavaScript needs it escaped.
      const escaped = body.replaceAll("\\", "\\\\").replace(/^\]/, "\\]");
      out.push(`[${negated ? "^/" : ""}${escaped}]`);
      index = close + 1;
      continue;
    } else if (char === "{" && (close = pattern.indexOf("}", index)) !== -1) {
      const alternatives = pattern.slice(index + 1, close).split(",");
      out.push(`(?:${alternatives.map(globBody).join("|")})`);
      index = close + 1;
      continue;
    } else {
      out.push(escapeRegex(char));
    }
    index++;
  }
  return out.join("");
}

function globMatcher(pattern) {
  const stripped = pattern.startsWith("./") ? pattern.slice(2) : pattern;
  return { regex: globRegex(stripped), wholePath: stripped.includes("/") };
}

function regexProblem(error) {
  return String(error.message).replace(/^Invalid regular expression: \/.*\/[a-z]*: /s, "");
}

/** A Python `re` pattern (as `re.compile(pattern)` reads a str pattern) as a JavaScript RegExp with the u flag:
 * \w \d \s \b match Unicode as Python's do (JavaScript's are ASCII), escapes Python allows and JavaScript's u
 * mode refuses become the characters they stand for, a "{" that is not a quantifier is a literal, named groups
 * and references, \A \Z, comments and leading global flags are translated. What JavaScript cannot express
 * (verbose mode, atomic groups, conditionals, \N{...}) is refused as an invalid expression. Lines are matched
 * one at a time, so "." gets the s flag (Python's "." only excludes "\n", which no line holds). */
function pythonRegex(pattern, ignoreCase) {
  const flags = new Set(["s", "u"]);
  if (ignoreCase) flags.add("i");
  let source = pattern;
  let ascii = false;
  let verbose = false;
  const leading = /^\(\?([aiLmsux]+)\)/.exec(source);
  if (leading) {
    for (const flag of leading[1]) {
      if (flag === "x") verbose = true;
      if (flag === "L") throw new SyntaxError("bad inline flags: cannot use 'L' flag with a str pattern");
      if (flag === "a") ascii = true;
      // "m" changes nothing here: a line holds no "\n" (and JavaScript's m would also split at U+2028).
      if (flag === "i") flags.add(flag);
    }
    source = source.slice(leading[0].length);
  }
  const classes = ascii ? ASCII_CLASSES : UNICODE_CLASSES;
  const word = classes.w;
  const groups = new Set();
  // Capturing groups opened so far: a numbered reference must name one of them (Python refuses the others).
  let opened = 0;
  let out = "";
  let index = 0;
  const fail = (message) => {
    throw new SyntaxError(message);
  };
  while (index < source.length) {
    const char = source[index];
    if (verbose && /\s/.test(char)) {
      index++;
    } else if (verbose && char === "#") {
      const newline = source.indexOf("\n", index);
      index = newline === -1 ? source.length : newline + 1;
    } else if (char === "\\") {
      const reference = /^\\([1-9]\d?)/.exec(source.slice(index));
      if (reference && Number(reference[1]) > opened) fail("invalid group reference");
      const [text, used] = pythonEscape(source, index, classes, false, fail);
      if (text === "\\b") out += `(?:(?<=${word})(?!${word})|(?<!${word})(?=${word}))`;
      else if (text === "\\B") out += `(?:(?<=${word})(?=${word})|(?<!${word})(?!${word}))`;
      else out += text;
      index += used;
    } else if (char === "[") {
      const [text, used] = pythonClass(source, index, classes, fail);
      out += text;
      index += used;
    } else if (char === "{") {
      const quantifier = /^\{(\d*)(?:(,)(\d*))?\}/.exec(source.slice(index));
      if (quantifier && source[index + 1] !== "}") {
        const [whole, low, comma, high] = quantifier;
        out += comma ? `{${low || "0"},${high}}` : whole;
        index += whole.length;
      } else {
        out += "\\{";
        index++;
      }
    } else if (char === "}" || char === "]") {
      out += `\\${char}`;
      index++;
    } else if (char === "(" && source[index + 1] === "?") {
      const rest = source.slice(index + 2);
      if (rest.startsWith("P<")) {
        const close = rest.indexOf(">");
        if (close === -1) fail("missing >, unterminated name");
        groups.add(rest.slice(2, close));
        opened++;
        out += `(?<${rest.slice(2, close)}>`;
        index += 2 + close + 1;
      } else if (rest.startsWith("P=")) {
        const close = rest.indexOf(")");
        if (close === -1) fail("missing ), unterminated name");
        const group = rest.slice(2, close);
        if (!groups.has(group)) fail(`unknown group name '${group}'`);
        out += `\\k<${group}>`;
        index += 2 + close + 1;
      } else if (rest.startsWith("#")) {
        const close = rest.indexOf(")");
        if (close === -1) fail("missing ), unterminated comment");
        index += 2 + close + 1;
      } else if (/^(?:[:=!]|<[=!])/.test(rest) || /^[imsx-]+:/.test(rest)) {
        if (/^[a-z-]*x[a-z-]*:/.test(rest)) fail("verbose patterns ((?x)) are not supported here");
        out += "(?";
        index += 2;
      } else {
        fail(`unknown or unsupported extension ?${rest[0] ?? ""}`);
      }
    } else {
      if (char === "(") opened++;
      out += char;
      index++;
    }
  }
  return new RegExp(out, [...flags].join(""));
}

const UNICODE_CLASSES = {
  w: "[\\p{L}\\p{N}_]",
  W: "[^\\p{L}\\p{N}_]",
  d: "\\p{Nd}",
  D: "\\P{Nd}",
  s: "[\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]",
  S: "[^\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]",
  // Inside a class: the members, without brackets.
  inner: { w: "\\p{L}\\p{N}_", d: "\\p{Nd}", D: "\\P{Nd}", s: "\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000" },
};

const ASCII_CLASSES = {
  w: "[A-Za-z0-9_]",
  W: "[^A-Za-z0-9_]",
  d: "[0-9]",
  D: "[^0-9]",
  s: "[ \\t\\n\\r\\f\\v]",
  S: "[^ \\t\\n\\r\\f\\v]",
  inner: { w: "A-Za-z0-9_", d: "0-9", s: " \\t\\n\\r\\f\\v" },
};

// What a backslash may stand before in JavaScript's u mode outside a class (inside, "-" too).
const SYNTAX_CHARACTERS = "^$\\.*+?()[]{}|/";
const SIMPLE_ESCAPES = { a: "\\x07", f: "\\f", n: "\\n", r: "\\r", t: "\\t", v: "\\v" };

/** The escape at `index` of a Python pattern as JavaScript u-mode text, and how many characters it used. */
function pythonEscape(source, index, classes, inClass, fail) {
  const next = source[index + 1];
  if (next === undefined) fail("bad escape (end of pattern)");
  if (Object.hasOwn(SIMPLE_ESCAPES, next)) return [SIMPLE_ESCAPES[next], 2];
  if ("wWdDsS".includes(next)) {
    if (!inClass) return [classes[next], 2];
    return [classes.inner[next], 2];
  }
  if (next === "b") return [inClass ? "\\x08" : "\\b", 2];
  if (next === "B" && !inClass) return ["\\B", 2];
  if (next === "A" && !inClass) return ["(?<![\\s\\S])", 2];
  if (next === "Z" && !inClass) return ["(?![\\s\\S])", 2];
  if (next === "x") {
    const hex = /^[0-9a-fA-F]{2}/.exec(source.slice(index + 2));
    if (!hex) fail("incomplete escape \\x");
    return [`\\x${hex[0]}`, 4];
  }
  if (next === "u" || next === "U") {
    const size = next === "u" ? 4 : 8;
    const hex = source.slice(index + 2, index + 2 + size);
    if (!new RegExp(`^[0-9a-fA-F]{${size}}$`).test(hex)) fail(`incomplete escape \\${next}`);
    const code = Number.parseInt(hex, 16);
    if (code > 0x10ffff) fail(`bad escape \\${next}${hex}`);
    return [`\\u{${code.toString(16)}}`, 2 + size];
  }
  if (next >= "0" && next <= "9") {
    if (inClass) fail("octal escapes are not supported here");
    const digits = /^\d{1,2}/.exec(source.slice(index + 1))[0];
    if (digits[0] === "0") fail("octal escapes are not supported here");
    return [`\\${digits}`, 1 + digits.length];
  }
  if (/[A-Za-z]/.test(next)) fail(`bad escape \\${next}`);
  // Any other character escaped stands for itself.
  if (SYNTAX_CHARACTERS.includes(next) || (inClass && next === "-")) return [`\\${next}`, 2];
  const codePoint = source.codePointAt(index + 1);
  return [String.fromCodePoint(codePoint), 1 + (codePoint > 0xffff ? 2 : 1)];
}

/** The class starting at `index` ("[") of a Python pattern as JavaScript u-mode text, and its length. A class
 * holding \W, \S (or \D in ASCII mode), which a u-mode class cannot hold, becomes an alternation around it. */
function pythonClass(source, index, classes, fail) {
  let members = "";
  const outsideSets = [];
  let at = index + 1;
  const negated = source[at] === "^";
  if (negated) at++;
  // A "]" first in a class is a member.
  if (source[at] === "]") {
    members += "\\]";
    at++;
  }
  while (at < source.length && source[at] !== "]") {
    const char = source[at];
    if (char === "\\") {
      const letter = source[at + 1];
      const isSet = letter !== undefined && "wWdDsS".includes(letter);
      if (isSet && !Object.hasOwn(classes.inner, letter)) {
        outsideSets.push(classes[letter]);
        at += 2;
      } else {
        const [text, used] = pythonEscape(source, at, classes, true, fail);
        members += text;
        at += used;
      }
      if (isSet && source[at] === "-" && source[at + 1] !== "]" && at + 1 < source.length) {
        fail(`bad character range ${source.slice(at - 2, at + 2)}`);
      }
    } else if (char === "[") {
      members += "\\[";
      at++;
    } else {
      const codePoint = source.codePointAt(at);
      members += String.fromCodePoint(codePoint);
      at += codePoint > 0xffff ? 2 : 1;
    }
  }
  if (at >= source.length) fail("unterminated character set");
  const used = at + 1 - index;
  if (!outsideSets.length) return [`[${negated ? "^" : ""}${members}]`, used];
  const parts = members ? [`[${members}]`, ...outsideSets] : outsideSets;
  if (!negated) return [`(?:${parts.join("|")})`, used];
  return [`(?:${parts.map((part) => `(?!${part})`).join("")}[\\s\\S])`, used];
}

function walkNotes(budget, limits) {
  const notes = [];
  if (budget.exhausted) {
    notes.push(`[Stopped after looking at ${limits.walkMaxEntries} directory entries; search a narrower path.]`);
  }
  if (budget.tooDeep) notes.push("[Some directories are nested too deeply and were not searched.]");
  return notes;
}

const joined = (lines, notes) => lines.join("\n") + (notes.length ? `\n\n${notes.join("\n")}` : "");

function findFiles(workspace, limits, args, signal) {
  const start = workspace.resolve(args.path ?? ".");
  const shown = workspace.display(start);
  const limit = args.limit ?? limits.findLimit;
  const { regex, wholePath } = globMatcher(args.pattern);
  const budget = new WalkBudget(limits.walkMaxEntries);
  const found = [];
  for (const item of workspace.walk(start, budget, signal)) {
    if (regex.test(wholePath ? item.path : item.entry.text)) found.push(item.path + (item.entry.isDir ? "/" : ""));
  }
  if (signal?.aborted) return abortedResult();
  found.sort(compareCodePoints);
  const notes = [];
  if (found.length > limit) {
    const more = limit < MAX_PAGE_LIMIT ? ` Use limit=${Math.min(limit * 2, MAX_PAGE_LIMIT)} for more,` : "";
    notes.push(`[${found.length - limit} more results not shown.${more} or refine the pattern.]`);
  }
  notes.push(...walkNotes(budget, limits));
  const details = { path: shown, matches: Math.min(found.length, limit), truncated: found.length > limit };
  if (!found.length) {
    return toolResult(joined([`No files found matching ${quoted(args.pattern)}`], notes), false, details);
  }
  return toolResult(joined(found.slice(0, limit), notes), false, details);
}

/** What one grep call has read and found so far. */
class GrepScan {
  constructor(limits, regex, context, limit) {
    Object.assign(this, { limits, regex, context, limit });
    this.lines = [];
    this.matches = 0;
    this.bytesScanned = 0;
    this.filesScanned = 0;
    this.tooLarge = 0;
    this.outOfBytes = false;
  }

  get full() {
    return this.matches >= this.limit || this.outOfBytes;
  }

  scan(fd, shown) {
    let data;
    try {
      const size = fs.fstatSync(fd).size;
      if (size > this.limits.grepMaxFileBytes) {
        this.tooLarge++;
        return;
      }
      if (this.bytesScanned + size > this.limits.grepMaxScanBytes) {
        this.outOfBytes = true;
        return;
      }
      data = readBytes(fd, this.limits.grepMaxFileBytes + 1, null, size + 1);
    } finally {
      fs.closeSync(fd);
    }
    this.bytesScanned += data.length;
    this.filesScanned++;
    if (data.length > this.limits.grepMaxFileBytes) {
      // It grew after the size was read.
      this.tooLarge++;
      return;
    }
    if (isBinary(data)) return;
    this.collect(data.toString("utf8").split("\n"), shown);
  }

  collect(rawLines, shown) {
    const lines = rawLines.map((line) => (line.endsWith("\r") ? line.slice(0, -1) : line));
    if (lines.length && lines.at(-1) === "") lines.pop();
    const hits = [];
    for (let number = 0; number < lines.length; number++) {
      this.regex.lastIndex = 0;
      if (this.regex.test(lines[number])) {
        hits.push(number);
        if (this.matches + hits.length >= this.limit) break;
      }
    }
    if (!hits.length) return;
    this.matches += hits.length;
    const selected = new Set();
    for (const hit of hits) {
      for (let near = Math.max(hit - this.context, 0); near < Math.min(hit + this.context + 1, lines.length); near++) {
        selected.add(near);
      }
    }
    const hitSet = new Set(hits);
    let previous = null;
    for (const number of [...selected].sort((a, b) => a - b)) {
      if (this.context && previous !== null && number > previous + 1) this.lines.push("--");
      const separator = hitSet.has(number) ? ":" : "-";
      this.lines.push(`${shown}${separator}${number + 1}${separator} ${this.cut(lines[number])}`);
      previous = number;
    }
  }

  cut(line) {
    const limit = this.limits.grepLineMaxChars;
    const length = line.length <= limit ? line.length : codePointLength(line);
    return length <= limit ? line : `${codePointSlice(line, limit)}… [${length - limit} more characters]`;
  }
}

function grepFiles(workspace, limits, args, signal) {
  const pattern = args.pattern;
  let regex;
  try {
    regex = args.literal ? new RegExp(escapeRegex(pattern), args.ignoreCase ? "sui" : "su") : pythonRegex(pattern, args.ignoreCase);
  } catch (error) {
    throw new ToolCallError(`invalid regular expression ${quoted(pattern)}: ${regexProblem(error)}`);
  }
  const fileFilter = Object.hasOwn(args, "glob") ? globMatcher(args.glob) : null;
  const limit = args.limit ?? limits.grepLimit;
  const scan = new GrepScan(limits, regex, args.context ?? 0, limit);
  const start = workspace.resolve(args.path ?? ".");
  const budget = new WalkBudget(limits.walkMaxEntries);
  if (workspace.isDirectory(start)) {
    for (const item of workspace.walk(start, budget, signal)) {
      if (scan.full) break;
      if (item.entry.isFile && wanted(item, fileFilter)) {
        const fd = workspace.openEntryFile(item);
        if (fd !== null) scan.scan(fd, item.path);
      }
    }
  } else {
    scan.scan(workspace.openRegularFile(start), workspace.display(start));
  }
  if (signal?.aborted) return abortedResult();
  const notes = [];
  if (scan.matches >= limit) {
    const more = limit < MAX_GREP_LIMIT ? ` Use limit=${Math.min(limit * 2, MAX_GREP_LIMIT)} for more,` : "";
    notes.push(`[${limit} matches limit reached.${more} or refine the pattern.]`);
  }
  if (scan.tooLarge) notes.push(`[${scan.tooLarge} file(s) over ${sizeText(limits.grepMaxFileBytes)} skipped.]`);
  if (scan.outOfBytes) {
    notes.push(`[Stopped after reading ${sizeText(limits.grepMaxScanBytes)}; search a narrower path or glob.]`);
  }
  notes.push(...walkNotes(budget, limits));
  const details = {
    path: workspace.display(start),
    matches: scan.matches,
    filesScanned: scan.filesScanned,
    bytesScanned: scan.bytesScanned,
    truncated: notes.length > 0,
  };
  return toolResult(joined(scan.lines.length ? scan.lines : ["No matches found"], notes), false, details);
}

function wanted(item, fileFilter) {
  if (fileFilter === null) return true;
  return fileFilter.regex.test(fileFilter.wholePath ? item.path : item.entry.text);
}

// --- exec (execution.py) --------------------------------------------------------------------------------------

const SHELL = "/bin/sh";
const INHERITED_ENV = ["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL"];
const DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin";
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
// Keys that decide which program runs or what code it loads before the command's own: an approval shows the
// command and the env keys, and these would make the approved command something else.
const REFUSED_ENV_KEYS = new Set(["PATH", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS", "PS4", "GCONV_PATH"]);
const REFUSED_ENV_PREFIXES = ["LD_", "DYLD_"];
const DRAIN_AFTER_EXIT_MS = 1000;
const SLOT_POLL_INTERVAL_MS = 100;

/** Why the model's env entry key=value is refused, or null. */
export function envProblem(key, value) {
  if (!ENV_NAME.test(key)) return `env key ${quoted(key)} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)`;
  const upper = key.toUpperCase();
  if (REFUSED_ENV_KEYS.has(upper) || REFUSED_ENV_PREFIXES.some((prefix) => upper.startsWith(prefix))) {
    return `env key ${quoted(key)} may not be set (it changes which programs run or what they load)`;
  }
  if (value.includes("\0")) return `env value of ${quoted(key)} contains a NUL byte`;
  return null;
}

/** The command's environment: the allowlisted keys of `source`, TERM=dumb and the (checked) overrides. Nothing
 * else of this process's environment (the node's token, a credential) reaches the command. */
export function commandEnv(overrides, source = process.env) {
  const env = Object.create(null);
  for (const key of INHERITED_ENV) if (Object.hasOwn(source, key)) env[key] = source[key];
  env.PATH ??= DEFAULT_PATH;
  env.TERM = "dumb";
  for (const key of Object.keys(overrides)) setOwn(env, key, overrides[key]);
  return env;
}

/** A command's output, bounded: the start (up to the artifact cap) and the last half of the model's share. */
class OutputCapture {
  constructor(textMaxBytes, artifactMaxBytes) {
    this.textMaxBytes = textMaxBytes;
    this.artifactMaxBytes = artifactMaxBytes;
    this.tailBytes = textMaxBytes - Math.floor(textMaxBytes / 2);
    this.kept = [];
    this.keptBytes = 0;
    this.tail = Buffer.alloc(0);
    this.total = 0;
  }

  feed(data) {
    this.total += data.length;
    const room = this.artifactMaxBytes - this.keptBytes;
    if (room > 0) {
      const piece = data.subarray(0, room);
      this.kept.push(piece);
      this.keptBytes += piece.length;
    }
    this.tail = Buffer.concat([this.tail, data.subarray(Math.max(data.length - this.tailBytes, 0))]);
    if (this.tail.length > 2 * this.tailBytes) this.tail = this.tail.subarray(this.tail.length - this.tailBytes);
  }

  get truncated() {
    return this.total > this.textMaxBytes;
  }

  keptData() {
    return Buffer.concat(this.kept);
  }

  text() {
    const kept = this.keptData();
    if (!this.truncated) return kept.toString("utf8");
    const head = kept.subarray(0, Math.floor(this.textMaxBytes / 2));
    const tail = this.tail.subarray(Math.max(this.tail.length - this.tailBytes, 0));
    return head.toString("utf8") + omittedMarker(this.total - head.length - tail.length) + tail.toString("utf8");
  }

  fullText() {
    if (!this.truncated) return null;
    let text = this.keptData().toString("utf8");
    if (this.total > this.keptBytes) text += `\n…[${this.total - this.keptBytes} more bytes not kept]`;
    return text;
  }
}

// strerror texts of the errors a file tool or a spawn can meet (Node has no strerror).
const STRERROR = {
  ENOENT: "No such file or directory",
  EACCES: "Permission denied",
  EPERM: "Operation not permitted",
  ENOTDIR: "Not a directory",
  EISDIR: "Is a directory",
  ELOOP: "Too many levels of symbolic links",
  ENAMETOOLONG: "File name too long",
  ENOSPC: "No space left on device",
  EDQUOT: "Disk quota exceeded",
  EROFS: "Read-only file system",
  EEXIST: "File exists",
  EXDEV: "Invalid cross-device link",
  EMFILE: "Too many open files",
  ENFILE: "Too many open files in system",
  EIO: "Input/output error",
  EBUSY: "Device or resource busy",
  ENOTEMPTY: "Directory not empty",
  EINVAL: "Invalid argument",
  EFBIG: "File too large",
  ENOMEM: "Cannot allocate memory",
  EAGAIN: "Resource temporarily unavailable",
  E2BIG: "Argument list too long",
  ENXIO: "No such device or address",
  ETXTBSY: "Text file busy",
};

const strerror = (error) => STRERROR[error.code] ?? String(error.code ?? "error");

function signalGroup(pgid, signalName) {
  try {
    process.kill(-pgid, signalName);
  } catch {
    // The group is gone already.
  }
}

const O_CLOEXEC_FLAG = 0o2000000;

/** The descriptors above 2 this process holds without close-on-exec: what it inherited from whoever started it
 * (Node opens its own close-on-exec). Python's Popen(close_fds=True) closes them in the command; Node cannot, so
 * the command gets /dev/null in their place. Linux only (/proc/self/fdinfo). */
function inheritedDescriptors() {
  if (!PROC_FD) return [];
  const found = [];
  for (const name of fs.readdirSync(PROC_FD)) {
    const fd = Number(name);
    if (!(fd > 2)) continue;
    try {
      const flags = /^flags:\s*([0-7]+)$/m.exec(fs.readFileSync(`/proc/self/fdinfo/${fd}`, "utf8"));
      if (flags && (Number.parseInt(flags[1], 8) & O_CLOEXEC_FLAG) === 0) found.push(fd);
    } catch {
      // Closed since the listing (the listing's own descriptor).
    }
  }
  return found;
}

/** The command's stdio: stdin closed, stdout and stderr to `writer`, inherited descriptors masked by /dev/null. */
function commandStdio(writer, devNull) {
  const stdio = ["ignore", writer, writer];
  for (const fd of inheritedDescriptors()) {
    while (stdio.length < fd) stdio.push("ignore");
    stdio[fd] = devNull;
  }
  return stdio;
}

/** Both ends of a local stream socket: the command writes its stdout and stderr to one (one descriptor for both,
 * as Python's stderr=STDOUT, so their order is kept), this process reads the other. The socket's name can be seen
 * (an abstract name is listed in /proc/net/unix), so the writer proves itself with a random first message: a
 * process left over from an earlier command that connects first is dropped, not taken for the command's output. */
async function outputChannel() {
  const server = net.createServer();
  const address = PROC_FD ? `\0openclaw-exec-output-${randomUUID()}` : path.join(os.tmpdir(), `openclaw-exec-${randomUUID()}.sock`);
  const proof = randomBytes(16);
  const strangers = new Set();
  const proven = new Promise((resolve) => {
    server.on("connection", (connection) => {
      strangers.add(connection);
      let received = Buffer.alloc(0);
      connection.on("error", () => connection.destroy());
      connection.on("data", function firstMessage(data) {
        received = Buffer.concat([received, data]);
        if (received.length < proof.length) return;
        connection.off("data", firstMessage);
        connection.pause();
        if (received.length === proof.length && received.equals(proof)) {
          strangers.delete(connection);
          resolve(connection);
        } else {
          connection.destroy();
        }
      });
    });
  });
  await new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(address, resolve);
  });
  try {
    const writer = net.connect(address);
    await new Promise((resolve, reject) => {
      writer.once("connect", resolve);
      writer.once("error", reject);
    });
    await new Promise((resolve, reject) => writer.write(proof, (error) => (error ? reject(error) : resolve())));
    const reader = await proven;
    return { writer, reader };
  } finally {
    server.close();
    for (const connection of strangers) connection.destroy();
    if (!PROC_FD) fs.rmSync(address, { force: true });
  }
}

/** Run `request` to its end, its timeout or `signal`: the outcome {capture, exitCode, timedOut, aborted,
 * startError, durationMs, notes}.
 *  1. Start `/bin/sh -c` as a process group leader, stdin closed, output to one socket.
 *  2. Until the shell exits: read what comes; on abort SIGKILL the group; at the deadline SIGTERM it, and SIGKILL
 *     it execKillGraceMs later.
 *  3. SIGKILL the group (what the shell left behind).
 *  4. Drain the output until EOF or DRAIN_AFTER_EXIT_MS. */
async function runCommand(request, env, limits, signal) {
  const capture = new OutputCapture(limits.resultMaxBytes, limits.artifactMaxBytes);
  const outcome = { capture, exitCode: null, timedOut: false, aborted: false, startError: null, durationMs: 0, notes: [] };
  const started = performance.now();
  if (request.command.includes("\0")) {
    // No argument of a program can hold one (Python's Popen raises for it; a tool error here).
    outcome.startError = "Command could not start: the command contains a NUL byte";
    return outcome;
  }
  const { writer, reader } = await outputChannel();
  let child;
  const devNull = fs.openSync("/dev/null", "r+");
  try {
    child = spawn(SHELL, ["-c", request.command], {
      cwd: request.workdir,
      env,
      stdio: commandStdio(writer, devNull),
      detached: true,
    });
  } catch (error) {
    reader.destroy();
    outcome.startError = `Command could not start: ${strerror(error)}`;
    return outcome;
  } finally {
    writer.destroy();
    fs.closeSync(devNull);
  }
  reader.on("data", (data) => capture.feed(data));
  reader.resume();
  const outputEnded = new Promise((resolve) => {
    reader.once("end", resolve);
    reader.once("close", resolve);
    reader.once("error", resolve);
  });
  const exited = new Promise((resolve) => {
    child.once("exit", (code, signalName) => resolve({ code, signalName }));
    child.once("error", (error) => resolve({ error }));
  });
  const timers = [];
  const onAbort = () => {
    if (outcome.aborted || child.pid === undefined) return;
    outcome.aborted = true;
    signalGroup(child.pid, "SIGKILL");
  };
  timers.push(
    setTimeout(() => {
      if (outcome.aborted || child.pid === undefined) return;
      outcome.timedOut = true;
      signalGroup(child.pid, "SIGTERM");
      timers.push(setTimeout(() => signalGroup(child.pid, "SIGKILL"), limits.execKillGraceMs));
    }, request.timeoutS * 1000),
  );
  signal?.addEventListener("abort", onAbort);
  if (signal?.aborted) onAbort();
  let ended;
  try {
    ended = await exited;
  } finally {
    signal?.removeEventListener("abort", onAbort);
    for (const timer of timers) clearTimeout(timer);
    if (child.pid !== undefined) signalGroup(child.pid, "SIGKILL");
  }
  if (ended.error !== undefined) {
    reader.destroy();
    outcome.startError = `Command could not start: ${strerror(ended.error)}`;
    return outcome;
  }
  outcome.exitCode = ended.code ?? -(os.constants.signals[ended.signalName] ?? 0);
  let drainTimer;
  const drained = await Promise.race([
    outputEnded.then(() => true),
    new Promise((resolve) => {
      drainTimer = setTimeout(() => resolve(false), DRAIN_AFTER_EXIT_MS);
    }),
  ]);
  clearTimeout(drainTimer);
  if (!drained) outcome.notes.push("(A process that left the command's process group still holds its output open.)");
  reader.destroy();
  outcome.durationMs = Math.floor(performance.now() - started);
  return outcome;
}

const SIGNAL_NAMES = Object.fromEntries(Object.entries(os.constants.signals).map(([name, number]) => [number, name]));

function execResult(request, outcome) {
  const capture = outcome.capture;
  const details = {
    exitCode: outcome.exitCode,
    durationMs: outcome.durationMs,
    timedOut: outcome.timedOut,
    truncated: capture.truncated,
    outputBytes: capture.total,
    cwd: request.workdir,
  };
  if (outcome.startError !== null) return toolResult(outcome.startError, true, details);
  const output = capture.text();
  if (outcome.aborted) {
    const text =
      "Command aborted: the turn was stopped while it ran" + (output ? `; its output so far:\n${output}` : "");
    return toolResult(text, true, { ...details, aborted: true }, capture.fullText());
  }
  const status = [];
  if (outcome.timedOut) {
    status.push(`(Command timed out after ${formatG(request.timeoutS)} seconds and was killed)`);
  } else if (outcome.exitCode !== null && outcome.exitCode < 0) {
    status.push(`(Command terminated by ${SIGNAL_NAMES[-outcome.exitCode] ?? `signal ${-outcome.exitCode}`})`);
  } else if (outcome.exitCode) {
    status.push(`(Command exited with code ${outcome.exitCode})`);
  }
  status.push(...outcome.notes);
  let text = output || (status.length ? "" : "(no output)");
  if (status.length) {
    // One blank line between the output and the status, whether or not the output ended its line.
    text = (text ? text + (text.endsWith("\n") ? "\n" : "\n\n") : "") + status.join("\n");
  }
  const isError = outcome.timedOut || outcome.exitCode !== 0;
  return toolResult(text, isError, details, capture.fullText());
}

class ExecSlotsBusy extends Error {}

/** At most `count` commands at once per host, across processes: slot i is held by listening on a local socket
 * named after the slot directory and i. On Linux that is an abstract socket, which the kernel releases with its
 * holder's last descriptor (a worker that dies frees its slot, as Python's flock files do); the listening socket
 * is close-on-exec, so the command and what it leaves behind never hold it. Elsewhere it is a socket file in the
 * directory, taken over when nobody answers on it. */
export class ExecSlots {
  constructor(directory, count) {
    if (!Number.isInteger(count) || count < 1) throw new RangeError("ExecSlots count must be at least 1");
    fs.mkdirSync(directory, { recursive: true, mode: 0o700 });
    this.directory = fs.realpathSync(directory);
    this.count = count;
    this.key = createHash("sha256").update(this.directory).digest("hex").slice(0, 32);
  }

  address(index) {
    return PROC_FD ? `\0openclaw-exec-slots/${this.key}/${index}` : path.join(this.directory, `slot-${index}.sock`);
  }

  async tryListen(address) {
    const server = net.createServer((connection) => connection.destroy());
    const taken = await new Promise((resolve) => {
      server.once("error", (error) => resolve(error));
      server.listen(address, () => resolve(null));
    });
    if (taken === null) {
      server.unref();
      return server;
    }
    if (!isErrno(taken, "EADDRINUSE")) throw taken;
    return null;
  }

  async holderGone(address) {
    if (PROC_FD) return false;
    return new Promise((resolve) => {
      const probe = net.connect(address);
      probe.once("connect", () => {
        probe.destroy();
        resolve(false);
      });
      probe.once("error", (error) => resolve(isErrno(error, "ECONNREFUSED", "ENOENT")));
    });
  }

  async tryEach() {
    for (let index = 0; index < this.count; index++) {
      const address = this.address(index);
      let server = await this.tryListen(address);
      if (server === null && (await this.holderGone(address))) {
        fs.rmSync(address, { force: true });
        server = await this.tryListen(address);
      }
      if (server !== null) return server;
    }
    return null;
  }

  /** Runs `work` holding a slot; throws ExecSlotsBusy when none is free within `waitMs` or `signal` aborts. */
  async hold(waitMs, signal, work) {
    const deadline = performance.now() + waitMs;
    let server;
    while ((server = await this.tryEach()) === null) {
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        throw new ExecSlotsBusy(`too many commands running on this host (limit ${this.count}); try again later`);
      }
      if (await pause(Math.min(SLOT_POLL_INTERVAL_MS, remaining), signal)) {
        throw new ExecSlotsBusy("cancelled while waiting for a free command slot");
      }
    }
    try {
      return await work();
    } finally {
      server.close();
    }
  }
}

/** Waits `ms`; true when `signal` aborted first. */
function pause(ms, signal) {
  if (signal?.aborted) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = (aborted) => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      resolve(aborted);
    };
    const onAbort = () => done(true);
    const timer = setTimeout(() => done(false), ms);
    signal?.addEventListener("abort", onAbort);
  });
}

// --- the runner (tools.py) ------------------------------------------------------------------------------------

const FILE_TOOLS = { read: readFile, write: writeFile, edit: editFile, ls: listDirectory, find: findFiles, grep: grepFiles };
// The searches run on a thread of their own: a walk of a large tree, or a regular expression that backtracks for
// minutes on one line (JavaScript's, like Python's, has no time limit), would otherwise hold this process's event
// loop, and with it the turn's cancel. An abort terminates the thread.
const SEARCH_TOOLS = new Set(["find", "grep"]);
const SEARCH_THREAD = "openclaw-tools-search";

/** Runs a search tool on a thread: its result, or the error it raised rebuilt (a ToolCallError, a file system
 * error with its code); the aborted result when `signal` aborts first. */
function searchOnThread(root, limits, call, signal) {
  return new Promise((resolve, reject) => {
    const thread = new Worker(new URL(import.meta.url), {
      workerData: { kind: SEARCH_THREAD, root, limits: { ...limits }, name: call.name, arguments: call.arguments },
    });
    let settled = false;
    const settle = (action) => {
      if (settled) return;
      settled = true;
      signal?.removeEventListener("abort", onAbort);
      action();
    };
    const onAbort = () => {
      settle(() => resolve(abortedResult()));
      thread.terminate();
    };
    signal?.addEventListener("abort", onAbort);
    thread.once("message", ({ result, error }) => settle(() => (error ? reject(rebuiltError(error)) : resolve(result))));
    thread.once("error", (error) => settle(() => reject(error)));
    thread.once("exit", (code) => settle(() => reject(new Error(`the search thread exited (${code}) without a result`))));
  });
}

function rebuiltError({ toolMessage, code, syscall, message }) {
  if (toolMessage !== null) return new ToolCallError(toolMessage);
  const error = new Error(message);
  if (code !== null) error.code = code;
  if (syscall !== null) error.syscall = syscall;
  return error;
}

if (!isMainThread && workerData?.kind === SEARCH_THREAD) {
  const { root, limits, name, arguments: args } = workerData;
  try {
    parentPort.postMessage({ result: FILE_TOOLS[name](new Workspace(root), limits, args, undefined) });
  } catch (error) {
    parentPort.postMessage({
      error: {
        toolMessage: error instanceof ToolCallError ? error.message : null,
        code: typeof error?.code === "string" ? error.code : null,
        syscall: typeof error?.syscall === "string" ? error.syscall : null,
        message: String(error?.message ?? error),
      },
    });
  }
}

export class ToolRunner {
  /** `workspaceDir` must exist (it is resolved once); `limits` as toolLimits() takes them. */
  constructor(workspaceDir, limits = {}) {
    this.workspace = new Workspace(workspaceDir);
    this.limits = toolLimits(limits);
    this.schemas = Object.fromEntries(
      Object.entries(toolSchemas(this.limits)).map(([name, [, parameters]]) => [name, parameters]),
    );
    const slots = this.limits.execSlots;
    this.execSlots = slots ? new ExecSlots(slots.dir, slots.count) : null;
  }

  /** The schemas the model is shown, with this runner's limits (what prepare enforces). */
  toolSpecs(names = TOOL_NAMES) {
    return toolSpecs(names, this.limits);
  }

  /** The model's call checked against its tool's schema (and exec's env rules and workdir): {ok:true, call} or,
   * for a malformed call, {ok:false, result} (the error result the model is answered). Changes no file. */
  prepare(name, argumentsJson) {
    try {
      return { ok: true, call: this.checkedCall(name, argumentsJson) };
    } catch (error) {
      if (error instanceof ToolCallError) return { ok: false, result: errorResult(error.message) };
      throw error;
    }
  }

  checkedCall(name, raw) {
    if (typeof name !== "string" || !Object.hasOwn(this.schemas, name)) {
      throw new ToolCallError(`unknown tool ${quoted(String(name))}; available: ${TOOL_NAMES.join(", ")}`);
    }
    let args = decodedArguments(name, raw);
    if (name === "edit") args = legacyEdit(args);
    args = checkedArguments(name, args, this.schemas[name]);
    if (name === "edit") {
      args.edits.forEach((edit, index) => {
        if (!edit.oldText) throw new ToolCallError(`invalid arguments for edit: edits[${index}].oldText is empty`);
      });
    }
    if (name === "exec") {
      const env = args.env ?? {};
      for (const key of Object.keys(env)) {
        const problem = envProblem(key, env[key]);
        if (problem !== null) throw new ToolCallError(`invalid arguments for exec: ${problem}`);
      }
      // The workdir is checked here too (Python checks it in exec_request; the loop answers either refusal the
      // same way), so that execRequest on a prepared call throws only if the folder changed in between.
      this.execRequest({ name, arguments: args });
    }
    return { name, arguments: args };
  }

  /** What `call` (an exec) would run, its working directory resolved inside the workspace:
   * {command, workdir, envKeys, timeoutS}. Throws ToolCallError when the workdir is no longer a folder in the
   * workspace (prepare checked it): answer the model errorResult(error.message), as Python's loop does. */
  execRequest(call) {
    if (call.name !== "exec") throw new TypeError(`execRequest is for exec calls, not ${call.name}`);
    const args = call.arguments;
    const requested = args.workdir ?? ".";
    const workdir = this.workspace.resolve(requested, "workdir");
    if (!this.workspace.isDirectory(workdir)) {
      throw new ToolCallError(`workdir ${quoted(requested)} is not a directory in the workspace`);
    }
    const timeoutS = Math.min(args.timeoutSeconds ?? this.limits.execTimeoutMs / 1000, this.limits.execMaxTimeoutMs / 1000);
    return { command: args.command, workdir, envKeys: Object.keys(args.env ?? {}).sort(compareCodePoints), timeoutS };
  }

  /** Run a prepared call. A refusal (a path outside the workspace, a missing file, a timeout, a busy host…) is
   * an isError result; only a programming error throws. */
  async run(call, { signal } = {}) {
    if (signal?.aborted) return abortedResult();
    try {
      if (call.name === "exec") return await this.exec(call, signal);
      const result = SEARCH_TOOLS.has(call.name)
        ? await searchOnThread(this.workspace.root, this.limits, call, signal)
        : FILE_TOOLS[call.name](this.workspace, this.limits, call.arguments, signal);
      return result.details.aborted ? result : cappedResult(result, this.limits);
    } catch (error) {
      if (error instanceof ToolCallError) return toolResult(error.message, true, {});
      if (error instanceof CallAborted) return abortedResult();
      if (!isErrno(error, ...Object.keys(STRERROR)) && typeof error?.syscall !== "string") throw error;
      const named = this.named(call);
      if (isErrno(error, "ENOENT")) return toolResult(`${named}: no such file or directory`, true, {});
      if (isErrno(error, "EACCES", "EPERM")) return toolResult(`${named}: permission denied`, true, {});
      return toolResult(`${named}: ${strerror(error)}`, true, {});
    }
  }

  named(call) {
    const args = call.arguments;
    const shown = Object.hasOwn(args, "path") ? args.path : Object.hasOwn(args, "workdir") ? args.workdir : ".";
    return typeof shown === "string" ? quoted(shown) : "path";
  }

  async exec(call, signal) {
    const request = this.execRequest(call);
    const env = commandEnv(call.arguments.env ?? {});
    const runIt = async () => execResult(request, await runCommand(request, env, this.limits, signal));
    if (this.execSlots === null) return runIt();
    try {
      return await this.execSlots.hold(this.limits.execSlotWaitMs, signal, runIt);
    } catch (error) {
      if (!(error instanceof ExecSlotsBusy)) throw error;
      if (signal?.aborted) return abortedResult("Command aborted: the turn was stopped before it ran");
      return toolResult(error.message, true, { exitCode: null, cwd: request.workdir });
    }
  }
}
