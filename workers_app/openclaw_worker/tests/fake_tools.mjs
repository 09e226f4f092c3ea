// A small tool set with tools.mjs's interface, for the worker's own tests: the loop, approvals and cancel are
// tested against tools whose behaviour the test decides (tools.mjs has its own tests).
//
// - `read {path}` answers the file's text (a missing file is an error result);
// - `exec {command, workdir?}` never runs anything: a `workdir` is refused as tools.mjs refuses one that is no
//   directory (ToolCallError from execRequest); otherwise it appends the command to `.exec-log` in the
//   workspace (so a test sees what ran) and answers `ran: <command>`; the command `wait-for-abort` waits until
//   the turn's signal aborts and answers an aborted result, as a killed command does.

import fs from "node:fs";
import path from "node:path";

export const TOOL_NAMES = ["read", "exec"];
export const EXEC_LOG = ".exec-log";

export function toolSpecs() {
  return [
    {
      type: "function",
      function: {
        name: "read",
        description: "Read a text file of the workspace.",
        parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
      },
    },
    {
      type: "function",
      function: {
        name: "exec",
        description: "Run a shell command in the workspace.",
        parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
      },
    },
  ];
}

const textResult = (text, isError = false, details = {}) => ({ content: [{ type: "text", text }], details, isError });

/** A call refused before anything is done (tools.mjs's class of the same name). */
export class ToolCallError extends Error {}

export class ToolRunner {
  constructor(workspaceDir, limits = {}) {
    if (!fs.statSync(workspaceDir).isDirectory()) throw new Error("the workspace is not a directory");
    this.root = workspaceDir;
    this.limits = limits;
  }

  toolSpecs() {
    return toolSpecs();
  }

  prepare(name, argumentsJson) {
    if (!TOOL_NAMES.includes(name)) return { ok: false, result: textResult(`unknown tool ${JSON.stringify(name)}`, true) };
    let args;
    try {
      args = JSON.parse(argumentsJson);
    } catch {
      return { ok: false, result: textResult("arguments are not valid JSON", true) };
    }
    return { ok: true, call: { name, arguments: args } };
  }

  execRequest(call) {
    if (call.arguments.workdir !== undefined) {
      throw new ToolCallError(`workdir ${JSON.stringify(call.arguments.workdir)} is not a directory in the workspace`);
    }
    return {
      command: call.arguments.command,
      workdir: this.root,
      envKeys: [],
      timeoutS: (this.limits.execTimeoutMs ?? 120_000) / 1000,
    };
  }

  async run(call, { signal }) {
    if (call.name === "read") {
      try {
        return textResult(fs.readFileSync(path.join(this.root, call.arguments.path), "utf8"));
      } catch {
        return textResult(`${JSON.stringify(call.arguments.path)}: no such file or directory`, true);
      }
    }
    fs.appendFileSync(path.join(this.root, EXEC_LOG), `${call.arguments.command}\n`);
    if (call.arguments.command === "wait-for-abort") {
      await new Promise((resolve) => {
        if (signal.aborted) resolve();
        else signal.addEventListener("abort", resolve, { once: true });
      });
      return textResult("Command aborted", true, { aborted: true });
    }
    return textResult(`ran: ${call.arguments.command}`, false, { exitCode: 0 });
  }
}

export function refusedExecResult(reason, aborted) {
  return textResult(reason, true, aborted ? { aborted: true } : { denied: true });
}
