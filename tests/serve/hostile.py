"""dsc serve under hostile clients (issue 30): stalled and slow connections, the connection cap,
the bounded queue, timeouts, error shapes, auth. Run by compiler/tests/serve.rs against a
server started with --header-timeout-secs 1 --body-timeout-secs 2 --max-connections 48
--max-pending 1; bounded in time, loopback only.

usage: hostile.py BASE MODEL KEY
"""
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
host, port = base.removeprefix("http://").split(":")
port = int(port)
checks = 0


def check(ok, what):
    global checks
    if not ok:
        print(f"FAILED: {what}")
        sys.exit(1)
    checks += 1


def raw(path, data=None, method=None, headers=None, timeout=10):
    h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(base + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def complete(body, headers=None):
    return raw("/v1/completions", json.dumps(body).encode(), headers=headers)


def health_ms():
    t = time.time()
    code, _, _ = raw("/health", timeout=5)
    return code, (time.time() - t) * 1000


# --- error shapes ---
code, text, _ = raw("/v1/completions", method="GET")
check(code == 405 and json.loads(text)["error"]["code"] == "method_not_allowed", f"405 with an OpenAI body: {code} {text}")
code, text, _ = complete({"model": model, "prompt": "hi", "max_tokens": 200, "timeout": 0.000001})
check(code == 408 and json.loads(text)["error"]["code"] == "timeout", f"a request past its timeout -> 408: {code} {text}")
code, text, _ = complete({"model": model, "prompt": "hi", "max_tokens": 4, "temperature": 0}, headers={"Authorization": f"bearer {key}"})
check(code == 200, f"the bearer scheme is case-insensitive: {code} {text}")
code, text, _ = complete({"model": model, "prompt": "hi", "max_tokens": 4}, headers={"Authorization": f"Basic {key}"})
check(code == 401, f"another scheme is refused: {code}")
code, text, _ = complete({"model": model, "prompt": "hi", "max_tokens": 4}, headers={"Authorization": f"Bearer {key}x"})
check(code == 401, f"a longer key is refused: {code}")

# --- the stop-string request of issue 30, twice, then the server still serves ---
stop_req = {"model": model, "prompt": "Translate to French: 'The coffee is very good and the café is open.' French:", "max_tokens": 24, "temperature": 0, "stop": ["t\u0001", "é es\u0001"]}
for _ in range(2):
    code, text, _ = complete(stop_req)
    check(code == 200 and json.loads(text)["choices"][0]["finish_reason"] in ("stop", "length"), f"the stop-string request: {code} {text}")
check(health_ms()[0] == 200, "healthy after the stop-string requests")

# --- stalled clients: 30 half-sent request heads and 2 half-sent bodies ---
stalled = []
for i in range(30):
    s = socket.create_connection((host, port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    stalled.append(s)
bodies = []
for i in range(2):
    s = socket.create_connection((host, port))
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\": ".encode())
    bodies.append(s)
worst = 0
t0 = time.time()
while time.time() - t0 < 3.5:
    code, ms = health_ms()
    check(code == 200, f"/health while clients stall: {code}")
    worst = max(worst, ms)
    time.sleep(0.1)
check(worst < 1000, f"/health answered within 1 s throughout (worst {worst:.0f} ms)")
print(f"/health worst latency with 32 stalled clients: {worst:.1f} ms")


def closed(s, wait=0.5):
    s.settimeout(wait)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return True, b""
            return True, d
    except socket.timeout:
        return False, b""
    except (ConnectionResetError, BrokenPipeError):
        return True, b""


n_closed = sum(1 for s in stalled if closed(s)[0])
check(n_closed == 30, f"every stalled head was closed by the header timeout ({n_closed}/30)")
for s in bodies:
    ok, data = closed(s)
    check(ok and (data == b"" or b" 408 " in data.split(b"\r\n")[0]), f"a stalled body is answered 408 or closed: {data[:80]!r}")
for s in stalled + bodies:
    s.close()

# --- an idle kept-alive connection is closed too ---
s = socket.create_connection((host, port))
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
s.settimeout(5)
first = s.recv(65536)
check(b" 200 " in first.split(b"\r\n")[0], f"kept-alive first answer: {first[:60]!r}")
time.sleep(1.6)
check(closed(s, 1.0)[0], "an idle kept-alive connection is closed after the header timeout")
s.close()

# --- the connection cap: 48 open, the next one gets 503 + Retry-After and is closed ---
# (the 49th at once: the held ones are closed by the 1 s header timeout)
held = [socket.create_connection((host, port)) for _ in range(48)]
s = socket.create_connection((host, port))
s.settimeout(2)
data = b""
try:
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
except (socket.timeout, ConnectionResetError):
    pass
head = data.split(b"\r\n\r\n")[0].lower()
check(b" 503 " in head.split(b"\r\n")[0] and b"retry-after: 1" in head and b"overloaded" in data, f"past the connection cap: {data[:200]!r}")
for h in held:
    h.close()
s.close()
time.sleep(0.3)
check(health_ms()[0] == 200, "serving again once the held connections are gone")

# --- the bounded queue: with --max-pending 1, concurrent requests beyond it get 503 ---
results = []


def one():
    code, text, hdrs = complete({"model": model, "prompt": "The capital of France is", "max_tokens": 64, "temperature": 0, "ignore_eos": True})
    results.append((code, text, {k.lower(): v for k, v in hdrs.items()}))


ts = [threading.Thread(target=one) for _ in range(16)]
for t in ts:
    t.start()
for t in ts:
    t.join()
codes = sorted(r[0] for r in results)
busy = [r for r in results if r[0] == 503]
check(set(codes) <= {200, 503} and busy and codes.count(200) >= 1, f"queue bound: {codes}")
check(all(json.loads(r[1])["error"]["code"] == "overloaded" and r[2].get("retry-after") == "1" for r in busy), f"503s carry code overloaded and Retry-After: {busy[:1]}")
print(f"queue bound: {codes.count(200)} served, {len(busy)} answered 503 with Retry-After")
metrics = raw("/metrics")[1]
check('dsc_overloaded_total{reason="queue"}' in metrics and 'dsc_overloaded_total{reason="connections"}' in metrics and "dsc_engine_healthy 1" in metrics, "overload and health metrics")
print(f"hostile clients: {checks} checks passed")
