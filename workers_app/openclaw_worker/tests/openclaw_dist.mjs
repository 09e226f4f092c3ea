// OpenClaw's own parsers of the node-worker process protocol, loaded from the installed package (the tests
// check this worker's input and output with them, not with a copy of their rules).
//
//   const dist = await openclawDist();   // null when the package is not installed
//   dist.parseWorkerProcessRequest(line) / dist.parseWorkerProcessResult(frame)
//
// The package is the one ../shared/tools/openclaw-cli installs (OPENCLAW_DIST names its dist/ folder). Its
// chunks export their functions under short aliases, so each function is found by the name in the chunk's
// export list.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";

export function distDir() {
  return (
    process.env.OPENCLAW_DIST ||
    path.join(process.env.OPENCLAW_CLI_DIR || path.join(os.homedir(), ".cache", "openclaw-cli"), "oc", "node_modules", "openclaw", "dist")
  );
}

async function exported(dir, chunkPrefix, names) {
  // Several chunks may share a prefix: the one whose export list names the first function is meant.
  const chunk = fs
    .readdirSync(dir)
    .filter((name) => name.startsWith(chunkPrefix) && name.endsWith(".mjs"))
    .find((name) => new RegExp(`\\b${names[0]} as \\w+\\b`, "u").test(fs.readFileSync(path.join(dir, name), "utf8")));
  if (!chunk) throw new Error(`no ${chunkPrefix}*.mjs in ${dir} exports ${names[0]}`);
  const file = path.join(dir, chunk);
  const source = fs.readFileSync(file, "utf8");
  const module = await import(pathToFileURL(file).href);
  const found = {};
  for (const name of names) {
    const alias = source.match(new RegExp(`\\b${name} as (\\w+)\\b`, "u"))?.[1];
    if (!alias || typeof module[alias] !== "function") throw new Error(`${chunk} does not export ${name}`);
    found[name] = module[alias];
  }
  return found;
}

/** OpenClaw's parsers, or null without the package. */
export async function openclawDist() {
  const dir = distDir();
  if (!fs.existsSync(dir)) return null;
  return await exported(dir, "worker-process-protocol-", [
    "parseWorkerProcessRequest",
    "parseWorkerProcessResult",
    "buildWorkerProcessTurn",
    "serializeWorkerProcessInput",
  ]);
}

/**
 * The pieces OpenClaw's node supervisor spawns and reads a worker with (NH `prepareNodeWorkerLaunchTransport`,
 * `observeNodeWorkerChildOutput`): `createChildAdapter` (dist/child-*.mjs) and `createBoundedLineFramer`, with the
 * protocol functions above; null without the package.
 */
export async function openclawSupervisorPieces() {
  const protocol = await openclawDist();
  if (protocol === null) return null;
  const dir = distDir();
  return {
    ...protocol,
    ...(await exported(dir, "child-", ["createChildAdapter"])),
    ...(await exported(dir, "bounded-line-framer-", ["createBoundedLineFramer"])),
  };
}
