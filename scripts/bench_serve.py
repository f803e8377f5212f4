#!/usr/bin/env python3
"""scripts/bench_serve.py — load a running `kl serve` (or any OpenAI-compatible server) with
N concurrent streaming clients and print one JSON object: for each concurrency, requests/s,
output tok/s, time to first token and inter-token latency (p50 / p90).

    kl serve MODEL --port 8000 &
    python3 scripts/bench_serve.py --url http://127.0.0.1:8000 --model MODEL --streams 1,4,16

Python's standard library only.  Output tokens are counted from the usage the server reports
at the end of each stream (stream_options.include_usage); latencies from the arrival of the
streamed chunks that carry text (the time the read that brought them returned).  The client
reads the stream in blocks and parses JSON only for the usage event, so on a small machine it
takes little of the CPU the server runs on.
"""
import argparse
import json
import re
import statistics
import threading
import time
import urllib.request


# A streamed event that carries text: "content" with a non-empty string (a regex in C, so the
# client spends microseconds per event and leaves the CPU to the server it measures).
CONTENT = re.compile(rb'"content"\s*:\s*"(?!")')


def one_request(url, model, prompt, max_tokens, key, temperature=0.0, top_p=1.0):
    body = json.dumps({
        "model": model, "stream": True, "max_tokens": max_tokens,
        "temperature": temperature, "top_p": top_p,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    t0 = time.perf_counter()
    arrivals, tokens, rest = [], 0, b""
    with urllib.request.urlopen(req, timeout=600) as r:
        while True:
            buf = r.read1(65536)
            if not buf:
                break
            now = time.perf_counter()
            lines = (rest + buf).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if not line.startswith(b"data: "):
                    continue
                if CONTENT.search(line):
                    arrivals.append(now)
                elif b'"usage"' in line:
                    ev = json.loads(line[6:])
                    if ev.get("usage"):
                        tokens = ev["usage"]["completion_tokens"]
    return t0, arrivals, tokens


def pct(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_level(a, streams):
    results, lock = [], threading.Lock()

    def client():
        for _ in range(a.requests):
            r = one_request(a.url, a.model, a.prompt, a.max_tokens, a.api_key,
                            a.temperature, a.top_p)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [arr[0] - s for s, arr, _ in results if arr]
    itl = [b - a_ for _, arr, _ in results for a_, b in zip(arr, arr[1:])]
    out = sum(n for _, _, n in results)
    return {"streams": streams, "requests": len(results), "wall_s": wall,
            "requests_per_s": len(results) / wall, "output_tok_s": out / wall,
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9),
            "itl_p50_s": pct(itl, 0.5), "itl_p90_s": pct(itl, 0.9),
            "itl_mean_s": statistics.fmean(itl) if itl else 0.0}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--streams", default="1,4,16,64", help="concurrency levels, comma-separated")
    p.add_argument("--requests", type=int, default=2, help="requests per client (default 2)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    p.add_argument("--api-key", default="")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every request (default 0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus of every request (1: off)")
    a = p.parse_args()
    levels = [run_level(a, int(s)) for s in a.streams.split(",")]
    base = levels[0]["output_tok_s"] or 1.0
    for lv in levels:
        lv["speedup_vs_first"] = lv["output_tok_s"] / base
    print(json.dumps({"url": a.url, "model": a.model, "max_tokens": a.max_tokens,
                      "temperature": a.temperature, "top_p": a.top_p, "levels": levels}))


if __name__ == "__main__":
    main()
