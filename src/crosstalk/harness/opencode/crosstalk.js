// CrossTalk's opencode plugin (opencode 1.18.33; `crosstalk install` copies it to
// $XDG_CONFIG_HOME/opencode/plugin/crosstalk.js, where opencode loads it by itself).
//
// Why it exists: a plain opencode TUI has no HTTP listener and nothing on disk names a running
// opencode process, so another process cannot reach its sessions; and opencode tells an MCP
// server nothing about which session called it. Plugins run inside every opencode process (the
// TUI's server worker included), once per instance (process x project directory). So, per
// instance, this plugin:
//  1. serves the instance's HTTP API on a unix socket (0600, in a 0700 directory), forwarding
//     each request to the in-process app, SSE (GET /event) streamed through;
//  2. publishes a record <pid>-<sha256(directory)[:12]>.json beside it (temp + rename), which
//     CrossTalk's opencode harness reads; pid + process start time make a stale one detectable
//     after a kill -9 (nothing can clean up then);
//  3. stamps "_opencode": {sessionID, callID} into the arguments of CrossTalk's own tools
//     (crosstalk_*), the only per-call evidence of the calling session an MCP server can get.
// Both files go on dispose (/exit) and on SIGTERM/SIGINT/SIGHUP/exit. One-shot CLI commands
// (`opencode session list`, `--version`, `debug`, `mcp`, ...) also load plugins; they publish
// nothing, so a short-lived process never shows up as a session host.
// The socket refuses the routes CrossTalk must never use (answering permissions, the TUI's
// prompt box, settings and shells): a message is not the user's consent, and the user's draft
// and settings are theirs.
// Every failure here is logged and swallowed: a broken bridge must never break opencode.
import crypto from "crypto"
import fs from "fs"
import os from "os"
import path from "path"

const FORMAT = "crosstalk-opencode-instance"
const MAX_SOCKET_PATH = 103 // sun_path is 108 bytes; CrossTalk keeps every socket path <= 103

// Top-level commands that do their job and exit; everything else (the TUI, with or without a
// project path, serve, web, run, attach, acp) hosts sessions and publishes.
const ONE_SHOT = new Set([
  "agent", "auth", "config", "console", "db", "debug", "export", "generate", "github", "import",
  "mcp", "models", "plugin", "pr", "providers", "session", "stats", "uninstall", "upgrade", "v2",
  "completion", "help",
])
// Global options that take a value as the next token (so `--port 0` is not a project named 0).
const VALUE_OPTIONS = new Set([
  "--port", "--hostname", "--log-level", "-m", "--model", "-s", "--session", "--agent",
  "--prompt", "--mdns-domain", "--cors", "--dir", "--variant", "--format", "--file", "-f",
  "--title", "--attach", "--password", "-p", "--username", "-u",
])

// Whether this process hosts sessions, from its CLI arguments (Bun's compiled argv is
// [bun, /$bunfs/root/..., ...args]).
function publishes(argv) {
  const args = argv.slice(2)
  for (let i = 0; i < args.length; i++) {
    const a = args[i]
    if (a === "--") return true
    if (a === "--version" || a === "-v" || a === "--help" || a === "-h") return false
    if (a.startsWith("-")) {
      if (!a.includes("=") && VALUE_OPTIONS.has(a)) i++
      continue
    }
    return !ONE_SHOT.has(a) // the first positional: a command name or the TUI's project path
  }
  return true // bare `opencode`: the TUI
}

// The same rule as crosstalk.config.state_dir ("~" means this environment's HOME).
function stateDir(env) {
  const home = env.HOME || os.homedir()
  const expand = (v) => (v === "~" || v.startsWith("~/") ? home + v.slice(1) : v)
  if (env.CROSSTALK_HOME) return expand(env.CROSSTALK_HOME)
  if (env.XDG_STATE_HOME) return path.join(expand(env.XDG_STATE_HOME), "crosstalk")
  return path.join(expand(home), ".local", "state", "crosstalk")
}

// mkdir -p with 0700 for every level it creates; the leaf must be a real directory of ours
// (a directory another user made could swap our socket), and is made 0700.
function privateDir(dir) {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 })
  const st = fs.lstatSync(dir)
  if (!st.isDirectory()) throw new Error(`${dir} is not a directory`)
  if (typeof process.getuid === "function" && st.uid !== process.getuid())
    throw new Error(`${dir} belongs to uid ${st.uid}, not to us`)
  if ((st.mode & 0o777) !== 0o700) fs.chmodSync(dir, 0o700)
  return dir
}

// Where the socket goes: beside the record, unless that path is too long for a unix socket.
function socketPath(recordDir, key, env) {
  const name = `${key}.sock`
  const candidates = [recordDir]
  if (env.XDG_RUNTIME_DIR) candidates.push(path.join(env.XDG_RUNTIME_DIR, "crosstalk-oc"))
  const uid = typeof process.getuid === "function" ? process.getuid() : "user"
  candidates.push(path.join(os.tmpdir(), `crosstalk-oc-${uid}`))
  for (const dir of candidates) {
    const p = path.join(dir, name)
    if (Buffer.byteLength(p) <= MAX_SOCKET_PATH) return { dir, path: p }
  }
  return null
}

// Field 22 of /proc/<pid>/stat (start time in clock ticks), counted after the ")" that ends
// the command name (which may itself hold spaces and parentheses).
function processStart(pid) {
  try {
    const raw = fs.readFileSync(`/proc/${pid}/stat`, "utf8")
    const fields = raw.slice(raw.lastIndexOf(")") + 2).split(" ")
    return fields[19] ?? null // fields[0] is field 3
  } catch {
    return null
  }
}

// opencode's version without asking the app (a request during plugin init could wait on the
// very bootstrap that is running us): the binary runs with --user-agent=opencode/<version>.
function opencodeVersion() {
  const sources = [...(process.execArgv || []), globalThis.navigator?.userAgent || ""]
  for (const s of sources) {
    const m = /opencode\/(\d+\.\d+\.\d+[\w.-]*)/.exec(String(s))
    if (m) return m[1]
  }
  return null
}

// Routes CrossTalk must never use (see the header); a GET of /permission (is a session
// waiting for its user?) stays open. Judged on the path as a router could read it: decoded,
// slashes collapsed, lower case (so /%74ui/ or //TUI/ is /tui/ too).
function refused(method, rawPath) {
  let pathname
  try {
    pathname = decodeURIComponent(rawPath).replace(/\/{2,}/g, "/").toLowerCase()
  } catch {
    return "undecodable paths"
  }
  method = method.toUpperCase()
  if (pathname === "/tui" || pathname.startsWith("/tui/")) return "the TUI's prompt and dialogs"
  if (pathname === "/pty" || pathname.startsWith("/pty/")) return "terminals"
  if (/^\/session\/[^/]+\/(shell|command)$/.test(pathname)) return "running commands"
  if (method !== "GET" && method !== "HEAD") {
    for (const p of ["/permission", "/question", "/config", "/global/config", "/auth"])
      if (pathname === p || pathname.startsWith(p + "/")) return "the user's answers and settings"
  }
  return null
}

function writeAtomic(file, text) {
  const tmp = `${file}.${process.pid}.${crypto.randomBytes(4).toString("hex")}.tmp`
  const fd = fs.openSync(tmp, "wx", 0o600)
  try {
    fs.writeSync(fd, text)
    fs.fsyncSync(fd)
  } finally {
    fs.closeSync(fd)
  }
  fs.renameSync(tmp, file)
}

// Cleanup that must also run when the process is told to stop: exit handlers do not run on a
// signal nobody handles, so we handle SIGTERM/SIGINT/SIGHUP, clean up, and, if nobody else
// listens, die of the same signal as we would have.
const cleanups = new Set()
let hooked = false
function onStop(fn) {
  cleanups.add(fn)
  if (hooked) return
  hooked = true
  const runAll = () => {
    for (const f of [...cleanups]) {
      try { f() } catch {}
    }
    cleanups.clear()
  }
  process.on("exit", runAll)
  for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"]) {
    const handler = () => {
      runAll()
      if (process.listenerCount(sig) === 1) {
        process.removeListener(sig, handler)
        process.kill(process.pid, sig)
      }
    }
    process.on(sig, handler)
  }
}

export const CrossTalk = async ({ client, directory }) => {
  const hooks = {
    // CrossTalk's tools only (opencode names an MCP tool <server>_<tool>): the stamp is the
    // calling session; the shim removes it before it validates the arguments.
    "tool.execute.before": async (input, output) => {
      if (typeof input?.tool === "string" && input.tool.startsWith("crosstalk_") &&
          output?.args && typeof output.args === "object") {
        output.args._opencode = { sessionID: input.sessionID, callID: input.callID }
      }
    },
  }
  if (!publishes(process.argv)) return hooks

  const env = process.env
  const pid = process.pid
  const log = (msg, err) => {
    try {
      Promise.resolve(client?.app?.log?.({ body: {
        service: "crosstalk", level: "warn",
        message: err ? `${msg}: ${err?.message ?? err}` : msg } })).catch(() => {})
    } catch {}
  }
  let server = null
  // The files we made, by inode: a successor instance of the same directory in this process
  // reuses the names, and our cleanup must not take its files.
  const files = []
  const made = (f) => files.push({ path: f, ino: fs.lstatSync(f).ino })
  const remove = () => {
    for (const { path: f, ino } of files.splice(0)) {
      try { if (fs.lstatSync(f).ino === ino) fs.unlinkSync(f) } catch {}
    }
    try { server?.stop(true) } catch {}
    server = null
  }
  try {
    const dir = path.resolve(directory)
    const key = `${pid}-${crypto.createHash("sha256").update(dir).digest("hex").slice(0, 12)}`
    const recordDir = privateDir(path.join(stateDir(env), "opencode"))
    const sock = socketPath(recordDir, key, env)
    if (!sock) throw new Error("no socket path short enough")
    privateDir(sock.dir)
    const record = path.join(recordDir, `${key}.json`)

    // The in-process app: what the SDK client given to plugins calls when there is no listener.
    const cfg = client._client.getConfig()
    const base = String(cfg.baseUrl).replace(/\/$/, "")
    const app = cfg.fetch ?? globalThis.fetch

    try { fs.unlinkSync(sock.path) } catch {} // a stale socket of a dead process with our pid
    server = Bun.serve({
      unix: sock.path,
      idleTimeout: 0, // SSE streams stay open
      async fetch(req) {
        const url = new URL(req.url)
        const why = refused(req.method, url.pathname)
        if (why) return Response.json({ error: `CrossTalk's socket does not serve ${why}` },
                                      { status: 403 })
        const headers = new Headers(req.headers)
        if (!headers.has("x-opencode-directory"))
          headers.set("x-opencode-directory", encodeURIComponent(dir))
        const body = req.method === "GET" || req.method === "HEAD" ? undefined
                                                                   : await req.arrayBuffer()
        try {
          return await app(new Request(base + url.pathname + url.search,
                                       { method: req.method, headers, body }))
        } catch (err) {
          return Response.json({ error: `opencode did not answer: ${err?.message ?? err}` },
                               { status: 502 })
        }
      },
    })
    made(sock.path)
    fs.chmodSync(sock.path, 0o600)
    writeAtomic(record, JSON.stringify({
      format: FORMAT, version: 1, pid, process_start: processStart(pid), directory: dir,
      socket: sock.path, opencode_version: opencodeVersion(),
      written_at: (performance.timeOrigin + performance.now()) / 1000,
    }))
    made(record)
    onStop(remove)
  } catch (err) {
    log("CrossTalk could not publish this opencode instance", err)
    remove()
  }
  hooks.dispose = async () => {
    cleanups.delete(remove)
    remove()
  }
  return hooks
}
