"""bench/gpu/run's markdown report of its results JSON."""


def fmt(x, nd=2):
    return "-" if x is None else ("%.*f" % (nd, x) if isinstance(x, float) else str(x))


def markdown(res):
    env = res.get("env", {})
    v = env.get("versions", {})
    lines = ["# squish on %s%s" % (env.get("gpu") or res.get("device"),
                                   " (dry run: cpu worker)" if res.get("dry_run") else ""), "",
             "- started %s, %s s; kit %s (%s)" % (res.get("started"), res.get("elapsed_s"),
                                                  res.get("kit", {}).get("commit"),
                                                  res.get("kit", {}).get("built")),
             "- %s, %s cores; torch %s, torchvision %s; driver CUDA %s, cudart %s, cuDNN %s, "
             "cuBLAS %s" % (env.get("cpu"), env.get("cores"), env.get("torch"),
                            env.get("torchvision"), v.get("driver_cuda"), v.get("cudart"),
                            v.get("cudnn"), v.get("cublas")),
             "- nvidia-smi: %s" % env.get("nvidia_smi", "-"), ""]
    lines += ["| phase | status | s |", "|---|---|---|"]
    for p in res.get("phases", []):
        lines.append("| %s | %s | %s |" % (p["name"], p.get("status"), p.get("seconds", p.get("why", ""))))
    if res.get("exports"):
        lines += ["", "## Exports", "", "| model | exporter | exported | squish loads | why not |",
                  "|---|---|---|---|---|"]
        for r in res["exports"]:
            lines.append("| %s | %s | %s | %s | %s |" % (
                r["model"], r["exporter"], r["exported"], r.get("squish_loads", "-"),
                (r.get("why") or r.get("squish_loads_error") or "").replace("|", "/")[:160]))
    if res.get("parity"):
        lines += ["", "## Parity against torch fp32 (max |diff| / max |torch|)", "",
                  "| model | device | asked | runs | batch | rel | torch's own rel | tolerance "
                  "| top-1 agree | pass |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["parity"]:
            lines.append("| %s | %s | %s | %s | %d | %s | %s | %s | %s | %s |" % (
                r["model"], r["device"], r["precision"], r.get("runs"), r["batch"],
                fmt(r.get("rel"), 6) if r.get("rel") is not None else r.get("error", "-")[:80],
                fmt(r.get("torch_rel"), 6) if r.get("torch_rel") is not None else "-",
                fmt(r.get("tolerance"), 4), fmt(r.get("top1_agree")), r.get("pass")))
    if res.get("speed"):
        bs = sorted({int(b) for r in res["speed"] for b in r["ms"]})
        lines += ["", "## l(b), ms per batch (input in, output out)", "",
                  "| model | engine | " + " | ".join("b=%d" % b for b in bs) + " |",
                  "|---|---|" + "---|" * len(bs)]
        for r in res["speed"]:
            ms = {int(k): x for k, x in r["ms"].items()}
            lines.append("| %s | %s | %s |" % (r["model"], r["engine"],
                                               " | ".join(fmt(ms.get(b)) for b in bs)))
    px = [r for r in res.get("speed", []) if r.get("bytes_in")]
    if px:
        lines += ["", "## Bytes in: converted by the backend against by the host first, ms per "
                  "batch (wall)", "",
                  "| model | engine | batch | pixels | pixels, host | rel | UINT8 | UINT8, host "
                  "| rel |", "|---|---|---|---|---|---|---|---|---|"]
        for r in px:
            for b, x in sorted(r["bytes_in"].items(), key=lambda kv: int(kv[0])):
                lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    r["model"], r["engine"], b, fmt(x.get("pixels_median_ms"), 3),
                    fmt(x.get("pixels_host_median_ms"), 3), x.get("pixels_rel", "-"),
                    fmt(x.get("u8_median_ms"), 3), fmt(x.get("u8_host_median_ms"), 3),
                    x.get("u8_rel", "-")))
    for e in [res.get("e2e")] + res.get("e2e_more", []):
        if not e:
            continue
        lines += ["", "## End to end: %s, %s, %s, SLO %s ms" % (
            e.get("model"), e.get("workers"), e.get("precision_asked", "fp32"), e.get("slo_ms")), ""]
        if "gpu_metrics" in e:
            lines.append("- GPU series on /metrics: %s" % (
                "; ".join(e["gpu_metrics"]) if e["gpu_metrics"] else "none"))
        for label in ("jpeg /v1", "uint8 tensor /v2"):
            x = e.get(label)
            if x:
                lines.append("- %s: goodput %s req/s at >= 99%% within the SLO%s" % (
                    label, x.get("goodput_rps", "-"),
                    "" if "best" not in x else ", p99 %s ms" % fmt(x["best"]["latency_ms"]["p99"])))
                if "error" in x or "skipped" in x:
                    lines.append("  - %s" % (x.get("error") or x.get("skipped")))
        if e.get("error"):
            lines.append("- failed: %s" % str(e["error"])[:300])
        if e.get("live_vs_profile"):
            lines += ["", "| batch | batches | live ms | profile ms | live / profile |",
                      "|---|---|---|---|---|"]
            for b, x in sorted(e["live_vs_profile"].items(), key=lambda kv: int(kv[0])):
                lines.append("| %s | %s | %s | %s | %s |" % (b, x["batches"], x["live_ms"],
                                                           x.get("profile_ms", "-"),
                                                           x.get("live_over_profile", "-")))
    if res.get("foreign_libraries") is not None:
        lines += ["", "Libraries mapped from outside the kit (glibc's and CUDA's aside): %s" % (
            ", ".join(res["foreign_libraries"]) or "none")]
    if res.get("errors"):
        lines += ["", "## Errors", ""]
        for e in res["errors"]:
            lines.append("- %s: %s" % (e["where"], e["what"].strip().splitlines()[-1][:300]))
    return "\n".join(lines) + "\n"
