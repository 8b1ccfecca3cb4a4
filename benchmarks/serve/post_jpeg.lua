-- wrk script: POST one JPEG file as the raw body of every request.
--   wrk -t8 -c256 -d10s -s post_jpeg.lua http://127.0.0.1:8000/v1/embeddings/image -- photo.jpg
-- At the end it prints one line, "wrk-json {...}", with the counts and latency percentiles (microseconds).
function init(args)
  local file = assert(io.open(args[1], "rb"))
  wrk.body = file:read("*a")
  file:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "image/jpeg"
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'wrk-json {"requests": %d, "duration_us": %d, "bytes": %d, "errors": {"connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d}, "latency_us": {"p50": %d, "p90": %d, "p99": %d, ' ..
    '"p99.9": %d, "mean": %.1f, "max": %d}}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.mean, latency.max))
end
