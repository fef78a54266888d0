"""Errors that teach (issue 24): the common slips of a new user get a 4xx
that says what to send instead, and the slips' correct siblings still
work: an image sent the way `curl -d` sends a file, a JPEG labelled as
JSON, JSON sent to the image route, a JPEG sent to the JSON route, a
binary-extension BYTES element without its length prefix, and Triton's
timeout in the wrong unit."""

import base64
import json
import struct

from harness import Squishd, eventually, run, test

PHOTO = open("/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg", "rb").read()


def auth(s):
    return {"Authorization": "Bearer " + s.token}


def server():
    s = Squishd(workers="emu:1")
    s.wait_ready(workers=1, timeout=60)
    r = s.request("POST", "/models", body=json.dumps(
        {"name": "inc", "profile": {"alpha_ms": 0.5, "beta_ms": 2}, "max_batch": 16,
         "input": {"shape": [3, 16, 16]}, "num_classes": 5}),
        headers=dict(auth(s), **{"Content-Type": "application/json"}))
    assert r.status == 201, r
    eventually(lambda: s.get("/v2/models/inc/ready").status == 200, 30, "inc ready")
    return s


def v1(s, body, ctype):
    return s.request("POST", "/v1/models/inc/infer", body=body, headers={"Content-Type": ctype})


@test
def image_route_slips_get_415_saying_what_to_send():
    s = server()
    try:
        # curl --data-binary @photo.jpg: form-encoded by name, the bytes intact.
        assert v1(s, PHOTO, "application/x-www-form-urlencoded").status == 200
        assert v1(s, PHOTO, "image/jpeg").status == 200
        # curl -d @photo.jpg: the same, with every CR and LF taken out.
        stripped = PHOTO.replace(b"\r", b"").replace(b"\n", b"")
        assert len(stripped) < len(PHOTO)
        r = v1(s, stripped, "application/x-www-form-urlencoded")
        assert r.status == 415 and "--data-binary @photo.jpg" in r.json["error"], r
        # A JPEG labelled application/json.
        r = v1(s, PHOTO, "application/json")
        assert r.status == 415 and "Content-Type: image/jpeg" in r.json["error"], r
        # An OIP request sent to /v1.
        oip = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES",
                                      "data": ["a"]}]}).encode()
        for ct in ("application/json", "text/plain"):
            r = v1(s, oip, ct)
            assert r.status == 415 and "POST /v2/models/inc/infer" in r.json["error"], r
    finally:
        s.stop()


@test
def json_route_slips_name_the_route_the_prefix_and_the_unit():
    s = server()
    try:
        name = s.get("/v2/models/inc").json["inputs"][0]["name"]
        # A JPEG to the JSON route.
        r = s.request("POST", "/v2/models/inc/infer", body=PHOTO,
                      headers={"Content-Type": "image/jpeg"})
        assert r.status == 415 and "/v1/models/inc/infer" in r.json["error"], r

        def binary(element):
            head = json.dumps({"inputs": [{"name": name, "shape": [1], "datatype": "BYTES",
                                           "parameters": {"binary_data_size": len(element)}}]})
            return s.request("POST", "/v2/models/inc/infer", body=head.encode() + element,
                             headers={"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(len(head))})

        # Triton's binary BYTES: each element a 4-byte little-endian length, then its bytes.
        r = binary(struct.pack("<I", len(PHOTO)) + PHOTO)
        assert r.status == 200, r
        r = binary(PHOTO)  # the length forgotten
        assert r.status == 400 and "4-byte little-endian length" in r.json["error"], r
        assert "FF D8 FF" in r.json["error"], r
        # Triton's timeout is in microseconds: 1000 is 1 ms, less than one
        # batch takes, refused naming the parameter, its unit and what works.
        body = {"inputs": [{"name": name, "shape": [1], "datatype": "BYTES",
                            "data": [base64.b64encode(PHOTO).decode()]}]}

        def timeout(us):
            b = dict(body, parameters={"timeout": us})
            return s.request("POST", "/v2/models/inc/infer", body=json.dumps(b),
                             headers={"Content-Type": "application/json"})

        r = timeout(1000)
        assert r.status == 400 and r.json["code"] == "slo_too_tight", r
        assert "retry-after" not in r.headers, r.headers
        assert "parameters.timeout 1000" in r.json["error"], r
        assert "microseconds" in r.json["error"] and "slo_ms" in r.json["error"], r
        # The figure it names works.
        want = int(r.json["error"].split("send timeout ")[1].split(" ")[0])
        assert want >= 2500, r.json
        r = timeout(want * 2)
        assert r.status == 200, r
    finally:
        s.stop()


if __name__ == "__main__":
    run()
