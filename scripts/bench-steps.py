#!/usr/bin/env python3
"""Where a durable agent step's time and CPU go, through the daemon's API.

scripts/bench-steps.py MNEME N [CONC NC]: starts the peers' Node sink
(tests/benches/sink.mjs) and `MNEME serve`; one session of N
steps (a scripted reply calling a side-effecting HTTP tool that POSTs to the
sink), then CONC sessions of NC steps at once. Prints steps/s as JSON.
Env: PERF=1 adds the daemon's CPU ms and context switches a step of the
one-session run (`perf stat -p`); SINKPERF=1 the sink's CPU a step;
CONCPERF=1 the daemon's, the sink's and this client's CPU a step of the
concurrent run; PERFREC=FILE / CONCREC=FILE record a profile of either
(`perf record`); STRACE=FILE an strace of the one-session run;
MNEME_DURABILITY passes through to the daemon. Needs `perf` for the PERF
options, `node` for the sink."""
import http.client, json, os, shutil, subprocess, sys, tempfile, threading, time, socket
MNEME = sys.argv[1]; N = int(sys.argv[2]); CONC = int(sys.argv[3]) if len(sys.argv) > 3 else 0; NC = int(sys.argv[4]) if len(sys.argv) > 4 else 100
SINK = 9111 + os.getpid() % 500
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def agent(d, name, n):
    script = os.path.join(d, f"{name}.json")
    json.dump({"replies": [{"tool_calls": [{"name": "post", "arguments": {"i": i}}]} for i in range(n)] + [{"content": "done"}]}, open(script, "w"))
    t = f'''name = "{name}"
system = "You are a billing assistant. Use the tools."
[model]
provider = "scripted"
model = "scripted"
script = "{script}"
[[tools]]
name = "post"
description = "Post a charge"
kind = "http"
method = "POST"
url = "http://127.0.0.1:{SINK}/post"
effect = "side_effect"
parameters = {{ type = "object", properties = {{ i = {{ type = "integer" }} }}, required = ["i"] }}
[limits]
max_steps_per_turn = 1000000
'''
    p = os.path.join(d, f"{name}.toml"); open(p, "w").write(t); return p
class Api:
    def __init__(s, port): s.port = port; s.c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    def call(s, m, path, body=None, ct="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        s.c.request(m, path, body=data, headers={"Authorization": "Bearer bench-token-0123456789", "content-type": ct})
        r = s.c.getresponse(); b = r.read()
        assert r.status < 300, (r.status, b[:300]); return json.loads(b) if b else None
sink = subprocess.Popen(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "benches", "sink.mjs"), str(SINK)]); time.sleep(0.4)
tmp = tempfile.mkdtemp(prefix="drive-"); tok = os.path.join(tmp, "token"); open(tok, "w").write("bench-token-0123456789"); os.chmod(tok, 0o600)
port = free_port()
env = dict(os.environ)
d = subprocess.Popen([MNEME, "--data-dir", os.path.join(tmp, "data"), "serve", "--listen", f"127.0.0.1:{port}", "--token-file", tok], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
try:
    for _ in range(200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1); c.request("GET", "/health")
            if c.getresponse().status == 200: break
        except OSError: time.sleep(0.05)
    api = Api(port)
    a1 = agent(tmp, "single", N)
    sid = api.call("POST", "/sessions", open(a1, "rb").read(), "application/toml")["session"]
    perf = None
    if os.environ.get("PERF"):
        perf = subprocess.Popen(["perf", "stat", "-e", "task-clock,context-switches,cpu-migrations", "-p", str(d.pid), "-o", tmp + "/perf.txt"])
    if os.environ.get("STRACE"):
        perf = subprocess.Popen(["strace", "-f", "-ttt", "-o", os.environ["STRACE"], "-e", "trace=sendto,recvfrom,writev,write,read,fdatasync,connect,epoll_wait", "-p", str(d.pid)], stderr=subprocess.DEVNULL)
    if os.environ.get("SINKPERF"):
        sperf = subprocess.Popen(["perf", "stat", "-e", "task-clock,context-switches", "-p", str(sink.pid), "-o", tmp + "/sperf.txt"])
    if os.environ.get("PERFREC"):
        perf = subprocess.Popen(["perf", "record", "-F", "1999", "--call-graph", "dwarf,32768", "-p", str(d.pid), "-o", os.environ["PERFREC"]], stderr=subprocess.DEVNULL)
    time.sleep(0.3) if perf else None
    t = time.perf_counter(); api.call("POST", f"/sessions/{sid}/messages", {"text": "go", "wait": True}); dt = time.perf_counter() - t
    if perf:
        perf.send_signal(2); perf.wait()
    out = {"single": round(N / dt)}
    if os.environ.get("SINKPERF"):
        sperf.send_signal(2); sperf.wait(); txt = open(tmp + "/sperf.txt").read()
        out["sink_cpu_ms_step"] = round(float([l for l in txt.splitlines() if "task-clock" in l][0].split()[0].replace(",", "")) / N, 3)
    if os.environ.get("PERF"):
        txt = open(tmp + "/perf.txt").read()
        clock = float([l for l in txt.splitlines() if "task-clock" in l][0].split()[0].replace(",", ""))
        cs = float([l for l in txt.splitlines() if "context-switches" in l][0].split()[0].replace(",", ""))
        out["cpu_ms_step"] = round(clock / N, 3); out["cs_step"] = round(cs / N, 1)
    if CONC:
        ac = agent(tmp, "conc", NC)
        sids = [api.call("POST", "/sessions", open(ac, "rb").read(), "application/toml")["session"] for _ in range(CONC)]
        def go(s): Api(port).call("POST", f"/sessions/{s}/messages", {"text": "go", "wait": True})
        th = [threading.Thread(target=go, args=(s,)) for s in sids]
        if os.environ.get("CONCPERF"):
            cp = [subprocess.Popen(["perf", "stat", "-e", "task-clock", "-p", str(pid), "-o", f"{tmp}/c{pid}.txt"]) for pid in (d.pid, sink.pid, os.getpid())]
            time.sleep(0.3)
        if os.environ.get("CONCREC"):
            cp = [subprocess.Popen(["perf", "record", "-F", "1999", "-g", "-p", str(d.pid), "-o", os.environ["CONCREC"]], stderr=subprocess.DEVNULL)]
            time.sleep(0.3)
        t = time.perf_counter(); [x.start() for x in th]; [x.join() for x in th]; out["conc"] = round(CONC * NC / (time.perf_counter() - t))
        if os.environ.get("CONCREC"):
            cp[0].send_signal(2); cp[0].wait()
        if os.environ.get("CONCPERF"):
            for p, name in zip(cp, ("daemon", "sink", "client")):
                p.send_signal(2); p.wait()
                txt = open(f"{tmp}/c{p.args[-3]}.txt").read()
                out[f"conc_{name}_cpu_ms_step"] = round(float([l for l in txt.splitlines() if "task-clock" in l][0].split()[0].replace(",", "")) / (CONC * NC), 3)
    print(json.dumps(out))
finally:
    d.terminate(); d.wait(30); sink.terminate(); shutil.rmtree(tmp, ignore_errors=True)
