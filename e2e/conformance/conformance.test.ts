// The Durable Streams conformance suite, run against the server at CONFORMANCE_TEST_URL.
// (The package's own CLI cannot find its test file under vitest 4, so this file runs it.)
import { runConformanceTests } from "@durable-streams/server-conformance-tests"
import { fetch as undiciFetch } from "undici"

// Node 20's built-in fetch (undici 6) cannot follow a 307 with a Uint8Array body: it fails
// with "Cannot perform ArrayBuffer.prototype.slice on a detached ArrayBuffer". A follower's
// leader redirects need exactly that, so the suite uses the current undici's fetch, which
// follows them as the Fetch standard says.
globalThis.fetch = undiciFetch as unknown as typeof globalThis.fetch

runConformanceTests({
  baseUrl: process.env.CONFORMANCE_TEST_URL ?? "http://127.0.0.1:4437",
  longPollTimeoutMs: Number(process.env.CONFORMANCE_LONG_POLL_MS ?? 500),
  // The reserved __ds subscription APIs: 6 opt-in tests.
  subscriptions: true,
})
