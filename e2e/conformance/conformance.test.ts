// The Durable Streams conformance suite, run against the server at CONFORMANCE_TEST_URL.
// (The package's own CLI cannot find its test file under vitest 4, so this file runs it.)
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

runConformanceTests({
  baseUrl: process.env.CONFORMANCE_TEST_URL ?? "http://127.0.0.1:4437",
  longPollTimeoutMs: Number(process.env.CONFORMANCE_LONG_POLL_MS ?? 500),
})
