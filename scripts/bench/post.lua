-- wrk script of scripts/bench-load: POSTs one JSON body, read from the file given as
-- the script's first argument, on every request, with any further arguments as extra
-- headers (`wrk -s post.lua URL -- BODY_FILE ["Name: value" ...]`), and prints one JSON
-- line of results when the run ends (latencies in microseconds).

function init(args)
  local file = assert(io.open(args[1], "rb"))
  wrk.method = "POST"
  wrk.body = file:read("*a")
  file:close()
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer sk-bench-not-a-real-key"
  for i = 2, #args do
    local name, value = args[i]:match("^([^:]+):%s*(.*)$")
    if name then
      wrk.headers[name] = value
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"status_errors":%d,"timeouts":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max))
end
