"""The report of scripts/gpu-check: reads DIR's JSON files, or DIR/raw.json
(what comes back from a GPU machine), and DIR/times.txt; prints markdown.

    python3 scripts/lib/gpu_check_report.py DIR
"""
import json, os, sys
out = sys.argv[1]


def load():
    """Every JSON result by name (hw, NAME.bench, NAME.CAP.SEARCH, NAME.placement)."""
    if os.path.exists(f"{out}/raw.json"):
        return json.load(open(f"{out}/raw.json"))
    return {f[: -len(".json")]: json.load(open(f"{out}/{f}")) for f in os.listdir(out) if f.endswith(".json")}


def placement(r):
    """A recommendation in words: its layers and what it moves beyond them."""
    parts = [f"ngl {r['n_gpu_layers']}"]
    if r.get("n_cpu_ffn"):
        parts.append(f"FFN of {r['n_cpu_ffn']} layers on the CPU")
    if r.get("n_cpu_moe"):
        parts.append(f"experts of {r['n_cpu_moe']} layers on the CPU")
    if r.get("kv_type"):
        parts.append(f"{r['kv_type']} KV cache")
    return ", ".join(parts)


def whole_layers(r):
    return not (r.get("n_cpu_ffn") or r.get("n_cpu_moe") or r.get("kv_type"))


res = load()
times = {}
cut = []
mode = "?"
for line in open(f"{out}/times.txt"):
    w = line.split()
    if w[0] == "mode":
        mode = w[1]
    elif w[-1] == "cut":
        cut.append(" ".join(w[:-1]))
    elif len(w) == 3:
        times[(w[0], w[1])] = int(w[2])
    else:
        times[(w[0], w[1], w[2])] = int(w[3])
hw = res["hw"]
gpu = hw["gpus"][0] if hw["gpus"] else None
print(f"# gpu-check ({mode})\n")
print(f"- machine: {hw['cpu']['brand']}, {hw['cpu']['logical_cores']} cores; llama.cpp {hw['llama_cpp_revision']}, backends {', '.join(hw['backends'])}")
if gpu:
    print(f"- card: {gpu['name']}, driver {gpu['driver_version']}, {gpu['memory_total'] / 2**30:.1f} GiB")
print(f"- devices: {', '.join(d['name'] + ' (' + d['description'] + ')' for d in hw['llama_devices'])}\n")
names = [k[0] for k in times if len(k) == 2 and k[1] == "brute"]
for name in names:
    rows = res[f"{name}.bench"]
    for cap in ("budget", "target"):
        p = {s: res[f"{name}.{cap}.{s}"] for s in ("adaptive", "grid") if f"{name}.{cap}.{s}" in res}
        if not p:
            continue
        g = p.get("grid") or p["adaptive"]
        src = g["memory"]["source"]
        capb = g["memory"]["cap_bytes"]
        full = g["model"]["n_layer_full"]
        def mem(r):
            if src == "nvml" and r.get("sampled_peak_pid_bytes"):
                return r["sampled_peak_pid_bytes"]
            return r["accounted_device_bytes"]
        tg = {r["n_gpu_layers"]: r for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0 and r["status"] == "ok"}
        under = {n: r for n, r in tg.items() if mem(r) <= capb}
        best = max(under.items(), key=lambda kv: kv[1]["avg_ts"]) if under else None
        def regret(n):
            """1 - tg(n) / the best tg under the cap, both from the brute force,
            and whether the gap is inside their spread (one standard deviation
            of each: the brute force measures each ngl once, not paired)."""
            if best is None or n not in tg:
                return "n/a"
            b, c = best[1], tg[n]
            r = f"{max(0.0, 1 - c['avg_ts'] / b['avg_ts']) * 100:.1f}%"
            if n != best[0] and b["avg_ts"] - c["avg_ts"] <= (b.get("stddev_ts") or 0) + (c.get("stddev_ts") or 0):
                r += " (within the brute force's noise)"
            return r
        print(f"## {name}: {g['model']['n_params'] / 1e6:.0f}M parameters, ngl 0 to {full}, cap {cap} = {capb / 2**20:.0f} MiB ({src}), at depth {rows[0].get('n_depth', 0)}\n")
        if best:
            print(f"- brute force: best under the cap ngl {best[0]}, tg {best[1]['avg_ts']:.2f} t/s; {len(tg)} settings in {times[(name, 'brute')] / 1000:.1f} s")
        else:
            print("- brute force: nothing measured fits under the cap")
        for s in p:
            r = p[s]["recommendation"]
            sr = p[s]["search"] or {}
            m = r.get("mem_bytes")
            held = "memory n/a" if m is None else f"{m / 2**20:.0f} MiB, " + (
                "under the cap" if m <= capb else f"OVER THE CAP by {(m - capb) / 2**20:.0f} MiB")
            if whole_layers(r):
                vs = f"regret {regret(min(r['n_gpu_layers'], full))}"
            elif best:
                # The brute force measures whole layers only: set the tuner's
                # own measurement beside the best of them.
                vs = f"beyond whole layers: x{(r['tg_ts'] or 0) / best[1]['avg_ts']:.2f} the brute force's best (regret n/a)"
            else:
                vs = "beyond whole layers (regret n/a)"
            print(f"- {s}: {placement(r)} (tg {r['tg_ts'] or 0:.2f} t/s measured by the tuner; {held}), {vs}; "
                  f"{sr.get('trials', '?')} trials, {times[(name, cap, s)] / 1000:.1f} s wall")
        for s in p:
            d = ((p[s].get("placements") or [{}])[-1]).get("default")
            if d:
                def r(t):
                    # The 95% interval as the interval itself; a profile from before it shows its half width.
                    x, i, h = d.get(t + "_ratio"), d.get(t + "_interval"), d.get(t + "_half_width") or 0
                    if x is None:
                        return "n/a"
                    return f"x{x:.2f} [{i[0]:.2f}, {i[1]:.2f}]" if i else f"x{x:.2f} ± {h:.2f}"
                print(f"- against llama.cpp's default, {s} ({d['llama_cpp_args'] or 'no answer'}): tg {r('tg')}, "
                      f"pp {r('pp')}, {d['verdict']}{'; ' + d['note'] if d['note'] else ''}")
        k = g["decision"].get("knee")
        print(f"- knee: {'ngl ' + str(k['ngl']) if k else 'none'} ({g['decision']['knee_note']})")
        fit = (g.get("prediction") or {}).get("llama_fit") or {}
        fn = fit.get("n_gpu_layers")
        if fn is not None:
            fn = full if fn < 0 else min(fn, full)
            print(f"- llama.cpp's fit (same margin): ngl {fn}, regret {regret(fn)}")
        else:
            print(f"- llama.cpp's fit: no answer ({fit.get('error')})")
        gaps = [(t["spec"]["n_gpu_layers"], t.get("sampled_minus_predicted_bytes")) for t in g["trials"] if t.get("sampled_minus_predicted_bytes") is not None]
        if gaps:
            print("- sampled minus predicted memory: " + ", ".join(f"ngl {n}: {b / 2**20:+.0f} MiB" for n, b in sorted(gaps)))
            print(f"  (range {min(b for _, b in gaps) / 2**20:+.0f} to {max(b for _, b in gaps) / 2**20:+.0f} MiB)")
        else:
            print(f"- sampled minus predicted memory: n/a ({src} memory: no sampler sees this device)")
        print()
for key in sorted(k for k in res if k.endswith(".placement")):
    p = res[key]
    c = p["placements"][-1] if p.get("placements") else None
    print(f"## {p['model']['file_name']} at {p['settings']['n_ctx']} context, cap {p['memory']['cap_bytes'] / 2**20:.0f} MiB ({p['memory']['source']})\n")
    if c is None:
        print("- no placements (no GPU device)\n")
        continue
    print(f"- full offload with an f16 KV cache fits: {c['fits_fully']}; f16 KV cache {(c['kv_bytes'] or 0) / 2**20:.0f} MiB")
    for o in c["options"]:
        q = o.get("quality")
        sp = lambda v: f"{v:.2f}" if v else "-"
        figures = (f"tg {sp(o['tg_ts'])} t/s, pp {sp(o['pp_ts'])} t/s" if o["measured"] else "predicted") + \
            f", {(o['device_bytes'] or 0) / 2**20:.0f} MiB" + (f", KL {q['kl_mean']:.4f}" if q else "")
        print(f"- {o['kind']} {o['llama_cpp_args']}: {figures}{' (recommended)' if o['recommended'] else ''}{'; ' + o['note'] if o['note'] else ''}")
    print(f"- recommendation: {p['recommendation']['llama_cpp_args']}; {times[(p['model']['file_name'][:-len('-long.gguf')], 'placement')] / 1000:.1f} s wall\n")
if cut:
    print("## Cut short (deadline or failure)\n")
    for c in cut:
        print(f"- {c}")
