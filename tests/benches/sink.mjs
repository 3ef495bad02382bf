// A copy of the side-by-side harness's sink (kept with the peer benchmarks), so
// the step floor and scripts/bench-steps.py measure against the same sink
// without reaching outside the repository. Keep the two the same.
// Loopback side-effect sink shaped like the Restate bench's: applies each
// Idempotency-Key once, counts raw hits, replies with a 400-char body.
import http from "node:http";
const port = Number(process.argv[2] ?? 9111);
const seen = new Map();
let hits = 0, keyless = 0;
const note = "x".repeat(400);
http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    if (req.url.startsWith("/stats")) {
      const dups = [...seen.values()].filter((v) => v > 1).length;
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ hits, keys: seen.size, dups, keyless }));
      return;
    }
    hits++;
    const k = req.headers["idempotency-key"];
    if (k) seen.set(k, (seen.get(k) ?? 0) + 1); else keyless++;
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ ok: true, note }));
  });
}).listen(port, "127.0.0.1");
