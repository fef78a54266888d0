#!/usr/bin/python3
"""The front-door benchmark's tools build and answer (no timing is checked):
squish-bare-h2o answers a POST with 200 and its JSON after reading the body,
squish-loadgen's closed loop gets answers from it, and squish-decode-ceiling
decodes a JPEG on two threads. Prints TAP.
Usage: test_front_door_tools.py BARE_H2O LOADGEN DECODE_CEILING"""
import base64
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

bare, loadgen, ceiling = sys.argv[1:4]
# A 16x16 JPEG (PIL, quality 90).
JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAMCAgMCAgMDAwMEAwMEBQgFBQQEBQoHBwYIDAoMDAsKCwsNDhIQDQ4RDgsL"
    "EBYQERMUFRUVDA8XGBYUGBIUFRT/2wBDAQMEBAUEBQkFBQkUDQsNFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"
    "FBQUFBQUFBQUFBQUFBQUFBQUFBT/wAARCAAQABADASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcI"
    "CQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRol"
    "JicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ip"
    "qrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAA"
    "AAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLR"
    "ChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaX"
    "mJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEA"
    "PwCpRRRX4ef0gf/Z")
results = []


def check(name, fn):
    try:
        fn()
        results.append((True, name, ""))
    except Exception as e:  # any failure is a "not ok" with its reason
        results.append((False, name, repr(e)))


tmp = tempfile.mkdtemp(prefix="squish-front-test-")
port_file = os.path.join(tmp, "port")
proc = subprocess.Popen([bare, "--listen", "127.0.0.1:0", "--port-file", port_file,
                         "--threads", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
port = None
try:
    deadline = time.time() + 20
    while port is None and time.time() < deadline and proc.poll() is None:
        if os.path.exists(port_file) and open(port_file).read().strip():
            port = int(open(port_file).read().strip())
        else:
            time.sleep(0.02)

    def bare_answers():
        assert port is not None, "no port file"
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for size in (0, 100, 700000):  # the last one over several reads
            c.request("POST", "/v2/models/m/infer", body=b"x" * size,
                      headers={"Content-Type": "application/octet-stream"})
            r = c.getresponse()
            body = r.read()
            assert r.status == 200, r.status
            json.loads(body)
        c.close()

    def loadgen_closed_loop():
        assert port is not None, "no port file"
        out = subprocess.run([loadgen, "--port", str(port), "--path", "/v2/models/m/infer",
                              "--tensor", "3x32x32", "--dtype", "FP32", "--closed", "4",
                              "--duration", "0.5", "--warmup", "0.1", "--slo-ms", "1000"],
                             capture_output=True, text=True, timeout=60, check=True)
        s = json.loads(out.stdout)
        assert s["good"] + s["late"] > 0, s
        assert s["errors"] == s["conn_errors"] == s["stray_answers"] == 0, s

    check("squish-bare-h2o answers a POST with 200 and JSON", bare_answers)
    check("squish-loadgen's closed loop is answered by squish-bare-h2o", loadgen_closed_loop)
finally:
    proc.kill()
    proc.wait()


def ceiling_decodes():
    path = os.path.join(tmp, "x.jpg")
    with open(path, "wb") as f:
        f.write(JPEG)
    out = subprocess.run([ceiling, "--jpeg", path, "--threads", "2", "--duration", "0.2"],
                         capture_output=True, text=True, timeout=60, check=True)
    s = json.loads(out.stdout)
    assert s["threads"] == 2 and s["images"] > 0 and len(s["per_thread"]) == 2, s
    bad = subprocess.run([ceiling, "--jpeg", os.path.join(tmp, "missing.jpg")],
                         capture_output=True, timeout=60)
    assert bad.returncode != 0


check("squish-decode-ceiling decodes on two threads", ceiling_decodes)
for f in os.listdir(tmp):
    os.unlink(os.path.join(tmp, f))
os.rmdir(tmp)
print("1..%d" % len(results))
for i, (ok, name, why) in enumerate(results, 1):
    print("%s %d - %s%s" % ("ok" if ok else "not ok", i, name, "" if ok else " # " + why))
sys.exit(0 if all(ok for ok, _, _ in results) else 1)
