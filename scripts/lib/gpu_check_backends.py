"""The side-by-side report of `scripts/gpu-check --backends A,B`: reads each
backend's DIR/BACKEND/raw.json (what its check wrote) and prints markdown:
tg and pp per ngl through each backend, the device memory each held beyond
llama.cpp's accounting, each backend's answer per cap, and whether one
backend's answer stays under the cap when the other runs it (an answer
measured through Vulkan, loaded by Ollama's CUDA llama-server).

    python3 scripts/lib/gpu_check_backends.py DIR BACKEND...
"""
import json
import os
import sys

out, backends = sys.argv[1], sys.argv[2:]


def load(b):
    path = f"{out}/{b}/raw.json"
    return json.load(open(path)) if os.path.exists(path) else None


res = {b: load(b) for b in backends}
ran = [b for b in backends if res[b]]
print(f"# gpu-check through {', '.join(backends)}\n")
for b in backends:
    if not res[b]:
        print(f"- {b}: no results (its check did not run or was cut; see {b}/times.txt)")
if not ran:
    sys.exit(0)
hw = res[ran[0]]["hw"]
if hw["gpus"]:
    g = hw["gpus"][0]
    print(f"- card: {g['name']}, driver {g['driver_version']}, {g['memory_total'] / 2**30:.1f} GiB")
print()


def held(r):
    """Device bytes the trial held (NVML's per-process peak where read, else llama.cpp's accounting)."""
    return r.get("sampled_peak_pid_bytes") or r["accounted_device_bytes"]


def beyond(r):
    """What the process held beyond llama.cpp's accounting (MiB), where NVML read it."""
    s = r.get("sampled_peak_pid_bytes")
    return (s - r["accounted_device_bytes"]) / 2**20 if s else None


def rows(b, name):
    bench = (res[b] or {}).get(f"{name}.bench") or []
    return {(r["n_gpu_layers"], r["n_prompt"] > 0): r for r in bench if r["status"] == "ok"}


names = sorted({k.split(".")[0] for b in ran for k in res[b] if k.endswith(".bench")})
fmt = lambda v, f: "-" if v is None else format(v, f)
for name in names:
    per = {b: rows(b, name) for b in ran}
    ngls = sorted({n for b in ran for (n, _) in per[b]})
    print(f"## {name}\n")
    head = " | ".join(f"tg {b} | pp {b} | beyond {b} (MiB)" for b in ran)
    print(f"| ngl | {head} |")
    print("|---" * (1 + 3 * len(ran)) + "|")
    for n in ngls:
        cells = []
        for b in ran:
            tg, pp = per[b].get((n, False)), per[b].get((n, True))
            cells += [fmt(tg and tg["avg_ts"], ".1f"), fmt(pp and pp["avg_ts"], ".0f"), fmt(tg and beyond(tg), ".0f")]
        print(f"| {n} | {' | '.join(cells)} |")
    print()
    for cap in ("budget", "target"):
        answers = {}
        for b in ran:
            p = res[b].get(f"{name}.{cap}.adaptive") or res[b].get(f"{name}.{cap}.grid")
            if p:
                rec = p["placements"][0]["recommendation"]
                answers[b] = (rec["n_gpu_layers"], p["memory"]["cap_bytes"], rec.get("llama_cpp_args", ""))
        if not answers:
            continue
        print(f"- {cap}: " + "; ".join(f"{b} answers ngl {a[0]} (`{a[2]}`)" for b, a in answers.items()))
        for b, (ngl, cap_bytes, _) in answers.items():
            for other in ran:
                if other == b:
                    continue
                r = per[other].get((ngl, False))
                if r is None:
                    print(f"  - {b}'s answer through {other}: ngl {ngl} was not measured there")
                    continue
                verdict = "under" if held(r) <= cap_bytes else "OVER"
                print(
                    f"  - {b}'s answer through {other}: held {held(r) / 2**20:.0f} MiB, {verdict} "
                    f"{b}'s cap of {cap_bytes / 2**20:.0f} MiB"
                )
    print()
